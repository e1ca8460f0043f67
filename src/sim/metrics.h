// sim/metrics.h — what a simulation run is judged by: latency percentiles, slowdowns against an
// unloaded reference machine, the nine SLO checks of the Splitwise paper, throughput, and the
// cluster's cost and power. Pure functions of SimulationResult and the perf model.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "sim/config.h"
#include "sim/perf_model.h"
#include "sim/simulator.h"

namespace splitflow::sim {

// q in [0, 1]; linear interpolation between order statistics (numpy's default).
double percentile(std::vector<double> values, double q);

Percentiles percentiles(const std::vector<double>& values);

// Per request, measured / unloaded-reference (SplitwiseSim's plots.ipynb): TTFT vs P_ref(prompt),
// TBT vs T_ref(prompt) (the token curve at x = prompt size), E2E vs P_ref + T_ref × (output − 1).
struct Slowdowns {
  std::vector<double> ttft, tbt, e2e;
};
Slowdowns slowdowns(const std::vector<RequestResult>& requests, const PerfCurves& reference);

struct RequestSlowdown {
  double ttft = 0, tbt = 0, e2e = 0;
};
RequestSlowdown slowdown(const RequestResult& request, const PerfCurves& reference);

struct SloCheck {
  std::string metric;    // "ttft_p50", ...
  double slowdown = 0;   // measured percentile of the slowdown
  double limit = 0;
  bool passed = false;   // slowdown < limit
};

struct SloReport {
  std::array<SloCheck, 9> checks;
  bool all_passed() const;
};
SloReport check_slos(const Slowdowns& slowdowns, const SloConfig& thresholds = {});

// Tells, while a run's requests finish, that its SLOs can no longer be met, so a search can stop a
// hopeless run early. Exact, not a heuristic: with N values sorted ascending, the q-percentile is at
// least v[floor(q (N − 1))], so once N − floor(q (N − 1)) values reach a limit, that check fails
// whatever the unfinished requests do.
class SloFailureDetector {
 public:
  SloFailureDetector(int64_t total_requests, const PerfCurves& reference, const SloConfig& slo);
  bool observe(const RequestResult& request);  // true once some check is sure to fail

 private:
  const PerfCurves& reference_;
  std::array<double, 9> limits_{};         // ttft p50/p90/p99, tbt ..., e2e ...
  std::array<int64_t, 9> needed_{};        // values at or above the limit that decide failure
  std::array<int64_t, 9> at_or_above_{};
};

// Requests whose decode completes in [window_start_s, window_end_s), per second of the window
// (SplitwiseSim's plots use [60, 540) on 600 s traces, skipping warm-up and drain).
double throughput_per_s(const std::vector<RequestResult>& requests, double window_start_s = 60,
                        double window_end_s = 540);

}  // namespace splitflow::sim
