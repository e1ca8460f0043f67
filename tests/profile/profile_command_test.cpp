// `splitflow profile` as a user runs it: a --quick CPU profile of stories260K whose CSV must hold
// the whole grid and load into the simulator's context-aware model, its provenance sidecar, and a
// clean "error: ..." naming the problem for each kind of bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "profile/profile.h"
#include "sim/perf_model.h"
#include "splitflow_command.h"
#include "test_paths.h"

namespace splitflow::profile {
namespace {

std::filesystem::path scratch_dir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("sf_profile_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

const std::string kModel = test::shared_path("models/stories260K-hf");

test::CommandResult run_profile(std::vector<std::string> args) {
  args.insert(args.begin(), "profile");
  return test::run_splitflow(args);
}

std::vector<std::map<std::string, std::string>> read_rows(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  std::vector<std::string> header;
  std::stringstream names(line);
  for (std::string name; std::getline(names, name, ',');) header.push_back(name);
  std::vector<std::map<std::string, std::string>> rows;
  while (std::getline(in, line)) {
    std::vector<std::string> fields;
    size_t start = 0;
    while (true) {
      const size_t comma = line.find(',', start);
      fields.push_back(line.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    EXPECT_EQ(fields.size(), header.size()) << line;
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size() && i < fields.size(); ++i) row[header[i]] = fields[i];
    rows.push_back(row);
  }
  return rows;
}

TEST(ProfileCommand, QuickCpuProfileHoldsTheGridAndLoadsIntoTheSimulator) {
  const std::filesystem::path dir = scratch_dir("quick");
  const std::string out = (dir / "perf.csv").string();
  const test::CommandResult result = run_profile({"--model", kModel, "--device", "cpu", "--quick", "--out", out});
  ASSERT_EQ(result.exit_code, 0) << result.err;

  // The quick grid (profile.h): prompts 8, 32, 64; batches 1, 4 at contexts 0, 64, 128; transfers
  // of 16 and 64 tokens; 2 repetitions of each.
  std::multiset<std::string> points;
  for (const auto& row : read_rows(out)) {
    EXPECT_EQ(row.at("model"), "stories260k-hf");
    EXPECT_EQ(row.at("hardware"), "cpu");
    EXPECT_EQ(row.at("tensor_parallel"), "1");
    const std::string& phase = row.at("phase");
    const std::string time = phase == "prompt" ? row.at("prompt_time")
                             : phase == "token" ? row.at("token_time")
                                                : row.at("transfer_time");
    EXPECT_GT(std::stod(time), 0.0) << phase;
    if (phase == "prompt") points.insert("prompt " + row.at("prompt_size"));
    if (phase == "token") points.insert("token " + row.at("batch_size") + "x" + row.at("context_tokens"));
    if (phase == "kv_transfer") {
      points.insert("kv " + row.at("prompt_size"));
      // K and V of every layer: 2 x 5 layers x 4 KV heads x 8 dims x 4 bytes (f32 cache) per token,
      // from stories260K's config.json.
      EXPECT_EQ(std::stoll(row.at("kv_bytes")), 2LL * 5 * 4 * 8 * 4 * std::stoll(row.at("prompt_size")));
    }
  }
  std::multiset<std::string> expected;
  for (int rep = 0; rep < 2; ++rep) {
    for (const char* n : {"8", "32", "64"}) expected.insert(std::string("prompt ") + n);
    for (const char* b : {"1", "4"})
      for (const char* c : {"0", "64", "128"}) expected.insert(std::string("token ") + b + "x" + c);
    if (kv_transfer_available())
      for (const char* n : {"16", "64"}) expected.insert(std::string("kv ") + n);
  }
  EXPECT_EQ(points, expected);

  // The simulator reads it as a context-aware model with profiled transfers.
  const sim::PerfModel model = sim::PerfModel::load_csv(out);
  const sim::PerfCurves& curves = model.curves(sim::PerfKey{"stories260k-hf", "cpu", 1});
  EXPECT_EQ(curves.decode_model, sim::DecodeModel::ContextAware);
  EXPECT_EQ(curves.decode_step_time_s->xs(), (std::vector<double>{1, 4}));
  EXPECT_EQ(curves.decode_step_time_s->ys(), (std::vector<double>{0, 64, 128}));
  EXPECT_EQ(curves.kv_transfer_time_s.has_value(), kv_transfer_available());

  const nlohmann::json sidecar = nlohmann::json::parse(test::read_file(out + ".json"));
  EXPECT_EQ(sidecar["model"]["num_layers"], 5);
  EXPECT_EQ(sidecar["model"]["num_kv_heads"], 4);
  EXPECT_EQ(sidecar["model"]["max_position"], 512);
  EXPECT_EQ(sidecar["kv_cache_dtype"], "f32");
  EXPECT_EQ(sidecar["backend"], "cpu");
  EXPECT_FALSE(sidecar["commit"].get<std::string>().empty());
  EXPECT_FALSE(sidecar["device"].get<std::string>().empty());
  EXPECT_EQ(sidecar["grid"]["context_lengths"], (std::vector<int>{0, 64, 128}));
  EXPECT_EQ(sidecar["kv_transfer_link"]["measured"], kv_transfer_available());
  if (kv_transfer_available()) {
    EXPECT_NE(sidecar["kv_transfer_link"]["address"].get<std::string>().find("127.0.0.1:"), std::string::npos);
    // The transfers are reported against the loopback's own bandwidth, measured in the same run.
    EXPECT_GT(sidecar["kv_transfer_link"]["loopback_tcp_gbps"].get<double>(), 0.0);
    const double fraction = sidecar["kv_transfer_link"]["largest_transfer_fraction_of_link"].get<double>();
    EXPECT_GT(fraction, 0.0);
  }
  std::filesystem::remove_all(dir);
}

TEST(ProfileCommand, BadInputIsNamed) {
  const std::filesystem::path dir = scratch_dir("bad");
  const std::string out = (dir / "perf.csv").string();
  auto expect_error = [&](std::vector<std::string> args, const std::string& message_part) {
    if (std::find(args.begin(), args.end(), "--out") == args.end()) {
      args.push_back("--out");
      args.push_back(out);
    }
    test::expect_command_error(run_profile(args), message_part);
  };
  const std::vector<std::string> model = {"--model", kModel, "--device", "cpu", "--quick"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = model;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  expect_error({"--dummy-weights", "--config", (dir / "no_such_config.json").string()}, "no_such_config.json");
  expect_error(with({"--prompt-sizes", "0,8"}), "--prompt-sizes: 0 is not allowed");
  expect_error(with({"--batch-sizes", "-1,2"}), "--batch-sizes: -1 is not allowed");
  expect_error(with({"--context-lengths", "0,600"}), "--context-lengths: 600 exceeds");
  expect_error(with({"--context-lengths", "-3,6"}), "--context-lengths: -3 is not allowed");
  expect_error(with({"--prompt-sizes", "8,1000"}), "--prompt-sizes: 1000 exceeds the model's context (512");
  expect_error(with({"--kv-transfer-sizes", "16,513"}), "--kv-transfer-sizes: 513 exceeds");
  expect_error(with({"--prompt-sizes", "8"}), "--prompt-sizes: needs at least two distinct values");
  expect_error(with({"--prompt-sizes", "8,abc"}), "--prompt-sizes: 'abc' is not an integer");
  expect_error(with({"--repetitions", "0"}), "--repetitions must be at least 1");
  expect_error(with({"--out", (dir / "missing" / "perf.csv").string()}), "does not exist");
  expect_error(with({"--out", dir.string()}), "is a directory");
  EXPECT_FALSE(std::filesystem::exists(out));  // nothing written by a refused run
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace splitflow::profile
