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

RequestSlowdown slowdown(const RequestResult& r, const PerfCurves& reference) {
  const double prompt = static_cast<double>(r.prompt_tokens);
  const double ttft_ref_s = reference.prompt_time_s(prompt);
  const double tbt_ref_s = reference.reference_tbt_s(r.prompt_tokens, r.output_tokens);
  const double e2e_ref_s = ttft_ref_s + tbt_ref_s * static_cast<double>(r.output_tokens - 1);
  return {r.ttft_s() / ttft_ref_s, r.tbt_s() / tbt_ref_s, r.e2e_s() / e2e_ref_s};
}

Slowdowns slowdowns(const std::vector<RequestResult>& requests, const PerfCurves& reference) {
  Slowdowns result;
  result.ttft.reserve(requests.size());
  result.tbt.reserve(requests.size());
  result.e2e.reserve(requests.size());
  for (const RequestResult& r : requests) {
    const RequestSlowdown s = slowdown(r, reference);
    result.ttft.push_back(s.ttft);
    result.tbt.push_back(s.tbt);
    result.e2e.push_back(s.e2e);
  }
  return result;
}

bool SloReport::all_passed() const {
  return std::all_of(checks.begin(), checks.end(), [](const SloCheck& c) { return c.passed; });
}

SloReport check_slos(const Slowdowns& slowdowns, const SloConfig& thresholds) {
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

SloFailureDetector::SloFailureDetector(int64_t total_requests, const PerfCurves& reference, const SloConfig& slo)
    : reference_(reference) {
  SF_CHECK(total_requests > 0, "SLO failure detector: no requests");
  const std::array<Percentiles, 3> limits = {slo.ttft, slo.tbt, slo.e2e};
  const std::array<double, 3> quantiles = {0.50, 0.90, 0.99};
  for (size_t m = 0; m < 3; ++m) {
    const std::array<double, 3> bounds = {limits[m].p50, limits[m].p90, limits[m].p99};
    for (size_t q = 0; q < 3; ++q) {
      limits_[3 * m + q] = bounds[q];
      const auto lo = static_cast<int64_t>(std::floor(quantiles[q] * static_cast<double>(total_requests - 1)));
      needed_[3 * m + q] = total_requests - lo;
    }
  }
}

bool SloFailureDetector::observe(const RequestResult& request) {
  const RequestSlowdown s = slowdown(request, reference_);
  const std::array<double, 3> values = {s.ttft, s.tbt, s.e2e};
  bool failed = false;
  for (size_t i = 0; i < 9; ++i) {
    if (values[i / 3] >= limits_[i]) ++at_or_above_[i];
    failed = failed || at_or_above_[i] >= needed_[i];
  }
  return failed;
}

double throughput_per_s(const std::vector<RequestResult>& requests, double window_start_s, double window_end_s) {
  SF_CHECK(window_end_s > window_start_s, "throughput: window [{}, {}) is empty", window_start_s, window_end_s);
  const auto done = std::count_if(requests.begin(), requests.end(), [&](const RequestResult& r) {
    return r.completion_s >= window_start_s && r.completion_s < window_end_s;
  });
  return static_cast<double>(done) / (window_end_s - window_start_s);
}

}  // namespace splitflow::sim
