// `splitflow sim` as a user runs it: the reference example through `sim run`, small sweeps,
// searches and scale runs, plots drawn or skipped, and a clean "error: ..." with exit status 1 for
// each kind of bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "sim/plots.h"
#include "splitflow_command.h"
#include "test_paths.h"

namespace splitflow::sim {
namespace {

using test::CommandResult;

CommandResult run_sim(const std::vector<std::string>& args, const std::string& env_prefix = "") {
  std::vector<std::string> command = {"sim"};
  command.insert(command.end(), args.begin(), args.end());
  return test::run_splitflow(command, env_prefix);
}

void expect_error(const std::vector<std::string>& args, const std::string& message_part) {
  test::expect_command_error(run_sim(args), message_part);
}

std::string config(const std::string& name) { return test::fixture_path("../../sim/configs/" + name); }
const std::string kPerfModel = test::shared_path("sim-reference/splitwise-sim/perf_model.csv");
const std::string kTestTrace = test::shared_path("sim-reference/splitwise-sim/traces/test_trace.csv");
const std::string kConvTrace = test::shared_path("traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv");

std::filesystem::path scratch_dir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("sf_sim_cli_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(SimCommand, RunReplaysTheReferenceExample) {
  const std::filesystem::path dir = scratch_dir("run");
  const CommandResult result = run_sim({"run", "--config", config("splitwise_ha_1h100p_1a100t.json"), "--perf-model",
                                        kPerfModel, "--trace", kTestTrace, "--out", dir.string()});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("all nine SLOs met"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("3 requests"), std::string::npos) << result.out;
  // Splitwise-HA example (sim-reference README): E2E 2.199226, 0.622873, 1.003019 s.
  const nlohmann::json summary = nlohmann::json::parse(test::read_file((dir / "summary.json").string()));
  EXPECT_NEAR(summary["e2e_s"]["p50"].get<double>(), 1.003019, 5e-7);
  EXPECT_NEAR(summary["ttft_s"]["p50"].get<double>(), 0.251964, 5e-7);
  EXPECT_EQ(summary["pools"]["prompt"]["machines"], 1);
  EXPECT_EQ(summary["pools"]["token"]["machines"], 1);
  EXPECT_DOUBLE_EQ(summary["cost"].get<double>(), 4.76 + 2.21);
  EXPECT_TRUE(summary.contains("provenance"));
  const std::string requests = test::read_file((dir / "requests.csv").string());
  EXPECT_NE(requests.find(",2.199226"), std::string::npos) << requests;
  EXPECT_NE(test::read_file((dir / "batch_time.csv").string()).find("token,batch_size,1,"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(SimCommand, PoissonRunIsReproducibleBySeed) {
  const std::vector<std::string> args = {"run",     "--config",   config("baseline_h100.json"), "--perf-model", kPerfModel,
                                         "--trace", kConvTrace,  "--rate", "20", "--duration", "30", "--seed", "5"};
  const CommandResult first = run_sim(args), second = run_sim(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  // Everything but the wall-clock line is identical.
  auto without_wall = [](const std::string& text) {
    std::string kept, line;
    std::istringstream lines(text);
    while (std::getline(lines, line))
      if (line.rfind("simulated:", 0) != 0) kept += line + "\n";
    return kept;
  };
  EXPECT_EQ(without_wall(first.out), without_wall(second.out));
  EXPECT_NE(first.out.find("Poisson 20 req/s for 30 s"), std::string::npos) << first.out;
}

TEST(SimCommand, SweepWritesCsvAndDrawsOrSkipsThePlot) {
  const std::filesystem::path dir = scratch_dir("sweep");
  const std::vector<std::string> args = {"sweep", "--config", config("baseline_h100.json"), "--config",
                                         config("splitwise_hh.json"), "--perf-model", kPerfModel, "--trace", kConvTrace,
                                         "--rates", "10,20", "--duration", "30", "--threads", "2", "--out", dir.string()};
  const CommandResult drawn = run_sim(args);
  ASSERT_EQ(drawn.exit_code, 0) << drawn.err;
  EXPECT_NE(drawn.out.find("max rate in SLO"), std::string::npos) << drawn.out;
  std::ifstream csv(dir / "sweep.csv");
  std::string line;
  int rows = -1;
  while (std::getline(csv, line)) ++rows;
  EXPECT_EQ(rows, 4);  // 2 designs × 2 rates
  EXPECT_TRUE(std::filesystem::exists(dir / "latency_vs_rate.gp"));
  if (!find_program("gnuplot").empty()) {
    EXPECT_TRUE(std::filesystem::exists(dir / "latency_vs_rate.svg")) << drawn.err;
  }

  // Without gnuplot on PATH: a message, the CSV and the script, no image.
  std::filesystem::remove_all(dir);
  const CommandResult skipped = run_sim(args, "PATH=/nonexistent");
  ASSERT_EQ(skipped.exit_code, 0) << skipped.err;
  EXPECT_NE(skipped.err.find("gnuplot not found"), std::string::npos) << skipped.err;
  EXPECT_TRUE(std::filesystem::exists(dir / "sweep.csv"));
  EXPECT_TRUE(std::filesystem::exists(dir / "latency_vs_rate.gp"));
  EXPECT_FALSE(std::filesystem::exists(dir / "latency_vs_rate.svg"));
  std::filesystem::remove_all(dir);
}

TEST(SimCommand, SearchPrintsTheOptimumAndWritesTheDesignSpace) {
  const std::filesystem::path dir = scratch_dir("search");
  const CommandResult result =
      run_sim({"search", "--config", config("splitwise_hh.json"), "--design", "splitwise:dgx-h100/dgx-h100",
               "--design", "baseline:dgx-h100", "--perf-model", kPerfModel, "--trace", kConvTrace, "--rate", "1",
               "--duration", "60", "--max-prompt", "2", "--max-token", "2", "--max-baseline", "2", "--out", dir.string()});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("6 shapes simulated"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("optimum, minimal cost"), std::string::npos) << result.out;
  // One H100 handles 1 req/s of conversation within the SLOs: the cheapest is a baseline of one.
  EXPECT_NE(result.out.find("1 mixed"), std::string::npos) << result.out;
  const nlohmann::json json = nlohmann::json::parse(test::read_file((dir / "design_space.json").string()));
  EXPECT_EQ(json["min_cost"]["design"], "baseline dgx-h100");
  EXPECT_EQ(json["min_cost"]["prompt_machines"], 1);
  EXPECT_TRUE(std::filesystem::exists(dir / "design_space.csv"));
  EXPECT_TRUE(std::filesystem::exists(dir / "design_space_dgx-h100_dgx-h100.gp"));
  std::filesystem::remove_all(dir);
}

TEST(SimCommand, IsoPowerSearchAndScale) {
  const CommandResult iso = run_sim({"search", "--config", config("splitwise_hh.json"), "--design",
                                     "splitwise:dgx-h100/dgx-h100", "--perf-model", kPerfModel, "--trace", kConvTrace,
                                     "--iso-power", "132", "--rates", "1,2,4,8", "--duration", "30"});
  ASSERT_EQ(iso.exit_code, 0) << iso.err;
  EXPECT_NE(iso.out.find("iso-power (power <= 132)"), std::string::npos) << iso.out;
  EXPECT_NE(iso.out.find("2 shapes"), std::string::npos) << iso.out;  // 1 P + 2 T and 2 P + 1 T

  const CommandResult scale = run_sim({"scale", "--config", config("baseline_h100.json"), "--perf-model", kPerfModel,
                                       "--trace", kConvTrace, "--machines", "4,8", "--duration", "10"});
  ASSERT_EQ(scale.exit_code, 0) << scale.err;
  EXPECT_NE(scale.out.find("peak MiB"), std::string::npos) << scale.out;
}

TEST(SimCommand, RejectsBadInput) {
  const std::filesystem::path dir = scratch_dir("bad");
  std::filesystem::create_directories(dir);
  nlohmann::json misspelt = nlohmann::json::parse(test::read_file(config("baseline_h100.json")));
  misspelt["instance"]["max_batch_sise"] = 64;
  std::ofstream(dir / "misspelt.json") << misspelt.dump();
  const std::string base = config("baseline_h100.json");

  expect_error({"run", "--config", (dir / "misspelt.json").string(), "--perf-model", kPerfModel, "--trace", kTestTrace},
               "unknown field 'max_batch_sise'");
  expect_error({"run", "--config", (dir / "missing.json").string()}, "cannot open cluster config");
  expect_error({"run", "--config", base, "--perf-model", kPerfModel, "--trace", (dir / "missing.csv").string()},
               "cannot open trace");
  expect_error({"run", "--config", base, "--perf-model", (dir / "missing.csv").string(), "--trace", kTestTrace},
               "missing.csv");
  expect_error({"run", "--config", base, "--perf-model", kPerfModel, "--trace", kConvTrace, "--rate", "-5"},
               "--rate must be positive");
  expect_error({"run", "--config", base, "--perf-model", kPerfModel, "--trace", kConvTrace, "--rate", "0"},
               "--rate must be positive");
  expect_error({"run", "--config", base, "--perf-model", kPerfModel, "--trace", kTestTrace, "--rate-scale", "0"},
               "--rate-scale must be positive");
  expect_error({"run", "--config", base, "--perf-model", kPerfModel, "--trace", kConvTrace, "--rate", "5",
                "--duration", "-1"},
               "--duration must be positive");
  expect_error({"sweep", "--config", base, "--perf-model", kPerfModel, "--trace", kConvTrace, "--rates", "50:30:10"},
               "last rate is below the first");
  expect_error({"search", "--config", base, "--perf-model", kPerfModel, "--trace", kConvTrace}, "exactly one of");
  expect_error({"search", "--config", base, "--design", "splitwise:dgx-h100/dgx-b200", "--rate", "5"},
               "unknown machine type 'dgx-b200'");
  expect_error({"search", "--config", base, "--perf-model", kPerfModel, "--trace", kConvTrace, "--rate", "-1"},
               "--rate must be positive");
  expect_error({"search", "--config", base, "--perf-model", kPerfModel, "--trace", kConvTrace, "--iso-cost", "-3",
                "--rates", "10"},
               "cost budget must be positive");
  expect_error({"scale", "--config", base, "--perf-model", kPerfModel, "--trace", kConvTrace, "--machines", "10,5"},
               "ascending");

  // Malformed numbers are refused by the option parser (CLI11), before the simulator runs.
  const CommandResult not_a_number =
      run_sim({"run", "--config", base, "--perf-model", kPerfModel, "--trace", kConvTrace, "--rate", "fast"});
  EXPECT_NE(not_a_number.exit_code, 0);
  EXPECT_NE(not_a_number.err.find("--rate"), std::string::npos) << not_a_number.err;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace splitflow::sim
