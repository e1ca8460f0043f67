// The CUDA backend's sample() against the host rule (sampling/host_rule.h sample_by_rule, what the
// CPU backend and the engine's host Sampler draw with) on the same logits, seeds and steps: the
// same token for every row. Rows cover the parameter grid (temperature, top-k, top-p, min-p) over
// vocabularies of 1 to 151936 tokens (odd sizes included), with ties at the top and at the
// filters' boundaries, masked (-inf) tokens, signed zeros, and values on a coarse grid. Skips
// without a GPU.
#include "cuda_test_util.h"

#include "sampling/host_rule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

namespace splitflow {
namespace {

using test::random_values;

std::vector<SamplingRow> parameter_grid() {
  std::vector<SamplingRow> grid;
  for (const float temperature : {0.0f, 0.5f, 1.0f, 1.7f})
    for (const int32_t top_k : {0, 1, 40, 1000})
      for (const float top_p : {1.0f, 0.95f, 0.5f})
        for (const float min_p : {0.0f, 0.05f}) grid.push_back({temperature, top_k, top_p, min_p});
  return grid;
}

// Row r's values: one of several shapes, so that ties and special values meet every filter.
void fill_row(float* row, int64_t vocab, int64_t r, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, r % 2 ? 1.0f : 3.0f);
  for (int64_t i = 0; i < vocab; ++i) row[i] = normal(rng);
  std::uniform_int_distribution<int64_t> at(0, vocab - 1);
  switch (r % 6) {
    case 0: break;
    case 1:  // a peaked row
      row[at(rng)] = 14.0f;
      break;
    case 2:  // values on a grid of 1/4: ties everywhere, at every boundary
      for (int64_t i = 0; i < vocab; ++i) row[i] = std::round(row[i] * 4.0f) / 4.0f;
      break;
    case 3:  // half the vocabulary masked, the top tied three ways
      for (int64_t i = 0; i < vocab / 2; ++i) row[i] = -std::numeric_limits<float>::infinity();
      row[vocab - 1] = row[vocab / 2 + (vocab - 1) / 4] = row[(3 * vocab) / 4] = 9.0f;
      break;
    case 4:  // signed zeros among small values
      for (int64_t i = 0; i < vocab; ++i) row[i] = i % 3 == 0 ? (i % 2 ? -0.0f : 0.0f) : row[i] * 0.01f;
      break;
    case 5:  // a flat row: every top-p boundary falls among equal values
      for (int64_t i = 0; i < vocab; ++i) row[i] = i % 7 == 0 ? 1.0f : 0.5f;
      break;
  }
}

class CudaSamplingRule : public ::testing::Test {
 protected:
  void SetUp() override {
    SF_REQUIRE_GPU();
    backend = test::make_test_cuda_backend();
  }
  std::unique_ptr<Backend> backend;
};

TEST_F(CudaSamplingRule, SampleMatchesTheHostRuleTokenForToken) {
  const std::vector<SamplingRow> grid = parameter_grid();
  std::mt19937_64 rng(29006);
  for (const int64_t vocab : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{32000}, int64_t{32003}, int64_t{128256},
                              int64_t{151936}}) {
    const int64_t rows_per_setting = vocab >= 100000 ? 2 : 6;
    const int64_t count = static_cast<int64_t>(grid.size()) * rows_per_setting;
    std::vector<float> logits(static_cast<size_t>(count * vocab));
    std::vector<SamplingRow> rows(static_cast<size_t>(count));
    for (int64_t r = 0; r < count; ++r) {
      fill_row(logits.data() + r * vocab, vocab, r, rng);
      rows[r] = grid[static_cast<size_t>(r / rows_per_setting)];
      rows[r].seed = 0x5eed0000u + static_cast<uint64_t>(r);
      rows[r].step = static_cast<uint64_t>(r * 7);
    }
    std::vector<int32_t> expected(static_cast<size_t>(count)), got(static_cast<size_t>(count));
    RuleScratch scratch;
    for (int64_t r = 0; r < count; ++r) {
      expected[r] = sample_by_rule(std::span<const float>(logits.data() + r * vocab, static_cast<size_t>(vocab)), rows[r],
                                   scratch);
    }
    DeviceBuffer l = backend->allocate(DType::F32, {count, vocab});
    backend->copy_to_device(logits.data(), l.view());
    DeviceBuffer p = backend->allocate(DType::I32, {count, kSamplingRowWords});
    backend->copy_to_device(rows.data(), p.view());
    DeviceBuffer t = backend->allocate(DType::I32, {count});
    backend->sample(l.view(), p.view(), t.view());
    backend->copy_to_host(t.view(), got.data());
    int mismatches = 0;
    for (int64_t r = 0; r < count; ++r) {
      if (got[r] == expected[r]) continue;
      ++mismatches;
      const SamplingRow& s = rows[r];
      ADD_FAILURE() << "vocab " << vocab << " row " << r << " (shape " << r % 6 << ", temperature " << s.temperature
                    << ", top_k " << s.top_k << ", top_p " << s.top_p << ", min_p " << s.min_p << "): device "
                    << got[r] << ", host " << expected[r];
      if (mismatches > 10) break;
    }
    std::printf("  vocab %6lld: %lld rows, %d differ\n", static_cast<long long>(vocab), static_cast<long long>(count),
                mismatches);
  }
}

// Many steps of one realistic row per setting: the streams of tokens a sequence would draw.
TEST_F(CudaSamplingRule, StepsOfOneSeedMatchTheHostRule) {
  const int64_t vocab = 32000, steps = 256;
  std::mt19937_64 rng(7);
  const std::vector<float> base = random_values(rng, static_cast<size_t>(vocab), -6.0f, 6.0f);
  for (const SamplingRow& setting : {SamplingRow{0.7f}, SamplingRow{1.0f, 40, 0.95f}, SamplingRow{0.9f, 0, 0.9f, 0.05f}}) {
    std::vector<float> logits(static_cast<size_t>(steps * vocab));
    std::vector<SamplingRow> rows(static_cast<size_t>(steps), setting);
    for (int64_t s = 0; s < steps; ++s) {
      std::copy(base.begin(), base.end(), logits.begin() + s * vocab);
      rows[s].seed = 1234;
      rows[s].step = static_cast<uint64_t>(s);
    }
    std::vector<int32_t> expected(static_cast<size_t>(steps)), got(static_cast<size_t>(steps));
    RuleScratch scratch;
    for (int64_t s = 0; s < steps; ++s)
      expected[s] = sample_by_rule(std::span<const float>(base.data(), base.size()), rows[s], scratch);
    DeviceBuffer l = backend->allocate(DType::F32, {steps, vocab});
    backend->copy_to_device(logits.data(), l.view());
    DeviceBuffer p = backend->allocate(DType::I32, {steps, kSamplingRowWords});
    backend->copy_to_device(rows.data(), p.view());
    DeviceBuffer t = backend->allocate(DType::I32, {steps});
    backend->sample(l.view(), p.view(), t.view());
    backend->copy_to_host(t.view(), got.data());
    EXPECT_EQ(got, expected) << "temperature " << setting.temperature << " top_k " << setting.top_k;
  }
}

}  // namespace
}  // namespace splitflow
