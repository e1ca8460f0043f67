// sim/report.h — what one simulation run reports: latency percentiles, the nine slowdown SLO
// checks, throughput, the cluster's cost and power, and busy time per batch size; as text, as a JSON
// summary, and as per-request and batch-time CSV files. Pure functions of a finished run.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/config.h"
#include "sim/metrics.h"
#include "sim/perf_model.h"
#include "sim/simulator.h"
#include "sim/workload.h"

namespace splitflow::sim {

struct RunSummary {
  std::string design;    // the cluster config's name
  std::string workload;  // Workload::description
  int machines = 0;
  double cost = 0, power = 0;  // the cluster's, from the machine types' constants
  int64_t requests = 0;
  int64_t finished = 0;        // < requests only when stopped early
  bool stopped_early = false;  // an SLO was certain to fail; latencies cover finished requests only
  int64_t stalled = 0;         // never finished (SimulationResult::stalled_requests): fail every SLO
  int64_t events = 0;
  double wall_s = 0;
  double end_time_s = 0;       // simulated time at the last event
  double window_start_s = 0, window_end_s = 0;
  Percentiles ttft_s, tbt_s, e2e_s;  // absolute, over finished requests
  SloReport slo;
  bool slos_met = false;
  double throughput_per_s = 0;       // completions in the window per second
  std::array<BatchTime, 3> batch_time;  // by home pool (index: InstanceRole)
  std::array<int, 3> machines_by_pool{};
};

// The unloaded reference instance the config's SLOs are measured against.
const PerfCurves& reference_curves(const ClusterConfig& config, const PerfModel& perf_model);

RunSummary summarize(const ClusterConfig& config, const PerfModel& perf_model, const Workload& workload,
                     const SimulationResult& result, double wall_s);

std::string format_summary(const RunSummary& summary, const SloConfig& slo);
nlohmann::json summary_json(const RunSummary& summary, const SloConfig& slo);

// One row per finished request: ids, instances, times (s) and slowdowns.
void write_requests_csv(const std::string& path, const std::vector<RequestResult>& requests,
                        const PerfCurves& reference);
// Rows (pool, measure, value, seconds) for batch_size and batch_tokens, non-zero entries only.
void write_batch_time_csv(const std::string& path, const std::array<BatchTime, 3>& batch_time);
void write_json(const std::string& path, const nlohmann::json& value);

const char* role_name(InstanceRole role);

// A text field for the simulator's CSV files, which never quote: commas become ';' and line breaks
// spaces (config names like "Baseline-H100 (40 DGX-H100, iso-power)"; gnuplot splits quoted fields).
std::string csv_text(std::string text);

}  // namespace splitflow::sim
