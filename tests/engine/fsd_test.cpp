// FSD's anti-LM and choice against hand-computed n-gram counts and a brute-force reference that
// rescans the whole prefix at every step (the engine's table is incremental).
#include "core/error.h"
#include "engine/fsd.h"
#include "engine/sampler.h"
#include "sampling_reference.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

namespace splitflow {
namespace {

using test::ids_by_probability;
using test::softmax;

// The anti-LM rule of fsd.h, counting n-grams by scanning `prefix` directly.
double brute_force_anti_lm(const std::vector<int32_t>& prefix, int order, double beta, int32_t candidate) {
  if (prefix.size() < static_cast<size_t>(order - 1)) return 0.0;
  double remaining = 1.0, score = 0.0;
  for (int i = order - 1; i >= 0; --i) {
    const size_t n = prefix.size();
    int total = 0, count = 0;
    for (size_t position = static_cast<size_t>(i); position < n; ++position) {
      bool context_matches = true;
      for (int j = 1; j <= i; ++j) {
        if (prefix[position - static_cast<size_t>(j)] != prefix[n - static_cast<size_t>(j)]) context_matches = false;
      }
      if (!context_matches) continue;
      ++total;
      if (prefix[position] == candidate) ++count;
    }
    if (count == 0) continue;
    score += i > 0 ? remaining * beta * count / (total + 1.0) : remaining * count / total;
    remaining *= 1.0 - beta;
  }
  return score;
}

// Deterministic FSD over softmax(logits) with the brute-force anti-LM.
int32_t reference_fsd_choice(const std::vector<float>& logits, const std::vector<int32_t>& prefix, int top_k,
                             double alpha, int order, double beta) {
  const std::vector<double> p = softmax(logits);
  const std::vector<int32_t> order_by_p = ids_by_probability(p);
  int32_t best = -1;
  double best_score = -INFINITY;
  for (int j = 0; j < top_k && j < static_cast<int>(p.size()); ++j) {
    const int32_t id = order_by_p[static_cast<size_t>(j)];
    const double anti = brute_force_anti_lm(prefix, order, beta, id);
    const double score = (1.0 - alpha) * p[static_cast<size_t>(id)] - alpha * anti;
    if (score > best_score) {
      best_score = score;
      best = id;
    }
  }
  return best;
}

NgramAntiLm anti_lm_of(const std::vector<int32_t>& tokens, int order, float beta) {
  NgramAntiLm lm(order, beta);
  for (int32_t t : tokens) lm.append(t);
  return lm;
}

TEST(NgramAntiLm, HandComputedTrigramBackoff) {
  // Prefix 5 6 7 5 6 8 5 6, order 3, beta 0.9. Last context (5 6) was followed by {7, 8}
  // (T = 2); (6) by {7, 8} (T = 2); unigram counts {5: 3, 6: 3, 7: 1, 8: 1} of 8.
  //   P(7) = 0.9 * 1/3 + 0.1 * 0.9 * 1/3 + 0.01 * 1/8 = 0.33125, and P(8) likewise.
  //   P(5): no trigram or bigram match, so the unigram takes the whole mass: 3/8.
  //   P(9): never seen: 0. (beta is a float: 0.9f differs from 0.9 by 2.4e-8.)
  const NgramAntiLm lm = anti_lm_of({5, 6, 7, 5, 6, 8, 5, 6}, 3, 0.9f);
  EXPECT_NEAR(lm.probability(7), 0.33125, 1e-7);
  EXPECT_NEAR(lm.probability(8), 0.33125, 1e-7);
  EXPECT_NEAR(lm.probability(5), 0.375, 1e-12);
  EXPECT_NEAR(lm.probability(6), 0.375, 1e-12);
  EXPECT_EQ(lm.probability(9), 0.0);
}

TEST(NgramAntiLm, HandComputedBigram) {
  // Prefix 1 2 1 3 1, order 2, beta 0.5. Context (1) followed by {2, 3} (T = 2).
  //   P(2) = 0.5 * 1/3 + 0.5 * 1/5 = 0.26667; P(1): unigram only, 3/5.
  const NgramAntiLm lm = anti_lm_of({1, 2, 1, 3, 1}, 2, 0.5f);
  EXPECT_NEAR(lm.probability(2), 0.5 / 3.0 + 0.5 / 5.0, 1e-12);
  EXPECT_NEAR(lm.probability(3), 0.5 / 3.0 + 0.5 / 5.0, 1e-12);
  EXPECT_NEAR(lm.probability(1), 0.6, 1e-12);
}

TEST(NgramAntiLm, PrefixShorterThanTheContextGivesZero) {
  const NgramAntiLm lm = anti_lm_of({4}, 3, 0.9f);
  EXPECT_EQ(lm.probability(4), 0.0);
  const NgramAntiLm unigram = anti_lm_of({4, 4, 2}, 1, 0.9f);
  EXPECT_NEAR(unigram.probability(4), 2.0 / 3.0, 1e-12);
}

TEST(NgramAntiLm, IncrementalTableMatchesBruteForceAtEveryStep) {
  std::mt19937_64 gen(17);
  for (int order : {1, 2, 3, 4}) {
    for (float beta : {0.9f, 0.5f, 1.0f}) {
      NgramAntiLm lm(order, beta);
      std::vector<int32_t> prefix;
      for (int step = 0; step < 200; ++step) {
        const int32_t token = static_cast<int32_t>(gen() % 5);
        lm.append(token);
        prefix.push_back(token);
        for (int32_t candidate = 0; candidate < 6; ++candidate) {
          ASSERT_NEAR(lm.probability(candidate), brute_force_anti_lm(prefix, order, beta, candidate), 1e-12)
              << "order " << order << " beta " << beta << " step " << step << " candidate " << candidate;
        }
      }
      lm.clear();
      EXPECT_EQ(lm.num_tokens(), 0u);
      EXPECT_EQ(lm.probability(0), 0.0);
    }
  }
}

TEST(NgramAntiLm, InvalidOrderOrBeta) {
  EXPECT_THROW(NgramAntiLm(0, 0.9f), Error);
  EXPECT_THROW(NgramAntiLm(SamplingParams::kMaxFsdNgramOrder + 1, 0.9f), Error);
  EXPECT_THROW(NgramAntiLm(3, 0.0f), Error);
}

TEST(FsdSelect, PenaltyOverturnsTheMostProbableToken) {
  // P_LM = (0.05, 0.5, 0.3, 0.1, 0.05); the prefix repeats token 1 after 2, so with alpha 0.5 the
  // anti-LM pushes the choice from token 1 to token 2.
  const std::vector<float> logits = {std::log(0.05f), std::log(0.5f), std::log(0.3f), std::log(0.1f), std::log(0.05f)};
  const std::vector<int32_t> prefix = {2, 1, 2, 1, 2};
  const NgramAntiLm lm = anti_lm_of(prefix, 2, 0.9f);
  // P_anti(1) = 0.9 * 2/3 + 0.1 * 2/5 = 0.64; P_anti(2) = 3/5 (unigram only); P_anti(3) = 0.
  // Scores (alpha 0.5): token 1: 0.25 - 0.32 = -0.07; token 2: 0.15 - 0.3 = -0.15; token 3: 0.05.
  EXPECT_NEAR(lm.probability(1), 0.64, 1e-7);
  Candidates c;
  c.assign(logits);
  EXPECT_EQ(fsd_select(c, 3, 0.5f, lm), 3);
  EXPECT_EQ(reference_fsd_choice(logits, prefix, 3, 0.5, 2, 0.9), 3);
  // k = 2 keeps only tokens 1 and 2: token 1 wins (-0.07 > -0.15).
  c.assign(logits);
  EXPECT_EQ(fsd_select(c, 2, 0.5f, lm), 1);
  // alpha 0 is greedy.
  c.assign(logits);
  EXPECT_EQ(fsd_select(c, 3, 0.0f, lm), 1);
}

std::vector<float> fixed_logits(size_t vocab, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.5);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = static_cast<float>(normal(gen));
  return logits;
}

TEST(FsdSampler, DeterministicSequenceMatchesReference) {
  const std::vector<float> logits = fixed_logits(20, 4);
  const std::vector<int32_t> prompt = {1, 2, 3, 1, 2};
  SamplingParams params;
  params.fsd = FsdMode::Deterministic;
  params.fsd_alpha = 0.6f;
  params.fsd_top_k = 4;
  params.fsd_ngram_order = 3;
  Sampler sampler(params, 20);
  std::vector<int32_t> generated;
  std::set<int32_t> distinct;
  for (int step = 0; step < 40; ++step) {
    std::vector<int32_t> prefix = prompt;
    prefix.insert(prefix.end(), generated.begin(), generated.end());
    const int32_t expected = reference_fsd_choice(logits, prefix, 4, 0.6, 3, 0.9);
    const int32_t token = sampler.sample(logits, prompt, generated).token_id;
    ASSERT_EQ(token, expected) << "step " << step;
    generated.push_back(token);
    distinct.insert(token);
  }
  // With the same logits at every step greedy would repeat one token; FSD rotates.
  EXPECT_GT(distinct.size(), 1u);
}

TEST(FsdSampler, TemperatureZeroUsesUnitTemperatureAndTemperatureScalesPlm) {
  const std::vector<float> logits = fixed_logits(12, 6);
  const std::vector<int32_t> prompt = {3, 4, 3, 4, 3};
  for (float temperature : {0.0f, 0.5f, 2.0f}) {
    SamplingParams params;
    params.temperature = temperature;
    params.fsd = FsdMode::Deterministic;
    params.fsd_alpha = 0.7f;
    Sampler sampler(params, 12);
    std::vector<float> scaled = logits;
    for (float& l : scaled) l /= temperature == 0.0f ? 1.0f : temperature;
    EXPECT_EQ(sampler.sample(logits, prompt, {}).token_id, reference_fsd_choice(scaled, prompt, 6, 0.7, 3, 0.9))
        << "temperature " << temperature;
  }
}

TEST(FsdSampler, HistoryChangeRebuildsTheTable) {
  const std::vector<float> logits = fixed_logits(10, 8);
  SamplingParams params;
  params.fsd = FsdMode::Deterministic;
  params.fsd_alpha = 0.8f;
  Sampler reused(params, 10);
  reused.sample(logits, std::vector<int32_t>{1, 2, 1, 2}, {});
  Sampler fresh(params, 10);
  const std::vector<int32_t> other_prompt = {7, 7, 7, 5};
  EXPECT_EQ(reused.sample(logits, other_prompt, {}).token_id, fresh.sample(logits, other_prompt, {}).token_id);
  EXPECT_EQ(reused.sample(logits, other_prompt, {}).token_id,
            reference_fsd_choice(logits, other_prompt, 6, 0.8, 3, 0.9));
}

TEST(RandomizedFsd, ProbabilityZeroIsDeterministicFsd) {
  const std::vector<float> logits = fixed_logits(16, 9);
  SamplingParams params;
  params.fsd = FsdMode::Randomized;
  params.fsd_random_probability = 0.0f;
  params.seed = 3;
  Sampler sampler(params, 16);
  std::vector<int32_t> prompt = {0, 1}, generated;
  for (int step = 0; step < 20; ++step) {
    std::vector<int32_t> prefix = prompt;
    prefix.insert(prefix.end(), generated.begin(), generated.end());
    const int32_t token = sampler.sample(logits, prompt, generated).token_id;
    ASSERT_EQ(token, reference_fsd_choice(logits, prefix, 6, 0.5, 3, 0.9)) << step;
    generated.push_back(token);
  }
}

TEST(RandomizedFsd, SamplesInTheFirstStepsThenFollowsFsd) {
  const std::vector<float> logits = fixed_logits(8, 10);
  SamplingParams params;
  params.fsd = FsdMode::Randomized;
  params.fsd_random_probability = 1.0f;
  params.fsd_random_steps = 20000;
  params.seed = 11;
  Sampler sampler(params, 8);
  const std::vector<int32_t> prompt = {0};
  std::vector<int32_t> generated;
  std::map<int32_t, int64_t> counts;
  for (int step = 0; step < 20000; ++step) {
    const int32_t token = sampler.sample(logits, prompt, generated).token_id;
    ++counts[token];
    generated.push_back(token);
  }
  // Every one of the first steps is drawn from softmax(logits).
  test::expect_chi_square_fits(counts, softmax(logits), 20000);
  // Past fsd_random_steps, every token is the FSD choice.
  for (int step = 0; step < 30; ++step) {
    std::vector<int32_t> prefix = prompt;
    prefix.insert(prefix.end(), generated.begin(), generated.end());
    const int32_t token = sampler.sample(logits, prompt, generated).token_id;
    ASSERT_EQ(token, reference_fsd_choice(logits, prefix, 6, 0.5, 3, 0.9)) << step;
    generated.push_back(token);
  }
}

TEST(RandomizedFsd, MixesBothInTheFirstSteps) {
  // fsd_top_k = 1 makes FSD pick the argmax (token 0, p = 1.1/30.1 = 0.037 under the flat logits
  // below); a sampled step picks another token with probability 0.963. With probability 0.5 of
  // sampling, about 0.48 * 200 = 96 of the first 200 steps differ from token 0 (always-FSD: 0,
  // always-sample: about 193); none of the later steps do.
  std::vector<float> logits(30, 0.0f);
  logits[0] = std::log(1.1f);
  SamplingParams params;
  params.fsd = FsdMode::Randomized;
  params.fsd_top_k = 1;
  params.fsd_random_steps = 200;
  params.seed = 13;
  Sampler sampler(params, 30);
  const std::vector<int32_t> prompt = {0, 1, 2};
  std::vector<int32_t> generated;
  int differing = 0;
  for (int step = 0; step < 200; ++step) {
    const int32_t token = sampler.sample(logits, prompt, generated).token_id;
    if (token != 0) ++differing;
    generated.push_back(token);
  }
  EXPECT_GT(differing, 66);
  EXPECT_LT(differing, 126);
  for (int step = 0; step < 50; ++step) {
    const int32_t token = sampler.sample(logits, prompt, generated).token_id;
    ASSERT_EQ(token, 0) << step;
    generated.push_back(token);
  }
}

}  // namespace
}  // namespace splitflow
