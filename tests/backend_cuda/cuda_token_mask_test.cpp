// CudaBackend::apply_token_mask against the CPU backend's (and the definition: a clear bit is
// -inf, a set bit leaves the logit as it was), over a vocabulary that is not a multiple of 32;
// then masked sampling through both backends draws only allowed tokens.
#include "cuda_test_util.h"

#include <cmath>
#include <random>

namespace splitflow::test {
namespace {

TEST(CudaTokenMask, MatchesTheDefinitionAndTheCpuBackend) {
  SF_REQUIRE_GPU();
  auto gpu = make_test_cuda_backend();
  auto cpu = make_cpu_backend(1);
  constexpr int64_t kRows = 5, kVocab = 49159, kWords = (kVocab + 31) / 32;
  std::mt19937_64 rng(7);
  std::vector<float> logits = random_values(rng, kRows * kVocab, -5.0f, 5.0f);
  std::vector<uint32_t> mask(kRows * kWords);
  for (size_t i = 0; i < mask.size(); ++i) {
    const uint64_t r = rng();
    mask[i] = i % 7 == 0 ? ~0u : i % 5 == 0 ? 0u : static_cast<uint32_t>(r);  // all, none and mixed words
  }
  DeviceBuffer d_logits = gpu->allocate(DType::F32, {kRows, kVocab});
  DeviceBuffer d_mask = gpu->allocate(DType::I32, {kRows, kWords});
  gpu->copy_to_device(logits.data(), d_logits.view());
  gpu->copy_to_device(mask.data(), d_mask.view());
  gpu->apply_token_mask(d_logits.view(), d_mask.view());
  std::vector<float> from_gpu(logits.size());
  gpu->copy_to_host(d_logits.view(), from_gpu.data());

  std::vector<float> from_cpu = logits;
  cpu->apply_token_mask(DeviceTensor{from_cpu.data(), DType::F32, {kRows, kVocab}},
                        DeviceTensor{mask.data(), DType::I32, {kRows, kWords}});
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t t = 0; t < kVocab; ++t) {
      const size_t i = static_cast<size_t>(r * kVocab + t);
      const bool allowed = (mask[r * kWords + t / 32] >> (t % 32)) & 1u;
      if (allowed) {
        ASSERT_EQ(from_gpu[i], logits[i]) << r << "," << t;
      } else {
        ASSERT_TRUE(std::isinf(from_gpu[i]) && from_gpu[i] < 0) << r << "," << t;
      }
      ASSERT_EQ(from_gpu[i], from_cpu[i]);
    }
  }

  // Greedy draws after the mask: the best allowed token on both backends.
  std::vector<SamplingRow> rows(kRows);
  DeviceBuffer d_rows = gpu->allocate(DType::I32, {kRows, kSamplingRowWords});
  DeviceBuffer d_tokens = gpu->allocate(DType::I32, {kRows});
  gpu->copy_to_device(rows.data(), d_rows.view());
  gpu->sample(d_logits.view(), d_rows.view(), d_tokens.view());
  std::vector<int32_t> tokens(kRows);
  gpu->copy_to_host(d_tokens.view(), tokens.data());
  for (int64_t r = 0; r < kRows; ++r) {
    int64_t best = -1;
    for (int64_t t = 0; t < kVocab; ++t) {
      const bool allowed = (mask[r * kWords + t / 32] >> (t % 32)) & 1u;
      if (allowed && (best < 0 || logits[r * kVocab + t] > logits[r * kVocab + best])) best = t;
    }
    EXPECT_EQ(tokens[r], best) << "row " << r;
  }
}

}  // namespace
}  // namespace splitflow::test
