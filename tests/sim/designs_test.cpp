// Issue 6's cluster-level check: at iso-power (the power of 40 DGX-H100) on the conversation
// workload, Splitwise-HH (25 prompt + 15 token H100) sustains a higher request rate within all nine
// SLOs than Baseline-H100 (40 mixed H100), and so a higher throughput. Poisson arrivals with lengths
// drawn from the Azure conv trace, 600 s per rate, as SplitwiseSim's rr_conv_* traces. The table of
// all six designs (docs/simulator.md) comes from `splitflow sim sweep`.
#include <gtest/gtest.h>

#include <cstdio>

#include "sim/config.h"
#include "sim/search.h"
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
  double max_rate = 0;          // highest rate of the ascending sweep before the first SLO miss
  double throughput_per_s = 0;  // at max_rate
};

DesignResult sweep(const std::string& config_name, const std::vector<Request>& lengths) {
  const ClusterConfig config = load_cluster_config(test::fixture_path("../../sim/configs/" + config_name));
  DesignResult design;
  for (int rate = 60; rate <= 200; rate += 10) {
    const Workload workload = poisson_workload_from(lengths, rate, 600, 1, "conv");
    const RunSummary summary = evaluate(config, reference_model(), workload, {.stop_when_slos_fail = true}).summary;
    std::printf("[sim] %s at %d req/s: SLOs %s, throughput %.2f/s\n", config_name.c_str(), rate,
                summary.slos_met ? "met" : "missed", summary.throughput_per_s);
    if (!summary.slos_met) break;
    design = {static_cast<double>(rate), summary.throughput_per_s};
  }
  return design;
}

TEST(SimDesigns, SplitwiseHhBeatsBaselineH100AtIsoPowerOnConversation) {
  const std::vector<Request> lengths =
      load_azure_trace(test::shared_path("traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"));
  const ClusterConfig hh = load_cluster_config(test::fixture_path("../../sim/configs/splitwise_hh.json"));
  const ClusterConfig baseline = load_cluster_config(test::fixture_path("../../sim/configs/baseline_h100.json"));
  ASSERT_DOUBLE_EQ(hh.total_power(), baseline.total_power());  // iso-power: 40 × 44

  const DesignResult splitwise = sweep("splitwise_hh.json", lengths);
  const DesignResult base = sweep("baseline_h100.json", lengths);
  EXPECT_GT(base.max_rate, 0);
  EXPECT_GT(splitwise.max_rate, base.max_rate);
  EXPECT_GT(splitwise.throughput_per_s, base.throughput_per_s);
}

}  // namespace
}  // namespace splitflow::sim
