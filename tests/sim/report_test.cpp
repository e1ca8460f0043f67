// What a run reports: busy time per batch size (computed here from the perf curves), summaries
// and their files, the exactness of the early SLO-failure stop, and workload construction.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "sim/metrics.h"
#include "sim/report.h"
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
const PerfCurves& h100() { return reference_model().curves(PerfKey{"bloom-176b", "h100-80gb", 8}); }
const PerfCurves& a100() { return reference_model().curves(PerfKey{"bloom-176b", "a100-80gb", 8}); }

ClusterConfig shipped(const std::string& name) {
  return load_cluster_config(test::fixture_path("../../sim/configs/" + name));
}

std::filesystem::path scratch_dir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("sf_sim_report_{}_{}", name, ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(SimReport, BusyTimePerBatchSize) {
  // One H100: A (512 prompt, 11 out) at 0; B (256 prompt, 3 out) cuts A's decode block after 3
  // iterations, joins it as a mixed batch, both decode twice, A finishes alone (4 iterations).
  const double t1 = h100().token_time_s(1);
  Workload workload;
  workload.requests = {{0, 0.0, 512, 11}, {1, h100().prompt_time_s(512) + 2.5 * t1, 256, 3}};
  workload.duration_s = 1;
  const Evaluation run = evaluate(shipped("baseline_h100_1server.json"), reference_model(), workload);
  const BatchTime& mixed = run.result.batch_time[static_cast<size_t>(InstanceRole::Mixed)];
  ASSERT_EQ(mixed.seconds_by_batch_size.size(), 3u);
  EXPECT_NEAR(mixed.seconds_by_batch_size[1], h100().prompt_time_s(512) + 7 * t1, 1e-12);
  EXPECT_NEAR(mixed.seconds_by_batch_size[2], 1.1 * h100().prompt_time_s(257) + 2 * h100().token_time_s(2), 1e-12);
  EXPECT_NEAR(mixed.seconds_by_batch_tokens[1], 7 * t1, 1e-12);
  EXPECT_NEAR(mixed.seconds_by_batch_tokens[2], 2 * h100().token_time_s(2), 1e-12);
  EXPECT_NEAR(mixed.seconds_by_batch_tokens[257], 1.1 * h100().prompt_time_s(257), 1e-12);
  EXPECT_NEAR(mixed.seconds_by_batch_tokens[512], h100().prompt_time_s(512), 1e-12);
  EXPECT_TRUE(run.result.batch_time[static_cast<size_t>(InstanceRole::Prompt)].seconds_by_batch_size.empty());

  const std::filesystem::path dir = scratch_dir("batch");
  write_batch_time_csv((dir / "batch_time.csv").string(), run.result.batch_time);
  const std::string csv = test::read_file((dir / "batch_time.csv").string());
  EXPECT_NE(csv.find(fmt::format("mixed,batch_tokens,257,{:.9g}\n", 1.1 * h100().prompt_time_s(257))), std::string::npos)
      << csv;
  std::filesystem::remove_all(dir);
}

TEST(SimReport, SummaryOfTheReferenceExample) {
  // SplitwiseSim's 3-request example on one DGX-H100 (sim-reference README): TTFT 0.649598,
  // 0.251964, 0.251964 s; E2E 1.744743, 0.499255, 0.781873 s.
  const ClusterConfig config = shipped("baseline_h100_1server.json");
  Workload workload;
  workload.requests = load_trace(test::shared_path("sim-reference/splitwise-sim/traces/test_trace.csv"));
  workload.duration_s = 10;
  const Evaluation run = evaluate(config, reference_model(), workload);
  const RunSummary& s = run.summary;
  EXPECT_NEAR(s.ttft_s.p50, 0.251964, 5e-7);
  EXPECT_NEAR(s.ttft_s.p99, 0.251964 + 0.98 * (0.649598 - 0.251964), 1e-6);  // numpy: 2 × 0.99 = 1.98
  EXPECT_NEAR(s.e2e_s.p50, 0.781873, 5e-7);
  EXPECT_EQ(s.requests, 3);
  EXPECT_EQ(s.finished, 3);
  EXPECT_DOUBLE_EQ(s.cost, 4.76);
  EXPECT_DOUBLE_EQ(s.power, 44);
  // Slowdowns against the unloaded A100: request 1's TTFT is P_H100(2048) / P_A100(2048).
  EXPECT_NEAR(s.slo.checks[0].slowdown, h100().prompt_time_s(2048) / a100().prompt_time_s(2048), 1e-9);
  EXPECT_TRUE(s.slos_met);
  // Throughput window [1, 9): all three finish inside it.
  EXPECT_DOUBLE_EQ(s.throughput_per_s, 3.0 / 8.0);

  const nlohmann::json json = summary_json(s, config.slo);
  EXPECT_EQ(json["slo_checks"].size(), 9u);
  EXPECT_EQ(json["slo_checks"][3]["metric"], "tbt_p50");
  EXPECT_EQ(json["slos_met"], true);
  EXPECT_EQ(json["pools"]["mixed"]["machines"], 1);
  const std::string text = format_summary(s, config.slo);
  EXPECT_NE(text.find("all nine SLOs met: yes"), std::string::npos) << text;

  const std::filesystem::path dir = scratch_dir("requests");
  write_requests_csv((dir / "requests.csv").string(), run.result.requests, a100());
  std::ifstream in(dir / "requests.csv");
  std::string header, row;
  std::getline(in, header);
  EXPECT_EQ(header.rfind("id,arrival_s,prompt_tokens,output_tokens,", 0), 0u);
  int rows = 0;
  while (std::getline(in, row)) ++rows;
  EXPECT_EQ(rows, 3);
  std::filesystem::remove_all(dir);
}

TEST(SimReport, FailureDetectorDecidesExactlyWhenAPercentileMustFail) {
  // TTFT p50 limit 2 over N = 11 values: p50 = v[5] (sorted), so 6 values >= 2 decide failure and 5 do not.
  const PerfCurves& ref = a100();
  const double ttft_unit_s = ref.prompt_time_s(1000);
  // A long decode at the reference pace keeps TBT and E2E slowdowns near 1 (E2E below 1.03), so
  // only the TTFT checks can fail.
  auto request = [&](double ttft_slowdown) {
    RequestResult r;
    r.prompt_tokens = 1000;
    r.output_tokens = 200;
    r.prompt_end_s = ttft_slowdown * ttft_unit_s;
    r.completion_s = r.prompt_end_s + 199 * ref.token_time_s(1000);
    return r;
  };
  SloFailureDetector detector(11, ref, SloConfig{});
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(detector.observe(request(2.0)));
  EXPECT_TRUE(detector.observe(request(2.0)));

  // Random runs: once the detector fires, the full check fails; when it never fires the check is
  // free to pass.
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> slowdown(0.2, 2.4);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 40);
    SloFailureDetector d(n, ref, SloConfig{});
    std::vector<RequestResult> requests;
    bool fired = false;
    for (int i = 0; i < n; ++i) {
      requests.push_back(request(slowdown(rng)));
      fired = d.observe(requests.back()) || fired;
    }
    const bool passed = check_slos(slowdowns(requests, ref)).all_passed();
    if (fired) {
      EXPECT_FALSE(passed) << "trial " << trial;
    }
  }
}

TEST(SimReport, OverloadedRunStopsEarlyAndFails) {
  const std::vector<Request> lengths =
      load_azure_trace(test::shared_path("traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"));
  const Workload workload = poisson_workload_from(lengths, 40, 120, 3, "conv");
  const ClusterConfig tiny = make_cluster(shipped("splitwise_hh.json"), Design{"dgx-h100", "dgx-h100"}, {2, 1});
  const Evaluation stopped = evaluate(tiny, reference_model(), workload, {.stop_when_slos_fail = true});
  EXPECT_TRUE(stopped.summary.stopped_early);
  EXPECT_FALSE(stopped.summary.slos_met);
  EXPECT_LT(stopped.summary.finished, stopped.summary.requests);
  const Evaluation full = evaluate(tiny, reference_model(), workload);
  EXPECT_FALSE(full.summary.stopped_early);
  EXPECT_FALSE(full.summary.slos_met);
  EXPECT_LT(stopped.result.events, full.result.events);

  // A cluster that meets its SLOs runs to the end either way, with identical results.
  const ClusterConfig big = shipped("splitwise_hh.json");
  const Evaluation a = evaluate(big, reference_model(), workload, {.stop_when_slos_fail = true});
  const Evaluation b = evaluate(big, reference_model(), workload);
  EXPECT_TRUE(a.summary.slos_met);
  EXPECT_FALSE(a.summary.stopped_early);
  EXPECT_EQ(a.result.events, b.result.events);
  EXPECT_DOUBLE_EQ(a.summary.e2e_s.p99, b.summary.e2e_s.p99);
}

TEST(SimReport, StalledRequestsFailTheSlosInsteadOfAborting) {
  // Splitwise-HH for the coding trace (35 prompt + 5 token H100) far past its capacity: token
  // memory runs out, prompt machines are borrowed without a memory check (as SplitwiseSim does),
  // and one fills with queued decodes holding prompt KV that it can never start, since KV is
  // reserved in full up front. The run ends; the stalled requests fail every SLO.
  const std::vector<Request> lengths =
      load_azure_trace(test::shared_path("traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv"));
  const Workload workload = poisson_workload_from(lengths, 170, 600, 1, "code");
  const Evaluation run = evaluate(shipped("splitwise_hh_code.json"), reference_model(), workload);
  EXPECT_GT(run.summary.stalled, 0);
  EXPECT_EQ(run.summary.finished + run.summary.stalled, run.summary.requests);
  EXPECT_FALSE(run.summary.slos_met);
  EXPECT_NE(format_summary(run.summary, SloConfig{}).find("never finished"), std::string::npos);
}

TEST(SimReport, WorkloadsFromTraces) {
  const std::vector<Request> trace = load_trace(test::shared_path("sim-reference/splitwise-sim/traces/test_trace.csv"));
  ASSERT_EQ(trace.size(), 3u);
  const Workload replay = replay_workload(trace, 2, "test");
  EXPECT_DOUBLE_EQ(replay.requests[1].arrival_s, 1.5);  // 3 s / 2
  EXPECT_DOUBLE_EQ(replay.duration_s, 2.0);             // last arrival, 4 s / 2
  EXPECT_DOUBLE_EQ(replay.window_start_s(), 0.2);
  EXPECT_DOUBLE_EQ(replay.window_end_s(), 1.8);
  EXPECT_THROW(replay_workload(trace, 0, "test"), Error);
  EXPECT_THROW(replay_workload(trace, -1, "test"), Error);
  EXPECT_THROW(replay_workload({}, 1, "empty"), Error);

  const Workload poisson = poisson_workload_from(trace, 5, 100, 11, "test");
  EXPECT_DOUBLE_EQ(poisson.duration_s, 100);
  EXPECT_EQ(poisson.requests.size(), poisson_workload(trace, 5, 100, 11).size());
  EXPECT_THROW(poisson_workload_from(trace, 0, 100, 1, "test"), Error);
  EXPECT_THROW(poisson_workload_from(trace, std::nan(""), 100, 1, "test"), Error);
  EXPECT_THROW(poisson_workload_from(trace, 5, -1, 1, "test"), Error);

  const std::filesystem::path dir = scratch_dir("trace");
  std::ofstream(dir / "bad.csv") << "time,prompt,output\n1,2,3\n";
  EXPECT_THROW(load_trace((dir / "bad.csv").string()), Error);
  EXPECT_THROW(load_trace((dir / "missing.csv").string()), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace splitflow::sim
