// sim/search.h — questions that take many simulations: latency vs request rate per design, the
// highest rate a cluster sustains within its SLOs, and the Splitwise paper's design search (how
// many prompt and token machines, of which types: minimal cost or power for a target rate, maximal
// throughput within a cost or power budget). Runs are independent and spread over threads; results
// never depend on the thread count.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "sim/config.h"
#include "sim/perf_model.h"
#include "sim/report.h"
#include "sim/simulator.h"
#include "sim/workload.h"

namespace splitflow::sim {

struct EvaluateOptions {
  bool stop_when_slos_fail = false;  // end a run as soon as an SLO is sure to fail (SloFailureDetector)
};

struct Evaluation {
  RunSummary summary;
  SimulationResult result;
};
Evaluation evaluate(const ClusterConfig& config, const PerfModel& perf_model, const Workload& workload,
                    const EvaluateOptions& options = {});

// "30:250:10" (first:last:step, both ends included) or "30,40,60"; positive and ascending.
std::vector<double> parse_rates(const std::string& text);

// The workload at a request rate. Called from several threads: it must not share mutable state.
using WorkloadAtRate = std::function<Workload(double rate_per_s)>;

// Index of the highest passing entry of an ascending list by bisection, assuming that whatever
// passes at some rate passes at every lower one; -1 when the first fails.
int highest_passing(size_t count, const std::function<bool(size_t)>& passes);

struct SweepRow {
  std::string design;
  double rate_per_s = 0;
  RunSummary summary;
};
// Every config at every rate (full runs, for latency-vs-rate curves).
std::vector<SweepRow> sweep_rates(const std::vector<ClusterConfig>& configs, const PerfModel& perf_model,
                                  const std::vector<double>& rates, const WorkloadAtRate& workload_at, int threads);
// The highest swept rate of `design` below which every rate met the SLOs (0: not even the first).
double max_rate_meeting_slos(const std::vector<SweepRow>& rows, const std::string& design);
void write_sweep_csv(const std::string& path, const std::vector<SweepRow>& rows);
std::string format_sweep(const std::vector<SweepRow>& rows);

// A family of clusters built on a base config's model, instance limits, link and SLOs.
struct Design {
  std::string prompt_type;  // machine type of the prompt pool; a baseline's only type
  std::string token_type;   // machine type of the token pool; empty for a baseline
  bool splitwise() const { return !token_type.empty(); }
  std::string name() const;  // "baseline dgx-h100", "splitwise dgx-h100/dgx-a100"
};
// "baseline:TYPE" or "splitwise:PROMPT_TYPE/TOKEN_TYPE", naming machine types of the base config.
Design parse_design(const std::string& text, const ClusterConfig& base);
// A baseline per machine type, then every (prompt type, token type) pair.
std::vector<Design> all_designs(const ClusterConfig& base);

struct Shape {
  int prompt_machines = 0;  // a baseline's machine count
  int token_machines = 0;   // 0 for a baseline
};
// Baselines: one mixed pool and token_jsq; Splitwise: prompt and token pools and mixed_pool. One
// instance per machine, at the tensor parallelism a base pool gives that type (else all its GPUs).
ClusterConfig make_cluster(const ClusterConfig& base, const Design& design, Shape shape);

struct SearchPoint {
  Design design;
  Shape shape;
  double cost = 0, power = 0;
  bool slos_met = false;
  double rate_per_s = 0;        // target search: the target; budget search: highest passing rate (0: none)
  double throughput_per_s = 0;  // measured at rate_per_s
  std::string error;            // a run that could not finish (e.g. a request no machine can hold)
};

struct TargetSearchOptions {
  int max_prompt_machines = 40;
  int max_token_machines = 40;
  int max_baseline_machines = 80;
  int threads = 1;
};
struct TargetSearchResult {
  std::vector<SearchPoint> points;  // every shape tried, design by design, prompt-major
  int min_cost = -1;                // index into points; -1: no shape met the SLOs
  int min_power = -1;
  std::vector<int> pareto;          // SLO-meeting points no other beats in both cost and power, by cost
};
// Every shape up to the limits, run on `workload` (the target rate); the cheapest and the least
// power-hungry shapes meeting all SLOs (ties: the other measure, then fewer machines, then order).
TargetSearchResult search_target_rate(const ClusterConfig& base, const PerfModel& perf_model,
                                      const std::vector<Design>& designs, const Workload& workload,
                                      const TargetSearchOptions& options);

enum class BudgetKind { Cost, Power };
// The shapes that use a budget fully: for each prompt-machine count, the most token machines that
// fit (a baseline: the most machines that fit). Budgets are compared with a 1e-9 relative slack so
// 40 × 4.76 fits in a budget of 190.4.
std::vector<Shape> budget_shapes(const ClusterConfig& base, const Design& design, BudgetKind kind, double budget);

struct BudgetSearchOptions {
  BudgetKind kind = BudgetKind::Power;
  double budget = 0;
  std::vector<double> rates;  // ascending candidates for the highest passing rate
  int threads = 1;
};
struct BudgetSearchResult {
  std::vector<Design> designs;
  std::vector<SearchPoint> points;   // every budget shape with its highest passing rate
  std::vector<int> best_per_design;  // index into points per design; -1: nothing passed
  int best = -1;                     // highest rate (ties: throughput, then lower cost, power, order)
};
BudgetSearchResult search_budget(const ClusterConfig& base, const PerfModel& perf_model,
                                 const std::vector<Design>& designs, const WorkloadAtRate& workload_at,
                                 const BudgetSearchOptions& options);

void write_search_csv(const std::string& path, const std::vector<SearchPoint>& points);
std::string format_target_search(const TargetSearchResult& result, double rate_per_s);
std::string format_budget_search(const BudgetSearchResult& result, const BudgetSearchOptions& options);
nlohmann::json search_point_json(const SearchPoint& point);

}  // namespace splitflow::sim
