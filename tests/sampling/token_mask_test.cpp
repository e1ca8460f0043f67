// sampling/token_mask.h and the CPU backend's apply_token_mask against the mask's definition
// (bit t % 32 of word t / 32 set: token t allowed) on random masks, whole words of either kind,
// and a vocabulary that ends mid-word.
#include "sampling/token_mask.h"

#include "backend/backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace splitflow {
namespace {

std::vector<uint32_t> random_mask(std::mt19937& rng, int64_t vocab) {
  std::vector<uint32_t> words(static_cast<size_t>((vocab + 31) / 32));
  for (size_t w = 0; w < words.size(); ++w) {
    // Whole words allowed, whole words refused, and mixed ones.
    words[w] = w % 5 == 0 ? 0xffffffffu : w % 5 == 1 ? 0u : static_cast<uint32_t>(rng());
  }
  return words;
}

void expect_masked(const std::vector<float>& got, const std::vector<float>& before, const uint32_t* allowed,
                   int64_t count) {
  for (int64_t t = 0; t < count; ++t) {
    const bool ok = (allowed[t / 32] >> (t % 32)) & 1u;
    if (ok) {
      ASSERT_EQ(got[t], before[t]) << "token " << t << " is allowed";
    } else {
      ASSERT_TRUE(std::isinf(got[t]) && got[t] < 0) << "token " << t << " is not allowed";
    }
  }
}

TEST(TokenMask, RowMatchesTheDefinition) {
  std::mt19937 rng(3);
  for (int64_t vocab : {1, 31, 32, 33, 100, 49157}) {
    const std::vector<uint32_t> mask = random_mask(rng, vocab);
    std::vector<float> logits(static_cast<size_t>(vocab));
    for (float& v : logits) v = static_cast<float>(rng() % 1000) / 100.0f;
    const std::vector<float> before = logits;
    mask_logits_row(logits.data(), mask.data(), vocab);
    expect_masked(logits, before, mask.data(), vocab);
  }
}

TEST(TokenMask, CpuBackendMasksEveryRow) {
  std::mt19937 rng(5);
  const int64_t rows = 3, vocab = 1000, words = (vocab + 31) / 32;
  std::vector<uint32_t> mask;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<uint32_t> row = random_mask(rng, vocab);
    mask.insert(mask.end(), row.begin(), row.end());
  }
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  for (float& v : logits) v = static_cast<float>(rng() % 1000) / 100.0f;
  const std::vector<float> before = logits;
  auto backend = make_cpu_backend(2);
  backend->apply_token_mask({logits.data(), DType::F32, {rows, vocab}}, {mask.data(), DType::I32, {rows, words}});
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> got(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
    const std::vector<float> was(before.begin() + r * vocab, before.begin() + (r + 1) * vocab);
    expect_masked(got, was, mask.data() + r * words, vocab);
  }
}

}  // namespace
}  // namespace splitflow
