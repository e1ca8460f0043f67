// Perf model vs the knots derived independently from SplitwiseSim's perf_model.csv
// (../shared/sim-reference/splitwise-sim/perf_model_knots_derived.csv and its README).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "sim/perf_model.h"
#include "test_paths.h"

namespace splitflow::sim {
namespace {

const PerfModel& reference_model() {
  static const PerfModel model =
      PerfModel::load_csv(test::shared_path("sim-reference/splitwise-sim/perf_model.csv"));
  return model;
}

// |value - printed| within half a unit of the last printed digit.
void expect_printed(double value, double printed, double unit, const std::string& what) {
  EXPECT_LE(std::fabs(value - printed), 0.5 * unit + 1e-12) << what << ": got " << value << ", reference " << printed;
}

TEST(SimPerfModel, AllDerivedKnotsReproduced) {
  std::ifstream in(test::shared_path("sim-reference/splitwise-sim/perf_model_knots_derived.csv"));
  ASSERT_TRUE(in);
  std::string line;
  std::getline(in, line);  // header
  int rows = 0;
  while (std::getline(in, line)) {
    std::stringstream fields(line);
    std::string model, hardware, tp, batch_tokens, n_rows, prompt_s, token_s;
    std::getline(fields, model, ',');
    std::getline(fields, hardware, ',');
    std::getline(fields, tp, ',');
    std::getline(fields, batch_tokens, ',');
    std::getline(fields, n_rows, ',');
    std::getline(fields, prompt_s, ',');
    std::getline(fields, token_s, ',');
    const PerfCurves& curves = reference_model().curves(PerfKey{model, hardware, std::stoi(tp)});
    const double x = std::stod(batch_tokens);
    EXPECT_NEAR(curves.prompt_time_s(x), std::stod(prompt_s), 1e-12 * std::stod(prompt_s)) << line;
    EXPECT_NEAR(curves.token_time_s(x), std::stod(token_s), 1e-12 * std::stod(token_s)) << line;
    ++rows;
  }
  EXPECT_EQ(rows, 108);
  EXPECT_EQ(reference_model().keys().size(), 12u);
}

TEST(SimPerfModel, ReadmeValuesToPrintedPrecision) {
  const PerfCurves& h100 = reference_model().curves(PerfKey{"bloom-176b", "h100-80gb", 8});
  const PerfCurves& a100 = reference_model().curves(PerfKey{"bloom-176b", "a100-80gb", 8});
  expect_printed(h100.prompt_time_s(4096), 0.649598, 1e-6, "bloom H100 P(4096)");
  expect_printed(h100.prompt_time_s(2048), 0.251964, 1e-6, "bloom H100 P(2048)");
  expect_printed(h100.token_time_s(1), 0.0353272, 1e-7, "bloom H100 T(1)");
  expect_printed(a100.token_time_s(1), 0.0475182, 1e-7, "bloom A100 T(1)");
  // T(1) extrapolates the (128, 256) segment: README gives T(1) = 35.327 ms, T(512) = 36.17 ms.
  expect_printed(h100.token_time_s(1) * 1000, 35.327, 1e-3, "bloom H100 T(1) ms");
  expect_printed(h100.token_time_s(512) * 1000, 36.17, 1e-2, "bloom H100 T(512) ms");
}

TEST(SimPerfModel, InterpolatesAndExtrapolatesLinearly) {
  const PiecewiseLinear curve({1, 2, 4}, {10, 20, 24});
  EXPECT_DOUBLE_EQ(curve(1.5), 15);
  EXPECT_DOUBLE_EQ(curve(3), 22);
  EXPECT_DOUBLE_EQ(curve(0), 0);   // extends the first segment
  EXPECT_DOUBLE_EQ(curve(6), 28);  // extends the last segment
  EXPECT_DOUBLE_EQ(curve(4), 24);
}

TEST(SimPerfModel, IterationTimeByBatchKind) {
  const PerfKey key{"bloom-176b", "h100-80gb", 8};
  const PerfCurves& c = reference_model().curves(key);
  EXPECT_DOUBLE_EQ(reference_model().iteration_time_s(key, BatchKind::PromptOnly, 3000), c.prompt_time_s(3000));
  EXPECT_DOUBLE_EQ(reference_model().iteration_time_s(key, BatchKind::DecodeOnly, 37), c.token_time_s(37));
  EXPECT_DOUBLE_EQ(reference_model().iteration_time_s(key, BatchKind::Mixed, 3000), 1.1 * c.prompt_time_s(3000));
}

TEST(SimPerfModel, RejectsBadCurvesAndKeys) {
  EXPECT_THROW(PiecewiseLinear({1, 1}, {2, 3}), Error);
  EXPECT_THROW(PiecewiseLinear({1}, {2}), Error);
  EXPECT_THROW(PiecewiseLinear({1, 2}, {2}), Error);
  EXPECT_THROW(reference_model().curves(PerfKey{"bloom-176b", "h100-80gb", 4}), Error);
}

class SimPerfCsv : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    path_ = ::testing::TempDir() + "/sim_perf_" + std::to_string(counter_++) + ".csv";
    std::ofstream(path_) << text;
    return path_;
  }
  std::string path_;
  int counter_ = 0;
};

TEST_F(SimPerfCsv, RejectsBadFiles) {
  const std::string header = "model,hardware,prompt_size,batch_size,token_size,tensor_parallel,prompt_time,token_time\n";
  EXPECT_THROW(PerfModel::load_csv(::testing::TempDir() + "/no_such_profile.csv"), Error);
  EXPECT_THROW(PerfModel::load_csv(write("")), Error);
  EXPECT_THROW(PerfModel::load_csv(write(header)), Error);  // no rows
  EXPECT_THROW(PerfModel::load_csv(write("model,hardware\nm,h\n")), Error);  // missing columns
  EXPECT_THROW(PerfModel::load_csv(write(header + "m,h,128,1,128,8,abc,1\nm,h,256,1,128,8,2,1\n")), Error);
  EXPECT_THROW(PerfModel::load_csv(write(header + "m,h,128,1,128,8,1\n")), Error);  // short row
  EXPECT_THROW(PerfModel::load_csv(write(header + "m,h,128,1,128,8,1,1\n")), Error);  // one knot only
  EXPECT_THROW(PerfModel::load_csv(write(header + "m,h,0,1,128,8,1,1\nm,h,256,1,128,8,2,1\n")), Error);
  EXPECT_THROW(PerfModel::load_csv(write(header + "m,h,128,1,128,8,-1,1\nm,h,256,1,128,8,2,1\n")), Error);
  EXPECT_THROW(PerfModel::load_csv(write(header + "m,h,128,1,128,0,1,1\nm,h,256,1,128,0,2,1\n")), Error);
}

TEST_F(SimPerfCsv, PoolsRowsByBatchTokensWithMedian) {
  // 256 tokens from (256 x 1) and (128 x 2): median of {4, 6, 10, 20} = 8 ms.
  const std::string path = write(
      "model,hardware,prompt_size,batch_size,token_size,tensor_parallel,prompt_time,token_time\n"
      "m,h,128,1,128,8,2,1\nm,h,256,1,128,8,4,1\nm,h,256,1,256,8,10,3\nm,h,128,2,128,8,6,2\nm,h,128,2,128,8,20,5\n");
  const PerfModel model = PerfModel::load_csv(path);
  const PerfCurves& c = model.curves(PerfKey{"m", "h", 8});
  EXPECT_DOUBLE_EQ(c.prompt_time_s(128), 0.002);
  EXPECT_DOUBLE_EQ(c.prompt_time_s(256), 0.008);
  EXPECT_DOUBLE_EQ(c.token_time_s(256), 0.0025);
}

}  // namespace
}  // namespace splitflow::sim
