// Metrics: percentiles vs numpy, slowdowns vs the unloaded A100 reference, the nine SLO checks
// (strict bounds, thresholds of slos_from_plots_ipynb.csv), throughput window.
#include <gtest/gtest.h>

#include "core/error.h"
#include "sim/metrics.h"
#include "test_paths.h"

namespace splitflow::sim {
namespace {

const PerfModel& reference_model() {
  static const PerfModel model =
      PerfModel::load_csv(test::shared_path("sim-reference/splitwise-sim/perf_model.csv"));
  return model;
}

TEST(SimMetrics, PercentilesMatchNumpy) {
  // numpy.percentile([3, 1, 4, 1, 5, 9, 2, 6], q) for q = 0, 50, 90, 99, 100.
  const std::vector<double> v = {3, 1, 4, 1, 5, 9, 2, 6};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(v, 0.5), 3.5);
  EXPECT_NEAR(percentile(v, 0.9), 6.8999999999999995, 1e-12);
  EXPECT_NEAR(percentile(v, 0.99), 8.79, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(v, 1), 9.0);
  EXPECT_DOUBLE_EQ(percentile({7}, 0.99), 7.0);
  EXPECT_THROW(percentile({}, 0.5), Error);
  EXPECT_THROW(percentile(v, 1.5), Error);
}

TEST(SimMetrics, SlowdownsAgainstUnloadedA100) {
  const PerfCurves& a100 = reference_model().curves(PerfKey{"bloom-176b", "a100-80gb", 8});
  RequestResult r;
  r.arrival_s = 10;
  r.prompt_tokens = 1500;
  r.output_tokens = 20;
  r.prompt_end_s = 10 + 2 * a100.prompt_time_s(1500);
  r.completion_s = r.prompt_end_s + 20 * 1.5 * a100.token_time_s(1500);
  const Slowdowns s = slowdowns({r}, a100);
  EXPECT_NEAR(s.ttft[0], 2.0, 1e-12);
  EXPECT_NEAR(s.tbt[0], 1.5, 1e-12);
  const double e2e_ref = a100.prompt_time_s(1500) + 19 * a100.token_time_s(1500);
  EXPECT_NEAR(s.e2e[0], r.e2e_s() / e2e_ref, 1e-12);
}

TEST(SimMetrics, NineStrictSloChecks) {
  Slowdowns s;
  s.ttft = {1.9, 1.9};
  s.tbt = {1.2, 1.2};
  s.e2e = {1.2, 1.2};
  SloReport report = check_slos(s);
  EXPECT_TRUE(report.all_passed());
  EXPECT_EQ(report.checks[0].metric, "ttft_p50");
  EXPECT_EQ(report.checks[8].metric, "e2e_p99");
  EXPECT_DOUBLE_EQ(report.checks[4].limit, 1.5);  // tbt_p90
  s.tbt = {1.25, 1.25};  // equal to the p50 bound: fails, the bounds are strict
  report = check_slos(s);
  EXPECT_FALSE(report.all_passed());
  EXPECT_FALSE(report.checks[3].passed);
  EXPECT_TRUE(report.checks[4].passed);
}

TEST(SimMetrics, ThroughputCountsCompletionsInWindow) {
  std::vector<RequestResult> requests(4);
  requests[0].completion_s = 59.9;
  requests[1].completion_s = 60;
  requests[2].completion_s = 539.9;
  requests[3].completion_s = 540;
  EXPECT_DOUBLE_EQ(throughput_per_s(requests), 2.0 / 480);
  EXPECT_THROW(throughput_per_s(requests, 5, 5), Error);
}

}  // namespace
}  // namespace splitflow::sim
