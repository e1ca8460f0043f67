// The 3-request SplitwiseSim example (test_trace.csv, bloom-176b) against the stored outputs of
// SplitwiseSim's example notebook (../shared/sim-reference/splitwise-sim/example_outputs/).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "sim/config.h"
#include "sim/simulator.h"
#include "sim/workload.h"
#include "test_paths.h"

namespace splitflow::sim {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

const PerfModel& reference_model() {
  static const PerfModel model =
      PerfModel::load_csv(test::shared_path("sim-reference/splitwise-sim/perf_model.csv"));
  return model;
}

std::string config_path(const std::string& name) { return test::fixture_path("../../sim/configs/" + name); }
std::string reference_path(const std::string& name) {
  return test::shared_path("sim-reference/splitwise-sim/" + name);
}

// The reference's CSVs (CRLF) as header -> column of strings; read here, independently of sim/csv.h.
std::map<std::string, std::vector<std::string>> read_columns(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  std::string line;
  auto next_line = [&] {
    if (!std::getline(in, line)) return false;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return true;
  };
  next_line();
  std::vector<std::string> header;
  std::stringstream header_fields(line);
  for (std::string field; std::getline(header_fields, field, ',');) header.push_back(field);
  std::map<std::string, std::vector<std::string>> columns;
  while (next_line()) {
    std::stringstream fields(line);
    size_t i = 0;
    for (std::string field; std::getline(fields, field, ',') && i < header.size(); ++i)
      columns[header[i]].push_back(field);
  }
  return columns;
}

// Printed with six decimals: agree within half a unit of the sixth.
void expect_printed(double value, const std::string& printed, const std::string& what) {
  EXPECT_LE(std::fabs(value - std::stod(printed)), 0.5e-6 + 1e-12)
      << what << ": got " << value << ", reference " << printed;
}

SimulationResult run_example(const std::string& config_name) {
  Simulation simulation(load_cluster_config(config_path(config_name)), reference_model(),
                        load_splitwise_trace(reference_path("traces/test_trace.csv")),
                        SimulationOptions{.record_iterations = true});
  return simulation.run();
}

std::vector<IterationRecord> runs_on(const SimulationResult& result, int instance) {
  std::vector<IterationRecord> runs;
  for (const IterationRecord& run : result.iterations)
    if (run.instance == instance) runs.push_back(run);
  return runs;
}

TEST(SimExample, BaselineH100MatchesReferencePerRequest) {
  const SimulationResult result = run_example("baseline_h100_1server.json");
  auto reference = read_columns(reference_path("example_outputs/baseline_h100_1server_requests.csv"));
  ASSERT_EQ(result.requests.size(), 3u);
  ASSERT_EQ(reference["request_ids"].size(), 3u);
  for (size_t r = 0; r < 3; ++r) {
    const RequestResult& request = result.requests[r];
    const std::string id = "request " + std::to_string(r);
    EXPECT_EQ(request.id, std::stoll(reference["request_ids"][r]));
    expect_printed(request.ttft_s(), reference["ttft_times"][r], id + " TTFT");
    expect_printed(request.e2e_s(), reference["response_times"][r], id + " E2E");
    expect_printed(request.tbt_s(), reference["tbt_times"][r], id + " TBT");
    expect_printed(request.nth_token_overhead_s(), reference["nth_token_overheads"][r], id + " nth-token overhead");
  }
  // The README's table, as printed there.
  expect_printed(result.requests[0].e2e_s(), "1.744743", "README request 0 E2E");
  expect_printed(result.requests[1].tbt_s(), "0.030911", "README request 1 TBT");
  expect_printed(result.requests[2].e2e_s(), "0.781873", "README request 2 E2E");
}

TEST(SimExample, BaselineH100MatchesReferenceRuns) {
  const SimulationResult result = run_example("baseline_h100_1server.json");
  auto reference = read_columns(reference_path("example_outputs/baseline_h100_1server_instance_iterations.csv"));
  const std::vector<IterationRecord> runs = runs_on(result, 0);
  ASSERT_EQ(runs.size(), reference["iteration_start"].size());
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string what = "run " + std::to_string(i);
    expect_printed(runs[i].start_s, reference["iteration_start"][i], what + " start");
    expect_printed(runs[i].end_s, reference["iteration_end"][i], what + " end");
    expect_printed(runs[i].end_s - runs[i].start_s, reference["duration"][i], what + " duration");
    EXPECT_EQ(runs[i].iterations, std::stoll(reference["num_contiguous_iterations"][i])) << what;
    EXPECT_EQ(runs[i].batch_tokens, std::stoll(reference["batch_tokens"][i])) << what;
    EXPECT_EQ(runs[i].prompt_tasks, std::stoi(reference["prompt_tasks_in_batch"][i])) << what;
    expect_printed(static_cast<double>(runs[i].memory_bytes) / kGiB, reference["memory"][i], what + " memory GiB");
  }
}

TEST(SimExample, SplitwiseHaMatchesReferencePerRequest) {
  const SimulationResult result = run_example("splitwise_ha_1h100p_1a100t.json");
  auto reference = read_columns(reference_path("example_outputs/splitwise_ha_1h100p_1a100t_requests.csv"));
  ASSERT_EQ(result.requests.size(), 3u);
  for (size_t r = 0; r < 3; ++r) {
    const RequestResult& request = result.requests[r];
    const std::string id = "request " + std::to_string(r);
    EXPECT_EQ(request.prompt_instance, 0) << id;  // the H100 prompt machine
    EXPECT_EQ(request.token_instance, 1) << id;   // the A100 token machine
    expect_printed(request.ttft_s(), reference["ttft_times"][r], id + " TTFT");
    expect_printed(request.e2e_s(), reference["response_times"][r], id + " E2E");
    expect_printed(request.tbt_s(), reference["tbt_times"][r], id + " TBT");
    expect_printed(request.nth_token_overhead_s(), reference["nth_token_overheads"][r], id + " KV transfer");
  }
  // README: transfers 0.076563 / 0.038281 / 0.038281 s; E2E 2.199226 / 0.622873 / 1.003019 s.
  expect_printed(result.requests[0].nth_token_overhead_s(), "0.076563", "README transfer 0");
  expect_printed(result.requests[0].e2e_s(), "2.199226", "README E2E 0");
  expect_printed(result.requests[2].tbt_s(), "0.046941", "README TBT 2");
}

TEST(SimExample, SplitwiseHaMatchesReferenceRuns) {
  const SimulationResult result = run_example("splitwise_ha_1h100p_1a100t.json");
  auto reference = read_columns(reference_path("example_outputs/splitwise_ha_1h100p_1a100t_instance_iterations.csv"));
  // The reference lists the A100 token machine's runs first, then the H100 prompt machine's.
  std::vector<IterationRecord> runs = runs_on(result, 1);
  for (const IterationRecord& run : runs_on(result, 0)) runs.push_back(run);
  ASSERT_EQ(runs.size(), reference["iteration_start"].size());
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string what = reference["name"][i] + " run " + reference["iteration"][i];
    expect_printed(runs[i].start_s, reference["iteration_start"][i], what + " start");
    expect_printed(runs[i].end_s, reference["iteration_end"][i], what + " end");
    expect_printed(runs[i].end_s - runs[i].start_s, reference["duration"][i], what + " duration");
    EXPECT_EQ(runs[i].iterations, std::stoll(reference["num_contiguous_iterations"][i])) << what;
    expect_printed(static_cast<double>(runs[i].memory_bytes) / kGiB, reference["memory"][i], what + " memory GiB");
  }
}

}  // namespace
}  // namespace splitflow::sim
