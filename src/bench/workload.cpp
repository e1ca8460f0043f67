#include "bench/workload.h"

#include "core/counter_hash.h"
#include "core/error.h"
#include "sim/workload.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

namespace splitflow::bench {

std::vector<double> poisson_arrivals(double rate_per_s, double duration_s, int64_t num_requests, uint64_t seed) {
  SF_CHECK(std::isfinite(rate_per_s) && rate_per_s > 0, "--rate must be a positive number of requests per second, not {}",
           rate_per_s);
  SF_CHECK(std::isfinite(duration_s) && duration_s >= 0, "--duration must be a non-negative number of seconds, not {}",
           duration_s);
  SF_CHECK(num_requests >= 0, "--num-requests must not be negative, not {}", num_requests);
  SF_CHECK(duration_s > 0 || num_requests > 0, "Poisson arrivals at --rate {} need --duration or --num-requests",
           rate_per_s);
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate_per_s);
  std::vector<double> arrivals;
  double time_s = gap(rng);
  while ((duration_s == 0 || time_s < duration_s) &&
         (num_requests == 0 || static_cast<int64_t>(arrivals.size()) < num_requests)) {
    arrivals.push_back(time_s);
    time_s += gap(rng);
  }
  return arrivals;
}

namespace {

int32_t checked_length(int64_t tokens, const char* column, size_t row) {
  SF_CHECK(tokens > 0 && tokens <= INT32_MAX, "trace row {}: {} = {} is not a usable token count", row + 1, column,
           tokens);
  return static_cast<int32_t>(tokens);
}

}  // namespace

Workload make_workload(const WorkloadSpec& spec, const std::vector<sim::Request>& trace) {
  const bool has_trace = !spec.trace_path.empty();
  const bool poisson = spec.rate_per_s != 0;
  SF_CHECK(poisson || has_trace, "give --rate (Poisson arrivals) or --trace (a trace's arrivals)");
  SF_CHECK(!has_trace || !trace.empty(), "trace '{}' has no requests", spec.trace_path);
  SF_CHECK(spec.input_len >= 0 && spec.output_len >= 0, "--input-len and --output-len must not be negative ({}, {})",
           spec.input_len, spec.output_len);
  SF_CHECK(has_trace || (spec.input_len > 0 && spec.output_len > 0),
           "without --trace, give --input-len and --output-len (tokens per request)");
  SF_CHECK(std::isfinite(spec.time_scale) && spec.time_scale > 0, "--time-scale must be a positive number, not {}",
           spec.time_scale);
  SF_CHECK(std::isfinite(spec.duration_s) && spec.duration_s >= 0,
           "--duration must be a non-negative number of seconds, not {}", spec.duration_s);
  SF_CHECK(spec.num_requests >= 0, "--num-requests must not be negative, not {}", spec.num_requests);

  Workload workload;
  std::vector<double> arrivals;
  if (poisson) {
    arrivals = poisson_arrivals(spec.rate_per_s, spec.duration_s, spec.num_requests, spec.seed);
  } else {
    for (const sim::Request& row : trace) {
      const double time_s = row.arrival_s * spec.time_scale;
      if (spec.duration_s > 0 && time_s >= spec.duration_s) break;
      if (spec.num_requests > 0 && static_cast<int64_t>(arrivals.size()) == spec.num_requests) break;
      arrivals.push_back(time_s);
    }
  }
  SF_CHECK(!arrivals.empty(), "the workload has no requests: raise --duration or --num-requests");

  workload.requests.reserve(arrivals.size());
  for (size_t i = 0; i < arrivals.size(); ++i) {
    TimedRequest request{static_cast<int64_t>(i), arrivals[i], spec.input_len, spec.output_len};
    if (has_trace) {
      const size_t row = i % trace.size();
      if (request.input_len == 0) request.input_len = checked_length(trace[row].prompt_tokens, "prompt tokens", row);
      if (request.output_len == 0) request.output_len = checked_length(trace[row].output_tokens, "output tokens", row);
    }
    workload.requests.push_back(request);
  }
  workload.last_arrival_s = arrivals.back();

  const std::string trace_name = has_trace ? std::filesystem::path(spec.trace_path).filename().string() : "";
  const std::string lengths =
      spec.input_len > 0 && spec.output_len > 0
          ? fmt::format("{} in / {} out", spec.input_len, spec.output_len)
          : fmt::format("lengths from {}{}", trace_name,
                        spec.input_len > 0    ? fmt::format(" (input {})", spec.input_len)
                        : spec.output_len > 0 ? fmt::format(" (output {})", spec.output_len)
                                              : "");
  const std::string limit = spec.duration_s > 0 && spec.num_requests > 0
                                ? fmt::format(" for {} s or {} requests", spec.duration_s, spec.num_requests)
                            : spec.duration_s > 0 ? fmt::format(" for {} s", spec.duration_s)
                            : spec.num_requests > 0 ? fmt::format(" for {} requests", spec.num_requests)
                                                    : "";
  workload.description =
      poisson ? fmt::format("Poisson {} req/s{} (seed {}), {}", spec.rate_per_s, limit, spec.seed, lengths)
              : fmt::format("{} replay{}{}, {}", trace_name,
                            spec.time_scale == 1 ? "" : fmt::format(" with time scale {}", spec.time_scale), limit, lengths);
  return workload;
}

Workload make_workload(const WorkloadSpec& spec) {
  std::vector<sim::Request> trace;
  if (!spec.trace_path.empty()) {
    SF_CHECK(std::filesystem::is_regular_file(spec.trace_path), "--trace '{}': no such file", spec.trace_path);
    trace = sim::load_trace(spec.trace_path);
  }
  return make_workload(spec, trace);
}

int64_t fit_context(Workload& workload, int32_t max_model_len) {
  SF_CHECK(max_model_len >= 2, "a context of {} tokens cannot hold a prompt and an output token", max_model_len);
  int64_t clipped = 0;
  for (TimedRequest& request : workload.requests) {
    if (static_cast<int64_t>(request.input_len) + request.output_len <= max_model_len) continue;
    if (request.output_len < max_model_len) {
      request.input_len = max_model_len - request.output_len;
    } else {
      request.input_len = 1;
      request.output_len = max_model_len - 1;
    }
    ++clipped;
  }
  workload.num_clipped += clipped;
  return clipped;
}

std::vector<int32_t> prompt_token_ids(uint64_t seed, int64_t index, int32_t input_len, int32_t vocab_size) {
  SF_CHECK(vocab_size > 0, "prompt token ids need a positive vocabulary size, not {}", vocab_size);
  SF_CHECK(input_len > 0, "request {}: a prompt of {} tokens", index, input_len);
  const uint64_t key = mix64(seed ^ mix64(static_cast<uint64_t>(index) + 0x9e3779b97f4a7c15ull));
  std::vector<int32_t> ids(static_cast<size_t>(input_len));
  for (int32_t i = 0; i < input_len; ++i) {
    ids[static_cast<size_t>(i)] = static_cast<int32_t>(mix64(key + static_cast<uint64_t>(i)) % static_cast<uint64_t>(vocab_size));
  }
  return ids;
}

}  // namespace splitflow::bench
