// eval/perplexity: llama.cpp's chunking and scoring, checked on logits whose softmax is known in
// closed form (uniform rows: PPL = vocab; two-level rows: -log p worked out here in fp64).
#include "eval/perplexity.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

namespace splitflow {
namespace {

Tensor constant_logits(int64_t rows, int64_t vocab, float value) {
  Tensor logits = Tensor::zeros(DType::F32, {rows, vocab});
  std::fill_n(logits.as<float>(), logits.numel(), value);
  return logits;
}

TEST(Perplexity, UniformLogitsGiveTheVocabularySize) {
  std::vector<int32_t> tokens(100);
  std::iota(tokens.begin(), tokens.end(), 0);
  for (int32_t& t : tokens) t %= 7;
  int calls = 0;
  const PerplexityResult result = perplexity(tokens, {16, -1, -1}, [&](std::span<const int32_t> chunk) {
    ++calls;
    EXPECT_EQ(chunk.size(), 16u);
    return constant_logits(16, 7, 3.5f);
  });
  EXPECT_EQ(calls, 6);  // 100 / 16, the partial last chunk dropped
  EXPECT_EQ(result.chunks, 6);
  EXPECT_EQ(result.scored_tokens, 6 * 7);  // positions 8 .. 14 of each chunk
  EXPECT_EQ(result.evaluated_tokens, 96);
  EXPECT_NEAR(result.ppl, 7.0, 1e-12);
  EXPECT_NEAR(result.ppl_stderr, 0.0, 1e-6);  // every NLL equal: zero up to the cancellation in E[x^2] - E[x]^2
}

TEST(Perplexity, ScoresTheSecondHalfAgainstTheTextTokens) {
  // Vocabulary 4; row j gives logit L_j = 2 (1 + j % 3) to token (j % 4) and 0 to the rest, so the
  // next token t has p = e^L_j / (e^L_j + 3) when t == j % 4, else 1 / (e^L_j + 3).
  const int64_t n_ctx = 8, vocab = 4;
  const float big = 2.0f;
  std::vector<int32_t> tokens = {1, 2, 3, 0, 1, 2, 3, 0, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2};
  PerplexityOptions options{static_cast<int32_t>(n_ctx), -1, 3};
  std::vector<std::vector<int32_t>> seen;
  const PerplexityResult result = perplexity(tokens, options, [&](std::span<const int32_t> chunk) {
    seen.emplace_back(chunk.begin(), chunk.end());
    Tensor logits = constant_logits(n_ctx, vocab, 0.0f);
    for (int64_t j = 0; j < n_ctx; ++j) logits.as<float>()[j * vocab + j % vocab] = big * float(1 + j % 3);
    return logits;
  });
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0][0], 3);  // BOS replaces each chunk's first token
  EXPECT_EQ(seen[1][0], 3);
  EXPECT_EQ(seen[1][1], 0);
  double nll = 0, nll2 = 0;
  int count = 0;
  for (int c = 0; c < 2; ++c)
    for (int j = 4; j < 7; ++j) {
      const int next = tokens[static_cast<size_t>(c * n_ctx + j + 1)];
      const double logit = double(big) * (1 + j % 3), denominator = std::exp(logit) + 3.0;
      const double p = next == j % vocab ? std::exp(logit) / denominator : 1.0 / denominator;
      nll += -std::log(p);
      nll2 += std::log(p) * std::log(p);
      ++count;
    }
  EXPECT_EQ(result.scored_tokens, count);
  const double mean = nll / count, ppl = std::exp(mean);
  EXPECT_NEAR(result.ppl, ppl, 1e-12 * ppl);
  const double stderr_expected = ppl * std::sqrt((nll2 / count - mean * mean) / (count - 1));
  EXPECT_GT(stderr_expected, 0.01);
  EXPECT_NEAR(result.ppl_stderr, stderr_expected, 1e-9 * ppl);
  ASSERT_EQ(result.per_chunk.size(), 2u);
  EXPECT_NEAR(result.per_chunk[1].running_ppl, ppl, 1e-12 * ppl);
}

TEST(Perplexity, RefusesShortTextsAndBadLogits) {
  std::vector<int32_t> tokens(31, 1);
  const auto uniform = [](std::span<const int32_t> chunk) { return constant_logits(int64_t(chunk.size()), 4, 0.0f); };
  try {
    perplexity(tokens, {16, -1, -1}, uniform);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("31 tokens"), std::string::npos) << error.what();
  }
  tokens.resize(32);
  EXPECT_THROW(perplexity(tokens, {16, -1, -1}, [](std::span<const int32_t>) { return constant_logits(15, 4, 0); }),
               Error);
  tokens.assign(32, 9);  // outside a 4-entry vocabulary
  EXPECT_THROW(perplexity(tokens, {16, -1, -1}, uniform), Error);
  EXPECT_THROW(perplexity(tokens, {2, -1, -1}, uniform), Error);
}

}  // namespace
}  // namespace splitflow
