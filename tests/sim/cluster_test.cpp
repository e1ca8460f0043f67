// Cluster-scale runs: the one-hour Azure conversation trace replayed on the shipped 40-machine
// configs; checks invariants and reports the simulation speed (issue 6 target: < 5 s on one core).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "sim/config.h"
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

const std::vector<Request>& conversation_trace() {
  static const std::vector<Request> requests =
      load_azure_trace(test::shared_path("traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"));
  return requests;
}

void run_and_check(const std::string& config_name, const std::vector<Request>& requests, const char* workload) {
  const ClusterConfig config = load_cluster_config(test::fixture_path("../../sim/configs/" + config_name));
  const auto start = std::chrono::steady_clock::now();
  Simulation simulation(config, reference_model(), requests);
  const SimulationResult result = simulation.run();
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  ASSERT_EQ(result.requests.size(), requests.size());
  std::vector<double> ttft, tbt;
  for (const RequestResult& r : result.requests) {
    // Never faster than an unloaded prefill on the fastest profile in the cluster (H100).
    const double unloaded_prefill_s =
        reference_model().curves(PerfKey{config.model.name, "h100-80gb", 8}).prompt_time_s(r.prompt_tokens);
    EXPECT_GE(r.ttft_s(), unloaded_prefill_s - 1e-9) << "request " << r.id;
    EXPECT_GE(r.completion_s, r.decode_start_s);
    EXPECT_GE(r.decode_start_s, r.prompt_end_s);
    ttft.push_back(r.ttft_s());
    tbt.push_back(r.tbt_s());
  }
  for (const Instance& instance : simulation.instances()) {
    // Everything finished: only the weights remain, and no scheduler debt is left.
    EXPECT_EQ(instance.memory_bytes, config.model.weights_bytes) << instance.name;
    EXPECT_EQ(instance.sched_memory_bytes, config.model.weights_bytes) << instance.name;
    EXPECT_EQ(instance.sched_pending_tokens, 0) << instance.name;
    EXPECT_EQ(instance.pool, instance.home_pool) << instance.name;
  }
  std::sort(ttft.begin(), ttft.end());
  std::sort(tbt.begin(), tbt.end());
  auto p = [](const std::vector<double>& v, double q) { return v[static_cast<size_t>(q * (v.size() - 1))]; };
  std::printf("[sim] %s, %s (%zu requests, %.0f s): %.3f s wall, %lld events (%.2f M events/s); "
              "TTFT p50 %.3f p99 %.3f s, TBT p50 %.4f p99 %.4f s\n",
              config.name.c_str(), workload, requests.size(), result.end_time_s, wall_s,
              static_cast<long long>(result.events), result.events / wall_s / 1e6, p(ttft, 0.5), p(ttft, 0.99),
              p(tbt, 0.5), p(tbt, 0.99));
}

TEST(SimCluster, ConversationHourBaselineH100) {
  run_and_check("baseline_h100.json", conversation_trace(), "conv trace replay");
}
TEST(SimCluster, ConversationHourSplitwiseHa) {
  run_and_check("splitwise_ha.json", conversation_trace(), "conv trace replay");
}
// The paper's load range: Poisson at 70 req/s for 600 s, lengths resampled from the conv trace.
TEST(SimCluster, ConversationPoisson70BaselineH100) {
  run_and_check("baseline_h100.json", poisson_workload(conversation_trace(), 70, 600, 1), "conv Poisson 70/s");
}
TEST(SimCluster, ConversationPoisson70SplitwiseHa) {
  run_and_check("splitwise_ha.json", poisson_workload(conversation_trace(), 70, 600, 1), "conv Poisson 70/s");
}

}  // namespace
}  // namespace splitflow::sim
