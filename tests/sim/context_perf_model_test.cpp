// The context-aware decode model and profiled KV transfers (docs/simulator.md), on a small profile
// written here. Every expected value is worked out by hand from the table in the comment below,
// not read back from the code.
//
//   prompt rows: P(100) = 10 ms, P(200) = 30 ms (pooled medians: {9, 10, 11} and {30, 30})
//   decode grid T(b, c) in ms:      c = 0   1000   2000
//                          b = 1:       5      7     11
//                          b = 4:       6     14     30
//   kv_transfer rows: 100 tokens 2 ms, 300 tokens 4 ms
// Between knots: along c at b = 1, slope 0.002 ms/token below 1000, 0.004 above; at b = 4, 0.008
// and 0.016. At b = 2 (a third of the way from 1 to 4) every value is 2/3 row 1 + 1/3 row 4.
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "sim/config.h"
#include "sim/simulator.h"

namespace splitflow::sim {
namespace {

const char* const kHeader =
    "model,hardware,tensor_parallel,phase,prompt_size,batch_size,context_tokens,kv_bytes,prompt_time,token_time,"
    "transfer_time,repetition\n";

std::string write_profile(const std::string& name, const std::string& rows) {
  // The running test's name and the process in the file name: ctest runs tests as parallel
  // processes, and two writing one "grid" file read each other's half-written profile.
  const std::string path = ::testing::TempDir() + "/sim_context_" + name + "_" +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
                           std::to_string(::getpid()) + ".csv";
  std::ofstream(path) << kHeader << rows;
  return path;
}

const std::string kRows =
    "m,h,1,prompt,100,1,0,,9,,,0\n"
    "m,h,1,prompt,100,1,0,,10,,,1\n"
    "m,h,1,prompt,100,1,0,,11,,,2\n"
    "m,h,1,prompt,200,1,0,,30,,,0\n"
    "m,h,1,prompt,200,1,0,,30,,,1\n"
    "m,h,1,token,,1,0,,,5,,0\n"
    "m,h,1,token,,1,1000,,,7,,0\n"
    "m,h,1,token,,1,2000,,,11,,0\n"
    "m,h,1,token,,4,0,,,6,,0\n"
    "m,h,1,token,,4,1000,,,14,,0\n"
    "m,h,1,token,,4,2000,,,29,,0\n"
    "m,h,1,token,,4,2000,,,31,,1\n"  // two samples: their mean, 30, is the median
    "m,h,1,kv_transfer,100,1,,1000,,,2,0\n"
    "m,h,1,kv_transfer,300,1,,3000,,,4,0\n";

const PerfKey kKey{"m", "h", 1};

PerfModel model(DecodeModelChoice choice = DecodeModelChoice::Auto) {
  return PerfModel::load_csv(write_profile("grid", kRows), choice);
}

TEST(SimContextModel, BilinearGridMatchesHandValues) {
  const PerfModel perf = model();
  const PerfCurves& c = perf.curves(kKey);
  ASSERT_EQ(c.decode_model, DecodeModel::ContextAware);
  const BilinearGrid& t = *c.decode_step_time_s;
  EXPECT_NEAR(t(1, 0), 0.005, 1e-15);
  EXPECT_NEAR(t(4, 2000), 0.030, 1e-15);
  // (2, 500): row 1 gives 6, row 4 gives 10; 2/3 * 6 + 1/3 * 10 = 22/3 ms.
  EXPECT_NEAR(t(2, 500), 22.0 / 3 / 1000, 1e-15);
  // (2, 1500): row 1 gives 9, row 4 gives 22; 2/3 * 9 + 1/3 * 22 = 40/3 ms.
  EXPECT_NEAR(t(2, 1500), 40.0 / 3 / 1000, 1e-15);
  // Beyond the grid the edge cells extend: (8, 2000) = 11 + 7/3 * (30 - 11) = 166/3 ms;
  // (8, 3000): at b = 8 the c = 1000 and 2000 values are 70/3 and 166/3, so + 96/3 = 262/3 ms.
  EXPECT_NEAR(t(8, 2000), 166.0 / 3 / 1000, 1e-14);
  EXPECT_NEAR(t(8, 3000), 262.0 / 3 / 1000, 1e-14);
  EXPECT_NEAR(c.prompt_time_s(150), 0.020, 1e-15);
  EXPECT_NEAR(c.prompt_time_s(100), 0.010, 1e-15);  // median of 9, 10, 11
}

TEST(SimContextModel, DecodeBlocksSumTheirGrowingSteps) {
  const PerfModel perf = model();
  const PerfCurves& c = perf.curves(kKey);
  // b = 1 from context 998, 4 steps, across the knot at 1000: 6.996 + 6.998 + 7 + 7.004 ms.
  EXPECT_NEAR(c.decode_block_time_s(1, 998, 4), 0.027998, 1e-14);
  // b = 2 from context 152 (fractional means work too: 152.5), slope 0.004 ms/token at b = 2.
  EXPECT_NEAR(c.decode_block_time_s(2, 152, 2), (16.0 / 3 + 0.608 + 16.0 / 3 + 0.612) / 1000, 1e-14);
  EXPECT_NEAR(c.decode_block_time_s(2, 152.5, 1), (16.0 / 3 + 0.61) / 1000, 1e-14);
  EXPECT_DOUBLE_EQ(c.decode_block_time_s(1, 100, 0), 0.0);
  // Beyond the last knot (b = 1, c >= 2000: slope 0.004): 11 + 11.004 + 11.008.
  EXPECT_NEAR(c.decode_block_time_s(1, 2000, 3), 0.033012, 1e-14);
  // The SLO reference: a request alone, prompt 998, 5 tokens: its 4 decode steps' mean.
  EXPECT_NEAR(c.reference_tbt_s(998, 5), 0.027998 / 4, 1e-15);
}

TEST(SimContextModel, MixedBatchesAddTheDecodesAttention) {
  const PerfModel perf = model();
  const PerfCurves& c = perf.curves(kKey);
  // 150 prompt tokens + 4 decodes at mean context 1000: P(154) = 20.8 ms, + T(4, 1000) − T(4, 0) = 8.
  EXPECT_NEAR(c.batch_time_s(150, 4, 1000, 1.1), 0.0288, 1e-14);
  EXPECT_NEAR(c.batch_time_s(150, 0, 0, 1.1), 0.020, 1e-14);
  EXPECT_NEAR(c.batch_time_s(0, 4, 1000, 1.1), 0.014, 1e-14);
}

TEST(SimContextModel, SplitwiseModeOfTheSameProfileIgnoresContext) {
  const PerfModel perf = model(DecodeModelChoice::SplitwiseSim);
  const PerfCurves& c = perf.curves(kKey);
  EXPECT_EQ(c.decode_model, DecodeModel::SplitwiseSim);
  // T(b) = the median over every context: b = 1 {5, 7, 11} -> 7, b = 4 {6, 14, 29, 31} -> 21.5.
  EXPECT_NEAR(c.token_time_s(1), 0.007, 1e-15);
  EXPECT_NEAR(c.token_time_s(4), 0.0215, 1e-15);
  EXPECT_NEAR(c.batch_time_s(0, 2, 1500, 1.1), (7 + 14.5 / 3) / 1000, 1e-15);  // T(2), context ignored
  EXPECT_NEAR(c.batch_time_s(150, 4, 1000, 1.1), 1.1 * 0.0208, 1e-15);  // 1.1 P(154)
  EXPECT_NEAR(c.reference_tbt_s(100, 5), c.token_time_s(100), 1e-15);   // SplitwiseSim's T(prompt)
}

TEST(SimContextModel, KvTransferRowsInterpolateByTokens) {
  const PerfModel perf = model();
  const PiecewiseLinear& x = *perf.curves(kKey).kv_transfer_time_s;
  EXPECT_NEAR(x(200), 0.003, 1e-15);
  EXPECT_NEAR(x(500), 0.006, 1e-15);
}

TEST(SimContextModel, BadProfilesNameTheProblem) {
  auto message = [](const std::string& name, const std::string& rows, DecodeModelChoice choice) {
    try {
      PerfModel::load_csv(write_profile(name, rows), choice);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string prompts = "m,h,1,prompt,100,1,0,,10,,,0\nm,h,1,prompt,200,1,0,,30,,,0\n";
  const std::string grid = "m,h,1,token,,1,0,,,5,,0\nm,h,1,token,,1,1000,,,7,,0\nm,h,1,token,,4,0,,,6,,0\n";
  EXPECT_NE(message("missing_cell", prompts + grid, DecodeModelChoice::Auto)
                .find("lacks batch_size 4 at context_tokens 1000"), std::string::npos);
  EXPECT_NE(message("one_context", prompts + "m,h,1,token,,1,0,,,5,,0\nm,h,1,token,,4,0,,,6,,0\n",
                    DecodeModelChoice::Auto).find("1 context lengths"), std::string::npos);
  EXPECT_NE(message("phase", prompts + "m,h,1,decode,,1,0,,,5,,0\n", DecodeModelChoice::Auto)
                .find("unknown phase 'decode'"), std::string::npos);
  EXPECT_NE(message("negative", prompts + "m,h,1,token,,1,-5,,,5,,0\n", DecodeModelChoice::Auto)
                .find("context_tokens must be non-negative"), std::string::npos);
  EXPECT_NE(message("zero_time", prompts + "m,h,1,token,,1,0,,,0,,0\n", DecodeModelChoice::Auto)
                .find("token_time must be positive"), std::string::npos);
  EXPECT_NE(message("no_tokens", prompts, DecodeModelChoice::Auto).find("no token rows"), std::string::npos);
  EXPECT_NE(message("one_transfer", kRows.substr(0, kRows.find("m,h,1,kv_transfer,300")), DecodeModelChoice::Auto)
                .find("kv_transfer rows need at least two sizes"), std::string::npos);
  // SplitwiseSim's schema has no context grid to be context-aware with.
  const std::string old_path = ::testing::TempDir() + "/sim_context_old.csv";
  std::ofstream(old_path) << "model,hardware,prompt_size,batch_size,tensor_parallel,prompt_time,token_time\n"
                             "m,h,128,1,1,2,1\nm,h,256,1,1,4,1\n";
  EXPECT_THROW(PerfModel::load_csv(old_path, DecodeModelChoice::ContextAware), Error);
  EXPECT_EQ(PerfModel::load_csv(old_path).curves(kKey).decode_model, DecodeModel::SplitwiseSim);
  EXPECT_THROW(parse_decode_model_choice("contextual"), Error);
}

// One machine of model "m" on hardware "h" (memory to spare), SplitwiseSim's batching limits.
nlohmann::json one_machine(const std::string& role_layout) {
  nlohmann::json config = {
      {"name", "toy"},
      {"model", {{"name", "m"}, {"weights_bytes", 1000}, {"kv_bytes_per_token", 10}, {"num_layers", 2}}},
      {"machine_types", {{{"name", "box"}, {"hardware", "h"}, {"num_gpus", 1}, {"gpu_memory_bytes", 100000000},
                          {"cost", 1}, {"power", 1}}}},
      {"slo", {{"reference_hardware", "h"}, {"reference_tensor_parallel", 1}}}};
  if (role_layout == "mixed") {
    config["pools"] = {{{"machine_type", "box"}, {"role", "mixed"}, {"count", 1}, {"tensor_parallel", 1}}};
    config["scheduler"] = {{"kind", "token_jsq"}};
  } else {
    config["pools"] = {{{"machine_type", "box"}, {"role", "prompt"}, {"count", 1}, {"tensor_parallel", 1}},
                       {{"machine_type", "box"}, {"role", "token"}, {"count", 1}, {"tensor_parallel", 1}}};
    config["scheduler"] = {{"kind", "mixed_pool"}};
    config["kv_transfer"] = {{"timing", "profile"}, {"mode", role_layout}};
  }
  return config;
}

TEST(SimContextModel, DecodeStepsSlowDownAsCachesGrow) {
  const PerfModel perf = model();
  // Prompt 100, 5 tokens: TTFT P(100) = 10 ms, then 4 steps at contexts 100..103 of 5 + 0.002 c ms.
  const SimulationResult context_result =
      Simulation(parse_cluster_config(one_machine("mixed").dump(), "toy"), perf, {{0, 0.0, 100, 5}}).run();
  EXPECT_NEAR(context_result.requests[0].prompt_end_s, 0.010, 1e-12);
  EXPECT_NEAR(context_result.requests[0].completion_s, 0.010 + 0.020812, 1e-12);
  // SplitwiseSim's mode of the same profile: 4 × T(1) = 4 × 7 ms.
  const PerfModel splitwise = model(DecodeModelChoice::SplitwiseSim);
  const SimulationResult splitwise_result =
      Simulation(parse_cluster_config(one_machine("mixed").dump(), "toy"), splitwise, {{0, 0.0, 100, 5}}).run();
  EXPECT_NEAR(splitwise_result.requests[0].completion_s, 0.038, 1e-12);
}

TEST(SimContextModel, ArrivalCutsAGrowingDecodeBlockAtItsStepBoundary) {
  const PerfModel perf = model();
  // A: prompt 100, 11 tokens. Its decode steps after the prompt (10 ms) end 5.2, 10.402, 15.606 ms
  // later; B (prompt 200, 3 tokens) arrives at 23 ms, inside the third step, which is allowed to end.
  // Mixed step: P(201) = 30.2 ms + A's attention at context 103, T(1, 103) − T(1, 0) = 0.206 ms.
  // Then A (context 104) and B (context 200) decode together at mean context 152: 2 steps of
  // 16/3 + 0.004 c ms (c = 152, 153), B done; A alone at contexts 106..109: 20.86 ms.
  std::vector<Request> requests = {{0, 0.0, 100, 11}, {1, 0.023, 200, 3}};
  Simulation simulation(parse_cluster_config(one_machine("mixed").dump(), "toy"), perf, requests,
                        SimulationOptions{.record_iterations = true});
  const SimulationResult result = simulation.run();
  const double cut_s = 0.010 + 0.015606;
  const double mixed_end_s = cut_s + 0.030406;
  const double b_done_s = mixed_end_s + (32.0 / 3 + 0.608 + 0.612) / 1000;
  EXPECT_NEAR(result.requests[1].prompt_end_s, mixed_end_s, 1e-12);
  EXPECT_NEAR(result.requests[1].completion_s, b_done_s, 1e-12);
  EXPECT_NEAR(result.requests[0].completion_s, b_done_s + 0.02086, 1e-12);
  ASSERT_GE(result.iterations.size(), 3u);
  EXPECT_EQ(result.iterations[1].iterations, 3);  // the cut block ran 3 of its 10 steps
  EXPECT_NEAR(result.iterations[1].end_s, cut_s, 1e-12);
}

TEST(SimContextModel, ProfiledKvTransferTimesReplaceTheBandwidth) {
  const PerfModel perf = model();
  // Prompt 100 on the prompt machine (10 ms), its cache moves in X(100) = 2 ms, then one decode step
  // at context 100 on the token machine (5.2 ms).
  const SimulationResult serialized =
      Simulation(parse_cluster_config(one_machine("serialized").dump(), "toy"), perf, {{0, 0.0, 100, 2}}).run();
  EXPECT_NEAR(serialized.requests[0].decode_start_s, 0.012, 1e-12);
  EXPECT_NEAR(serialized.requests[0].completion_s, 0.0172, 1e-12);
  // Layer-wise over 2 layers: max(2 − 10 × 1/2, 2 / 2) = 1 ms visible.
  const SimulationResult layerwise =
      Simulation(parse_cluster_config(one_machine("layerwise_overlapped").dump(), "toy"), perf, {{0, 0.0, 100, 2}})
          .run();
  EXPECT_NEAR(layerwise.requests[0].decode_start_s, 0.011, 1e-12);
  // A profile without kv_transfer rows cannot time a transfer by profile.
  const PerfModel no_transfers = PerfModel::load_csv(write_profile("no_transfers", kRows.substr(0, kRows.find("m,h,1,kv_transfer"))));
  EXPECT_THROW(Simulation(parse_cluster_config(one_machine("serialized").dump(), "toy"), no_transfers, {{0, 0.0, 100, 2}}),
               Error);
  nlohmann::json bad = one_machine("serialized");
  bad["kv_transfer"]["timing"] = "measured";
  EXPECT_THROW(parse_cluster_config(bad.dump(), "toy"), Error);
}

}  // namespace
}  // namespace splitflow::sim
