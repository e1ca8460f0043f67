#include "sim/metrics.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace splitflow::sim {

double percentile(std::vector<double> values, double q) {
  SF_CHECK(!values.empty(), "percentile: no values");
  SF_CHECK(q >= 0 && q <= 1, "percentile: quantile {} is outside [0, 1]", q);
  const double position = q * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(position));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  std::nth_element(values.begin(), values.begin() + lo, values.end());
  const double lo_value = values[lo];
  const double hi_value = hi == lo ? lo_value : *std::min_element(values.begin() + lo + 1, values.end());
  return lo_value + (position - static_cast<double>(lo)) * (hi_value - lo_value);
}

Percentiles percentiles(const std::vector<double>& values) {
  return {percentile(values, 0.50), percentile(values, 0.90), percentile(values, 0.99)};
}

Slowdowns slowdowns(const std::vector<RequestResult>& requests, const PerfCurves& reference) {
  Slowdowns result;
  for (const RequestResult& r : requests) {
    const double prompt = static_cast<double>(r.prompt_tokens);
    const double ttft_ref_s = reference.prompt_time_s(prompt);
    const double tbt_ref_s = reference.token_time_s(prompt);
    const double e2e_ref_s = ttft_ref_s + tbt_ref_s * static_cast<double>(r.output_tokens - 1);
    result.ttft.push_back(r.ttft_s() / ttft_ref_s);
    result.tbt.push_back(r.tbt_s() / tbt_ref_s);
    result.e2e.push_back(r.e2e_s() / e2e_ref_s);
  }
  return result;
}

bool SloReport::all_passed() const {
  return std::all_of(checks.begin(), checks.end(), [](const SloCheck& c) { return c.passed; });
}

SloReport check_slos(const Slowdowns& slowdowns, const SloThresholds& thresholds) {
  SloReport report;
  size_t i = 0;
  auto add = [&](const char* metric, const std::vector<double>& values, const Percentiles& limits) {
    const Percentiles measured = percentiles(values);
    for (auto [name, value, limit] : {std::tuple{"p50", measured.p50, limits.p50},
                                      std::tuple{"p90", measured.p90, limits.p90},
                                      std::tuple{"p99", measured.p99, limits.p99}})
      report.checks[i++] = SloCheck{std::string(metric) + "_" + name, value, limit, value < limit};
  };
  add("ttft", slowdowns.ttft, thresholds.ttft);
  add("tbt", slowdowns.tbt, thresholds.tbt);
  add("e2e", slowdowns.e2e, thresholds.e2e);
  return report;
}

double throughput_per_s(const std::vector<RequestResult>& requests, double window_start_s, double window_end_s) {
  SF_CHECK(window_end_s > window_start_s, "throughput: window [{}, {}) is empty", window_start_s, window_end_s);
  const auto done = std::count_if(requests.begin(), requests.end(), [&](const RequestResult& r) {
    return r.completion_s >= window_start_s && r.completion_s < window_end_s;
  });
  return static_cast<double>(done) / (window_end_s - window_start_s);
}

}  // namespace splitflow::sim
