// sim/workload.h — request streams for the simulator: SplitwiseSim trace CSVs, replay of the Azure
// LLM inference traces (2023), and seeded Poisson arrivals with lengths sampled from a trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/simulator.h"

namespace splitflow::sim {

// SplitwiseSim's format: request_id, request_type, application_id, arrival_timestamp (s),
// batch_size, prompt_size, token_size.
std::vector<Request> load_splitwise_trace(const std::string& path);

// Azure format: TIMESTAMP ("YYYY-MM-DD HH:MM:SS.fffffff"), ContextTokens, GeneratedTokens.
// Arrivals are seconds after the first row's timestamp; ids are row numbers from 0.
std::vector<Request> load_azure_trace(const std::string& path);

// Seconds since 1970-01-01 of an Azure timestamp; fails naming the text when malformed.
double parse_azure_timestamp(const std::string& text);

// Poisson arrivals at rate_per_s over [0, duration_s) (exponential gaps, cumulatively summed);
// prompt and output lengths drawn independently, with replacement, from `lengths_from`, as
// SplitwiseSim's generate_trace.py does. Same seed, same workload.
std::vector<Request> poisson_workload(const std::vector<Request>& lengths_from, double rate_per_s,
                                      double duration_s, uint64_t seed);

// Either format above, recognised by the header (TIMESTAMP: Azure; arrival_timestamp: SplitwiseSim).
std::vector<Request> load_trace(const std::string& path);

// A request stream and the span of its arrivals, which sets the throughput window.
struct Workload {
  std::vector<Request> requests;
  std::string description;  // "conv trace replay x2", "Poisson 70 req/s for 600 s (seed 1)"
  double duration_s = 0;    // arrivals lie in [0, duration_s]

  // SplitwiseSim counts completions in [60, 540) of a 600 s trace: the middle 80 % of the span.
  double window_start_s() const { return 0.1 * duration_s; }
  double window_end_s() const { return 0.9 * duration_s; }
};

// The trace's own arrivals, compressed by rate_scale (> 0): a request at t arrives at t / rate_scale.
Workload replay_workload(const std::vector<Request>& trace, double rate_scale, const std::string& trace_name);
// Poisson arrivals with lengths drawn from the trace (poisson_workload above).
Workload poisson_workload_from(const std::vector<Request>& trace, double rate_per_s, double duration_s,
                               uint64_t seed, const std::string& trace_name);

}  // namespace splitflow::sim
