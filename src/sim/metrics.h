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

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0;
};
Percentiles percentiles(const std::vector<double>& values);

// Per request, measured / unloaded-reference (SplitwiseSim's plots.ipynb): TTFT vs P_ref(prompt),
// TBT vs T_ref(prompt) (the token curve at x = prompt size), E2E vs P_ref + T_ref × (output − 1).
struct Slowdowns {
  std::vector<double> ttft, tbt, e2e;
};
Slowdowns slowdowns(const std::vector<RequestResult>& requests, const PerfCurves& reference);

// Strict upper bounds on slowdown percentiles; defaults are the paper's SLO table.
struct SloThresholds {
  Percentiles ttft{2, 3, 6};
  Percentiles tbt{1.25, 1.5, 5};
  Percentiles e2e{1.25, 1.5, 5};
};

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
SloReport check_slos(const Slowdowns& slowdowns, const SloThresholds& thresholds = {});

// Requests whose decode completes in [window_start_s, window_end_s), per second of the window
// (SplitwiseSim's plots use [60, 540) on 600 s traces, skipping warm-up and drain).
double throughput_per_s(const std::vector<RequestResult>& requests, double window_start_s = 60,
                        double window_end_s = 540);

}  // namespace splitflow::sim
