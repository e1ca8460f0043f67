// bench/workload.h — the request streams `splitflow bench serve` sends: when each request arrives
// (Poisson at a rate, seeded; or a trace's own timestamps, scaled) and how long its prompt and
// output are (fixed, or the trace's), plus the prompt token ids. Pure functions of their inputs:
// no clocks, no sockets. Traces are read by sim/workload.h (Azure 2023 or SplitwiseSim format).
#pragma once

#include "sim/simulator.h"

#include <cstdint>
#include <string>
#include <vector>

namespace splitflow::bench {

struct TimedRequest {
  int64_t index = 0;       // position in the workload, from 0
  double arrival_s = 0;    // seconds after the start of the run
  int32_t input_len = 0;   // prompt tokens
  int32_t output_len = 0;  // tokens to generate (max_tokens, EOS ignored)
};

struct Workload {
  std::vector<TimedRequest> requests;  // by arrival time
  std::string description;             // "Poisson 4 req/s for 60 s (seed 0), 2048 in / 256 out"
  double last_arrival_s = 0;
  int64_t num_clipped = 0;  // requests whose lengths fit_context() shortened
};

// What to send. Arrivals: Poisson at rate_per_s when it is set, else the trace's timestamps times
// time_scale. Lengths: input_len / output_len when set (> 0), else the trace's (request i takes
// row i, cycling when Poisson arrivals outnumber the rows). Arrivals stop before duration_s (> 0)
// or after num_requests (> 0), whichever comes first; Poisson needs one of the two.
struct WorkloadSpec {
  double rate_per_s = 0;
  std::string trace_path;
  double time_scale = 1;
  double duration_s = 0;
  int64_t num_requests = 0;
  int32_t input_len = 0;
  int32_t output_len = 0;
  uint64_t seed = 0;
};

// Arrival times of a Poisson process: exponential gaps of mean 1 / rate_per_s (mt19937_64 seeded
// with `seed`), the first one gap after 0, as SplitwiseSim's generate_trace.py draws them. Limits
// as in WorkloadSpec. Throws naming the parameter for a rate that is not a positive number or
// when neither limit is set.
std::vector<double> poisson_arrivals(double rate_per_s, double duration_s, int64_t num_requests, uint64_t seed);

// Checks the spec (naming the flag at fault) and builds the workload; `trace` holds the rows of
// spec.trace_path (empty when there is none).
Workload make_workload(const WorkloadSpec& spec, const std::vector<sim::Request>& trace);
// Reads spec.trace_path when set (a missing or malformed file is an error naming it), then the above.
Workload make_workload(const WorkloadSpec& spec);

// Shortens requests that would not fit a context of max_model_len tokens: the output keeps its
// length when the prompt can give way (prompt = max_model_len - output, at least 1 token), else
// it is cut to what remains. Returns how many changed (also added to workload.num_clipped).
int64_t fit_context(Workload& workload, int32_t max_model_len);

// The prompt of request `index`: input_len ids uniform in [0, vocab_size), a pure function of
// (seed, index), so runs repeat and requests share no prefix (the prefix cache stays cold).
std::vector<int32_t> prompt_token_ids(uint64_t seed, int64_t index, int32_t input_len, int32_t vocab_size);

}  // namespace splitflow::bench
