// The engine's fp32 forward pass against HF transformers on tiny random-weight checkpoints of
// every architecture template (tests/fixtures/hf, made by python/make_hf_fixtures.py): the
// logits of every prefill position and of 8 cached decode steps within 1e-3 * max|logit|, and
// the same greedy tokens. Each fixture runs with matrices in f32 and in the checkpoint's dtype.
#include "backend/backend.h"
#include "engine/model_loader.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/model_runner.h"
#include "hf_fixture_runner.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

using namespace splitflow;

namespace {

int32_t argmax(const float* row, int64_t count) { return static_cast<int32_t>(std::max_element(row, row + count) - row); }

// Compares `actual` [rows, vocab] with `expected`; returns the worst |diff| / max|expected| per row.
void expect_logits_close(const float* actual, const float* expected, int64_t rows, int64_t vocab,
                         const std::string& what) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = actual + r * vocab;
    const float* e = expected + r * vocab;
    double max_abs = 0, max_diff = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      max_abs = std::max(max_abs, std::abs(static_cast<double>(e[v])));
      max_diff = std::max(max_diff, std::abs(static_cast<double>(a[v]) - e[v]));
    }
    EXPECT_LE(max_diff, 1e-3 * max_abs) << what << " row " << r << ": max |diff| " << max_diff << ", max |logit| " << max_abs;
  }
}

class HfFixture : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(HfFixture, MatchesTransformersLogitsAndGreedyTokens) {
  const auto& [name, keep_stored_dtype] = GetParam();
  const std::string dir = test::fixture_path("hf/" + name);
  std::unique_ptr<WeightSource> source = open_weights(dir);
  const ModelSpec spec = resolve_source_spec(*source, dir);
  const DType dtype = keep_stored_dtype ? dominant_matrix_dtype(*source) : DType::F32;

  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  const KvCacheConfig kv{16, 4};  // small blocks so every prompt spans several, in shuffled order
  ModelRunner runner(spec, bind_weights(spec, *source, dtype), *backend, kv);
  const int64_t vocab = spec.vocab_size;
  test::run_hf_fixture(runner, name, [&](const float* actual, const float* expected, int64_t rows, int32_t next_token,
                                         const std::string& what) {
    expect_logits_close(actual, expected, rows, vocab, what);
    if (next_token >= 0) {
      EXPECT_EQ(argmax(actual + (rows - 1) * vocab, vocab), next_token) << what << ": greedy token";
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Transformers, HfFixture, ::testing::Combine(::testing::ValuesIn(test::hf_fixture_names()), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_stored_dtype" : "_f32");
                         });

}  // namespace
