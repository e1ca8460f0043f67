// The HF fixtures (tests/fixtures/hf, tiny random-weight checkpoints with transformers' fp32
// logits) through ModelRunner on the CUDA backend: bf16 weights, activations and KV cache.
// Every prefill position and every cached decode step must pick the reference's top-1 token,
// and the logits must stay within kLogitsTolerance * max|logit| per row (bf16 rounding of the
// residual stream and of every matmul input over a few layers; measured worst cases are printed).
// Then the same fixtures with an fp8 KV cache on both backends, CUDA against CPU. Skips without a
// GPU.
#include "backend_cuda/cuda_test_util.h"

#include "engine/model_loader.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/block_allocator.h"
#include "runtime/model_runner.h"
#include "hf_fixture_runner.h"
#include "test_paths.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>

using namespace splitflow;

namespace {

constexpr double kRowTolerance = 0.25;
constexpr double kRelativeL2 = 0.06;
constexpr double kTop1Margin = 0.05;

int64_t argmax(const float* row, int64_t count) { return std::max_element(row, row + count) - row; }

struct RowStats {
  double worst_ratio = 0;  // max over rows of max|diff| / max|expected|
  int64_t rows = 0, near_tie_flips = 0;
  double diff_squares = 0, reference_squares = 0;
};

void compare_rows(const float* actual, const float* expected, int64_t rows, int64_t vocab, const std::string& what,
                  RowStats& stats) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = actual + r * vocab;
    const float* e = expected + r * vocab;
    double max_abs = 0, max_diff = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      const double diff = static_cast<double>(a[v]) - e[v];
      max_abs = std::max(max_abs, std::abs(static_cast<double>(e[v])));
      max_diff = std::max(max_diff, std::abs(diff));
      stats.diff_squares += diff * diff;
      stats.reference_squares += static_cast<double>(e[v]) * e[v];
    }
    const double ratio = max_diff / max_abs;  // NaN fails below
    stats.worst_ratio = std::max(stats.worst_ratio, std::isnan(ratio) ? INFINITY : ratio);
    ++stats.rows;
    EXPECT_LE(ratio, kRowTolerance) << what << " row " << r << ": max |diff| " << max_diff << ", max |logit| "
                                       << max_abs;
    const int64_t got = argmax(a, vocab), want = argmax(e, vocab);
    if (got == want) continue;
    std::vector<float> sorted(e, e + vocab);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    const double margin = static_cast<double>(sorted[0]) - sorted[1];
    if (margin < kTop1Margin * max_abs) {
      ++stats.near_tie_flips;
    } else {
      ADD_FAILURE() << what << " row " << r << ": top-1 " << got << " (logit " << a[got] << "), reference " << want
                    << " (logit " << e[want] << ", ours " << a[want] << ", reference's logit for ours " << e[got]
                    << "), reference margin " << margin;
    }
  }
}

class CudaHfFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaHfFixture, MatchesTransformersTop1AndLogits) {
  SF_REQUIRE_GPU();
  const std::string name = GetParam();
  const std::string dir = test::fixture_path("hf/" + name);
  std::unique_ptr<WeightSource> source = open_weights(dir);
  const ModelSpec spec = resolve_source_spec(*source, dir);
  std::unique_ptr<Backend> backend = test::make_test_cuda_backend();
  const KvCacheConfig kv{16, 4};  // small blocks so every prompt spans several, in shuffled order
  ModelRunner runner(spec, bind_weights(spec, *source, dominant_matrix_dtype(*source)), *backend, kv);
  const int64_t vocab = spec.vocab_size;
  RowStats stats;
  test::run_hf_fixture(runner, name, [&](const float* actual, const float* expected, int64_t rows, int32_t,
                                         const std::string& what) { compare_rows(actual, expected, rows, vocab, what, stats); });
  const double relative_l2 = std::sqrt(stats.diff_squares / stats.reference_squares);
  EXPECT_LE(relative_l2, kRelativeL2) << name << ": relative L2 error of all logits";
  std::cout << "[cuda fixture] " << name << ": " << stats.rows << " rows, worst max|diff|/max|logit| "
            << stats.worst_ratio << ", relative L2 " << relative_l2 << ", near-tie top-1 flips "
            << stats.near_tie_flips << "\n";
}

INSTANTIATE_TEST_SUITE_P(Transformers, CudaHfFixture, ::testing::ValuesIn(test::hf_fixture_names()),
                         [](const auto& info) { return info.param; });

// An fp8 (e4m3) KV cache on the CUDA backend against the CPU backend's (f32 weights and math),
// prompt by prompt on the fixture's tokens. Both caches round K and V to 3 mantissa bits, the CUDA
// one from bf16 values, so about 3 % of elements land one e4m3 step (2^-3) apart besides the bf16
// differences the test above bounds; these random models amplify cache errors into the logits
// (the CPU fp8 cache alone moves them by 4-20 % relative L2 from transformers', tests/e2e). Bounds:
// 25 % relative L2 over a fixture, and the CPU's top-1 wherever its margin is at least 15 % of
// max|logit| (tests/e2e's fp8 bounds). Measured values are printed.
constexpr double kFp8RelativeL2 = 0.25;
constexpr double kFp8Top1Margin = 0.15;

class CudaHfFixtureFp8Cache : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaHfFixtureFp8Cache, AgreesWithTheCpuBackend) {
  SF_REQUIRE_GPU();
  const std::string name = GetParam();
  const std::string dir = test::fixture_path("hf/" + name);
  std::unique_ptr<WeightSource> source = open_weights(dir);
  const ModelSpec spec = resolve_source_spec(*source, dir);
  const KvCacheConfig kv{16, 4, 0, DType::F8E4M3};
  const int64_t vocab = spec.vocab_size;

  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  ModelRunner cpu_runner(spec, bind_weights(spec, *source, DType::F32), *cpu, kv);
  std::vector<std::vector<float>> cpu_blocks;  // each block of logits rows, in the fixture's order
  test::run_hf_fixture(cpu_runner, name,
                       [&](const float* actual, const float*, int64_t rows, int32_t, const std::string&) {
                         cpu_blocks.emplace_back(actual, actual + rows * vocab);
                       });

  std::unique_ptr<Backend> backend = test::make_test_cuda_backend();
  ModelRunner runner(spec, bind_weights(spec, *source, dominant_matrix_dtype(*source)), *backend, kv);
  ASSERT_EQ(runner.kv_cache_dtype(), DType::F8E4M3);
  size_t block = 0;
  double diff_squares = 0, reference_squares = 0;
  int clear_rows = 0;
  test::run_hf_fixture(runner, name, [&](const float* actual, const float*, int64_t rows, int32_t,
                                         const std::string& what) {
    ASSERT_LT(block, cpu_blocks.size());
    const std::vector<float>& cpu_rows = cpu_blocks[block++];
    for (int64_t r = 0; r < rows; ++r) {
      const float* gpu = actual + r * vocab;
      const float* reference = cpu_rows.data() + r * vocab;
      double max_abs = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        diff_squares += (gpu[v] - reference[v]) * double{gpu[v] - reference[v]};
        reference_squares += reference[v] * double{reference[v]};
        max_abs = std::max(max_abs, std::abs(double{reference[v]}));
      }
      std::vector<float> sorted(reference, reference + vocab);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      if (sorted[0] - sorted[1] < kFp8Top1Margin * max_abs) continue;
      ++clear_rows;
      EXPECT_EQ(argmax(gpu, vocab), argmax(reference, vocab)) << what << " row " << r;
    }
  });
  const double relative_l2 = std::sqrt(diff_squares / reference_squares);
  EXPECT_LE(relative_l2, kFp8RelativeL2) << name << ": relative L2 of all logits against the CPU's";
  std::cout << "[cuda fixture] " << name << ", fp8 cache: relative L2 against the CPU backend's " << relative_l2 << ", "
            << clear_rows << " rows with a clear top-1\n";
}

INSTANTIATE_TEST_SUITE_P(Transformers, CudaHfFixtureFp8Cache, ::testing::ValuesIn(test::hf_fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
