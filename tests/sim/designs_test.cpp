// The six designs at iso-power on the conversation workload (Poisson, lengths resampled from the
// Azure conv trace, 600 s per rate): the highest rate meeting all nine SLOs, as the paper's
// latency-vs-rate sweeps. Issue 6 asks that Splitwise-HH beat Baseline-H100 here.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "sim/config.h"
#include "sim/metrics.h"
#include "sim/simulator.h"
#include "sim/workload.h"
#include "test_paths.h"

namespace splitflow::sim {
namespace {

const PerfModel& reference_model() {
  static const PerfModel model =
      PerfModel::load_csv(test::shared_path("sim-reference/splitwise-sim/perf_model.csv"));
  return model;
}

struct DesignResult {
  std::string name;
  double cost = 0, power = 0;
  int max_rate = 0;             // highest swept rate meeting all SLOs (0: none)
  double throughput_per_s = 0;  // at max_rate
};

DesignResult sweep(const std::string& config_name, const std::vector<Request>& lengths) {
  const ClusterConfig config = load_cluster_config(test::fixture_path("../../sim/configs/" + config_name));
  const PerfCurves& a100 = reference_model().curves(PerfKey{config.model.name, "a100-80gb", 8});
  DesignResult design{config_name, config.total_cost(), config.total_power()};
  for (int rate = 30; rate <= 250; rate += 10) {
    const std::vector<Request> requests = poisson_workload(lengths, rate, 600, 1000 + rate);
    const SimulationResult result = Simulation(config, reference_model(), requests).run();
    if (!check_slos(slowdowns(result.requests, a100)).all_passed()) break;
    design.max_rate = rate;
    design.throughput_per_s = throughput_per_s(result.requests);
  }
  return design;
}

TEST(SimDesigns, IsoPowerConversationSweep) {
  const std::vector<Request> lengths =
      load_azure_trace(test::shared_path("traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"));
  const auto start = std::chrono::steady_clock::now();
  std::vector<DesignResult> designs;
  for (const char* name : {"baseline_a100.json", "baseline_h100.json", "splitwise_aa.json", "splitwise_hh.json",
                           "splitwise_ha.json", "splitwise_hhcap.json"})
    designs.push_back(sweep(name, lengths));
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[sim] iso-power conversation sweep (%.1f s wall)\n", wall_s);
  std::printf("[sim] %-22s %7s %7s %9s %12s\n", "design", "cost", "power", "max rate", "throughput/s");
  for (const DesignResult& d : designs)
    std::printf("[sim] %-22s %7.2f %7.1f %9d %12.2f\n", d.name.c_str(), d.cost, d.power, d.max_rate, d.throughput_per_s);
  EXPECT_GT(designs[3].throughput_per_s, designs[1].throughput_per_s) << "Splitwise-HH vs Baseline-H100";
}

}  // namespace
}  // namespace splitflow::sim
