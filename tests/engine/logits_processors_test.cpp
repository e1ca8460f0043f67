// Each processor against its published definition, computed here in double precision.
#include "core/error.h"
#include "engine/logits_processors.h"
#include "sampling_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace splitflow {
namespace {

using test::ids_by_probability;
using test::random_logits;
using test::restrict_to;
using test::softmax;

std::set<int32_t> kept_ids(const Candidates& c) {
  std::set<int32_t> ids;
  for (const TokenLogit& t : c.items) ids.insert(t.id);
  return ids;
}

std::vector<float> logits_of(const std::vector<double>& probabilities) {
  std::vector<float> logits;
  for (double p : probabilities) logits.push_back(p > 0.0 ? static_cast<float>(std::log(p)) : -INFINITY);
  return logits;
}

// ---- references -------------------------------------------------------------------------------

std::set<int32_t> reference_top_p(const std::vector<double>& p, double top_p) {
  std::set<int32_t> kept;
  double cumulative = 0.0;
  for (int32_t id : ids_by_probability(p)) {
    kept.insert(id);
    cumulative += p[static_cast<size_t>(id)];
    if (cumulative >= top_p) break;
  }
  return kept;
}

std::set<int32_t> reference_min_p(const std::vector<double>& p, double min_p) {
  const double p_max = *std::max_element(p.begin(), p.end());
  std::set<int32_t> kept;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] >= min_p * p_max) kept.insert(static_cast<int32_t>(i));
  }
  return kept;
}

std::set<int32_t> reference_typical(const std::vector<double>& p, double mass) {
  double entropy = 0.0;
  for (double x : p) {
    if (x > 0.0) entropy -= x * std::log(x);
  }
  std::vector<int32_t> ids(p.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto distance = [&](int32_t id) { return std::abs(-std::log(p[static_cast<size_t>(id)]) - entropy); };
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return distance(a) < distance(b); });
  std::set<int32_t> kept;
  double cumulative = 0.0;
  for (int32_t id : ids) {
    kept.insert(id);
    cumulative += p[static_cast<size_t>(id)];
    if (cumulative >= mass) break;
  }
  return kept;
}

std::set<int32_t> reference_tail_free(const std::vector<double>& p, double z) {
  const std::vector<int32_t> order = ids_by_probability(p);
  std::vector<double> sorted;
  for (int32_t id : order) sorted.push_back(p[static_cast<size_t>(id)]);
  std::vector<double> first(sorted.size() - 1);
  for (size_t i = 0; i + 1 < sorted.size(); ++i) first[i] = sorted[i + 1] - sorted[i];
  std::vector<double> second(first.size() - 1);
  double total = 0.0;
  for (size_t i = 0; i + 1 < first.size(); ++i) total += second[i] = std::abs(first[i + 1] - first[i]);
  size_t keep = sorted.size();
  double cdf = 0.0;
  for (size_t i = 0; i < second.size(); ++i) {
    cdf += second[i] / total;
    if (cdf > z) {
      keep = i + 1;
      break;
    }
  }
  return std::set<int32_t>(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep));
}

// Mirostat v1 (Basu et al. 2021, Algorithm 1).
int32_t reference_mirostat_k(const std::vector<double>& p, double mu, double vocab_size) {
  std::vector<double> sorted;
  for (int32_t id : ids_by_probability(p)) sorted.push_back(p[static_cast<size_t>(id)]);
  const size_t m = std::min<size_t>(100, sorted.size());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i + 1 < m; ++i) {
    const double t = std::log((i + 2.0) / (i + 1.0));
    const double b = std::log(sorted[i] / sorted[i + 1]);
    num += t * b;
    den += t * t;
  }
  const double s = num / den;
  const double eps = s - 1.0;
  const double k = std::pow(eps * std::pow(2.0, mu) / (1.0 - std::pow(vocab_size, -eps)), 1.0 / s);
  return static_cast<int32_t>(std::clamp(std::round(k), 1.0, static_cast<double>(p.size())));
}

// ---- penalties and temperature ----------------------------------------------------------------

TEST(Penalties, RepetitionDividesPositiveAndMultipliesNegativeOncePerDistinctToken) {
  std::vector<float> logits = {2.0f, -2.0f, 0.5f, 1.0f, 0.0f, -0.5f};
  TokenCounts seen;
  for (int32_t id : {0, 1, 0, 3, 4, 0}) seen.add(id);
  apply_repetition_penalty(logits, seen, 1.5f);
  EXPECT_FLOAT_EQ(logits[0], 2.0f / 1.5f);  // seen three times, penalized once
  EXPECT_FLOAT_EQ(logits[1], -2.0f * 1.5f);
  EXPECT_FLOAT_EQ(logits[2], 0.5f);
  EXPECT_FLOAT_EQ(logits[3], 1.0f / 1.5f);
  EXPECT_FLOAT_EQ(logits[4], 0.0f);
  EXPECT_FLOAT_EQ(logits[5], -0.5f);
}

TEST(Penalties, RepetitionBelowOneFavoursSeenTokens) {
  std::vector<float> logits = {1.0f, -1.0f};
  TokenCounts seen;
  seen.add(0);
  seen.add(1);
  apply_repetition_penalty(logits, seen, 0.5f);
  EXPECT_FLOAT_EQ(logits[0], 2.0f);
  EXPECT_FLOAT_EQ(logits[1], -0.5f);
}

TEST(Penalties, FrequencyAndPresenceFollowOpenAiDefinition) {
  std::vector<float> logits = {1.0f, 1.0f, 1.0f, 1.0f};
  TokenCounts generated;
  for (int32_t id : {2, 0, 2, 2}) generated.add(id);
  apply_frequency_presence_penalties(logits, generated, 0.5f, 0.25f);
  EXPECT_FLOAT_EQ(logits[0], 1.0f - 1 * 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(logits[1], 1.0f);
  EXPECT_FLOAT_EQ(logits[2], 1.0f - 3 * 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(logits[3], 1.0f);
  // Negative values reward repetition.
  std::vector<float> rewarded = {0.0f, 0.0f, 0.0f};
  apply_frequency_presence_penalties(rewarded, generated, -1.0f, -2.0f);
  EXPECT_FLOAT_EQ(rewarded[2], 3.0f + 2.0f);
}

TEST(Penalties, TokenOutsideTheVocabularyIsAnError) {
  std::vector<float> logits = {0.0f, 0.0f};
  TokenCounts counts;
  counts.add(7);
  EXPECT_THROW(apply_repetition_penalty(logits, counts, 1.2f), Error);
  EXPECT_THROW(apply_frequency_presence_penalties(logits, counts, 0.5f, 0.0f), Error);
}

TEST(Temperature, ScalesLogitsAndMatchesTemperedSoftmax) {
  std::vector<float> logits = {1.0f, 2.0f, -3.0f};
  const std::vector<float> original = logits;
  apply_temperature(logits, 0.5f);
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_FLOAT_EQ(logits[i], original[i] / 0.5f);
  EXPECT_THROW(apply_temperature(logits, 0.0f), Error);
}

TEST(Greedy, ArgmaxTakesTheLowestIdAmongTies) {
  EXPECT_EQ(argmax_token(std::vector<float>{0.0f, 3.0f, -1.0f, 3.0f}), 1);
  EXPECT_EQ(argmax_token(std::vector<float>{-INFINITY, -5.0f}), 1);
}

// ---- truncation filters -----------------------------------------------------------------------

TEST(Candidates, SortTopExtendsThePrefixIncrementally) {
  const std::vector<float> logits = random_logits(1000, 11, 2.0);
  Candidates c;
  c.assign(logits);
  c.sort_top(10);
  c.sort_top(300);
  const std::vector<int32_t> expected = ids_by_probability(softmax(logits));
  for (size_t i = 0; i < 300; ++i) ASSERT_EQ(c.items[i].id, expected[i]) << i;
  EXPECT_EQ(c.sorted_size, 300u);
}

TEST(TopK, KeepsTheKMostProbableWithTiesToTheLowerId) {
  Candidates c;
  c.assign(std::vector<float>{1.0f, 3.0f, 2.0f, 3.0f, 2.0f});
  top_k_filter(c, 3);
  EXPECT_EQ(kept_ids(c), (std::set<int32_t>{1, 3, 2}));
  c.assign(std::vector<float>{1.0f, 2.0f});
  top_k_filter(c, 5);
  EXPECT_EQ(c.size(), 2u);
  top_k_filter(c, 0);
  EXPECT_EQ(c.size(), 2u);
}

TEST(TopP, KeepsSmallestSetReachingTheMassOnRandomDistributions) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> logits = random_logits(200, seed, 2.0);
    const std::vector<double> p = softmax(logits);
    for (double top_p : {0.1, 0.5, 0.9, 0.99}) {
      Candidates c;
      c.assign(logits);
      top_p_filter(c, static_cast<float>(top_p));
      EXPECT_EQ(kept_ids(c), reference_top_p(p, static_cast<float>(top_p))) << "seed " << seed << " p " << top_p;
    }
  }
}

TEST(TopP, LargeFlatVocabularyGrowsTheSortedPrefix) {
  // Thousands of tokens in the nucleus: the filter must sort well past its first prefix.
  const std::vector<float> logits = random_logits(20000, 3, 0.5);
  const std::vector<double> p = softmax(logits);
  Candidates c;
  c.assign(logits);
  top_p_filter(c, 0.95f);
  const std::set<int32_t> expected = reference_top_p(p, 0.95f);
  EXPECT_GT(expected.size(), 5000u);
  EXPECT_EQ(kept_ids(c), expected);
}

TEST(TopP, BoundaryExactMassAndTies) {
  // Uniform over 4: mass 0.5 is reached exactly by two tokens; ties keep the lower ids.
  Candidates c;
  c.assign(std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f});
  top_p_filter(c, 0.5f);
  EXPECT_EQ(kept_ids(c), (std::set<int32_t>{0, 1}));
  c.assign(std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f});
  top_p_filter(c, 0.5001f);
  EXPECT_EQ(kept_ids(c), (std::set<int32_t>{0, 1, 2}));
  // Just below and just above the mass of the top two tokens.
  const std::vector<float> logits = logits_of({0.1, 0.6, 0.25, 0.05});
  const std::vector<double> p = softmax(logits);
  const double top_two = p[1] + p[2];
  c.assign(logits);
  top_p_filter(c, static_cast<float>(top_two - 1e-4));
  EXPECT_EQ(kept_ids(c), (std::set<int32_t>{1, 2}));
  c.assign(logits);
  top_p_filter(c, static_cast<float>(top_two + 1e-4));
  EXPECT_EQ(kept_ids(c), (std::set<int32_t>{0, 1, 2}));
  // A tiny p keeps the single most probable token; p = 1 keeps everything.
  c.assign(logits);
  top_p_filter(c, 1e-6f);
  EXPECT_EQ(kept_ids(c), (std::set<int32_t>{1}));
  c.assign(logits);
  top_p_filter(c, 1.0f);
  EXPECT_EQ(c.size(), 4u);
}

TEST(TopP, AfterTopKWorksOnTheRenormalizedRemainder) {
  const std::vector<float> logits = random_logits(100, 5, 1.5);
  const std::vector<double> p = softmax(logits);
  const std::vector<int32_t> order = ids_by_probability(p);
  const std::set<int32_t> top5(order.begin(), order.begin() + 5);
  const std::vector<double> q = restrict_to(p, top5);
  Candidates c;
  c.assign(logits);
  top_k_filter(c, 5);
  top_p_filter(c, 0.7f);
  EXPECT_EQ(kept_ids(c), reference_top_p(q, 0.7f));
}

TEST(MinP, KeepsTokensAtLeastMinPTimesTheMax) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> logits = random_logits(300, 100 + seed, 2.0);
    const std::vector<double> p = softmax(logits);
    for (double min_p : {0.01, 0.1, 0.5}) {
      Candidates c;
      c.assign(logits);
      c.sort_top(7);  // the filter must keep a sorted prefix sorted
      min_p_filter(c, static_cast<float>(min_p));
      EXPECT_EQ(kept_ids(c), reference_min_p(p, min_p)) << "seed " << seed;
      for (size_t i = 0; i + 1 < c.sorted_size; ++i) EXPECT_GE(c.items[i].logit, c.items[i + 1].logit);
    }
  }
}

TEST(MinP, BoundaryTiesWithTheMaxAreKept) {
  Candidates c;
  c.assign(logits_of({0.4, 0.4, 0.2}));
  min_p_filter(c, 1.0f);
  EXPECT_EQ(kept_ids(c), (std::set<int32_t>{0, 1}));
  c.assign(logits_of({0.4, 0.4, 0.2}));
  min_p_filter(c, 0.49f);
  EXPECT_EQ(kept_ids(c), (std::set<int32_t>{0, 1, 2}));
  c.assign(logits_of({0.4, 0.4, 0.2}));
  min_p_filter(c, 0.51f);
  EXPECT_EQ(kept_ids(c), (std::set<int32_t>{0, 1}));
}

TEST(Typical, KeepsTokensClosestToTheEntropyUntilTheMass) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> logits = random_logits(200, 200 + seed, 2.0);
    const std::vector<double> p = softmax(logits);
    for (double mass : {0.2, 0.5, 0.9}) {
      Candidates c;
      c.assign(logits);
      typical_filter(c, static_cast<float>(mass));
      EXPECT_EQ(kept_ids(c), reference_typical(p, static_cast<float>(mass))) << "seed " << seed << " mass " << mass;
    }
  }
}

TEST(Typical, HandBuiltDistributionDropsTheMostProbableToken) {
  // p = (0.7, 0.1, 0.1, 0.1): H = 0.9404 nats; -ln p = (0.357, 2.303, 2.303, 2.303), distances
  // to H (0.584, 1.362, 1.362, 1.362): the 0.7 token comes first, then the 0.1 tokens by id.
  Candidates c;
  c.assign(logits_of({0.7, 0.1, 0.1, 0.1}));
  typical_filter(c, 0.75f);
  EXPECT_EQ(kept_ids(c), (std::set<int32_t>{0, 1}));
  // p = (0.4, 0.3, 0.3): H = 1.0889; distances 0.173, 0.115, 0.115: the 0.3 tokens come first,
  // so mass 0.55 keeps them and drops the most probable token.
  c.assign(logits_of({0.4, 0.3, 0.3}));
  typical_filter(c, 0.55f);
  EXPECT_EQ(kept_ids(c), (std::set<int32_t>{1, 2}));
  EXPECT_EQ(c.sorted_size, 0u);
}

TEST(Typical, LargeVocabularyMatchesReference) {
  const std::vector<float> logits = random_logits(20000, 9, 0.7);
  Candidates c;
  c.assign(logits);
  typical_filter(c, 0.9f);
  EXPECT_EQ(kept_ids(c), reference_typical(softmax(logits), 0.9f));
}

TEST(TailFree, CutsWhereTheNormalizedSecondDerivativeMassExceedsZ) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> logits = random_logits(150, 300 + seed, 2.0);
    const std::vector<double> p = softmax(logits);
    for (double z : {0.25, 0.5, 0.95}) {
      Candidates c;
      c.assign(logits);
      tail_free_filter(c, static_cast<float>(z));
      EXPECT_EQ(kept_ids(c), reference_tail_free(p, z)) << "seed " << seed << " z " << z;
    }
  }
}

TEST(TailFree, HandBuiltDistribution) {
  // Sorted p = (0.5, 0.25, 0.125, 0.0625, 0.0625): first differences (-0.25, -0.125, -0.0625, 0),
  // |second| = (0.125, 0.0625, 0.0625), normalized (0.5, 0.25, 0.25), cdf (0.5, 0.75, 1.0).
  // z = 0.6: first cdf > z at i = 1 -> keep tokens 0..1. z = 0.4: i = 0 -> keep the top token.
  const std::vector<float> logits = logits_of({0.125, 0.5, 0.0625, 0.25, 0.0625});
  Candidates c;
  c.assign(logits);
  tail_free_filter(c, 0.6f);
  EXPECT_EQ(kept_ids(c), (std::set<int32_t>{1, 3}));
  c.assign(logits);
  tail_free_filter(c, 0.4f);
  EXPECT_EQ(kept_ids(c), (std::set<int32_t>{1}));
  c.assign(logits);
  tail_free_filter(c, 0.8f);
  EXPECT_EQ(kept_ids(c), (std::set<int32_t>{1, 3, 0}));
}

TEST(TailFree, FlatDistributionIsKept) {
  Candidates c;
  c.assign(std::vector<float>{1.0f, 1.0f, 1.0f, 1.0f});
  tail_free_filter(c, 0.5f);
  EXPECT_EQ(c.size(), 4u);
}

// ---- draws --------------------------------------------------------------------------------

TEST(Categorical, EmpiricalFrequenciesMatchTheSoftmax) {
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 0.0f, -INFINITY, 1.0f};
  Candidates c;
  c.assign(logits);
  Rng rng(1234);
  std::map<int32_t, int64_t> counts;
  const int64_t draws = 40000;
  for (int64_t i = 0; i < draws; ++i) ++counts[sample_categorical(c, rng)];
  test::expect_chi_square_fits(counts, softmax(logits), draws);
}

TEST(Categorical, FilteredDistributionFrequencies) {
  const std::vector<float> logits = random_logits(50, 77, 1.0);
  const std::vector<double> p = softmax(logits);
  const std::vector<double> expected = restrict_to(p, reference_top_p(p, 0.6));
  Candidates c;
  c.assign(logits);
  top_p_filter(c, 0.6f);
  Rng rng(99);
  std::map<int32_t, int64_t> counts;
  const int64_t draws = 40000;
  for (int64_t i = 0; i < draws; ++i) ++counts[sample_categorical(c, rng)];
  test::expect_chi_square_fits(counts, expected, draws);
}

TEST(Categorical, EmptyCandidatesIsAnError) {
  Candidates c;
  c.assign(std::vector<float>{});
  Rng rng(1);
  EXPECT_THROW(sample_categorical(c, rng), Error);
}

std::vector<float> zipf_logits(size_t n, double exponent) {
  std::vector<double> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = std::pow(static_cast<double>(i + 1), -exponent);
  // Shuffle ids so sorting matters.
  std::vector<float> logits(n);
  std::mt19937_64 gen(5);
  std::vector<size_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), gen);
  for (size_t i = 0; i < n; ++i) logits[perm[i]] = static_cast<float>(std::log(p[i]));
  return logits;
}

TEST(MirostatV1, TopKFollowsTheZipfEstimate) {
  const std::vector<float> zipf = zipf_logits(1000, 1.2);
  const std::vector<float> noisy = random_logits(1000, 42, 2.5);
  for (const auto* logits : {&zipf, &noisy}) {
    const std::vector<double> p = softmax(*logits);
    for (double mu : {2.0, 5.0, 8.0, 10.0}) {
      Candidates c;
      c.assign(*logits);
      EXPECT_EQ(mirostat_v1_top_k(c, mu, 32000), reference_mirostat_k(p, mu, 32000.0)) << "mu " << mu;
    }
  }
}

TEST(MirostatV1, MuUpdateUsesTheSurpriseOfTheDrawnToken) {
  const std::vector<float> logits = zipf_logits(500, 1.1);
  const std::vector<double> p = softmax(logits);
  const float tau = 3.0f, eta = 0.1f;
  float mu = 2.0f * tau;
  Rng rng(7);
  for (int step = 0; step < 50; ++step) {
    const int32_t k = reference_mirostat_k(p, mu, 500.0);
    const std::vector<int32_t> order = ids_by_probability(p);
    const std::set<int32_t> allowed(order.begin(), order.begin() + k);
    Candidates c;
    c.assign(logits);
    const double mu_before = mu;
    const int32_t token = mirostat_v1_sample(c, tau, eta, 500, mu, rng);
    EXPECT_TRUE(allowed.count(token)) << "token " << token << " outside the top " << k;
    const double surprise = -std::log2(p[static_cast<size_t>(token)]);
    EXPECT_NEAR(mu, mu_before - eta * (surprise - tau), 1e-5);
  }
}

TEST(MirostatV2, TruncatesBySurpriseAndUpdatesMu) {
  const std::vector<float> logits = random_logits(200, 21, 2.0);
  const std::vector<double> p = softmax(logits);
  const float tau = 4.0f, eta = 0.2f;
  float mu = 2.0f * tau;
  Rng rng(8);
  for (int step = 0; step < 100; ++step) {
    Candidates c;
    c.assign(logits);
    const double mu_before = mu;
    const int32_t token = mirostat_v2_sample(c, tau, eta, mu, rng);
    const double surprise = -std::log2(p[static_cast<size_t>(token)]);
    const bool is_top = token == ids_by_probability(p)[0];
    EXPECT_TRUE(surprise <= mu_before || is_top) << "surprise " << surprise << " > mu " << mu_before;
    EXPECT_NEAR(mu, mu_before - eta * (surprise - tau), 1e-5);
  }
}

TEST(MirostatV2, FrequenciesMatchTheAllowedSetAndTinyMuKeepsTheTop) {
  const std::vector<float> logits = random_logits(40, 31, 1.5);
  const std::vector<double> p = softmax(logits);
  const float mu_fixed = 4.0f;
  std::set<int32_t> allowed;
  for (size_t i = 0; i < p.size(); ++i) {
    if (-std::log2(p[i]) <= mu_fixed) allowed.insert(static_cast<int32_t>(i));
  }
  ASSERT_GT(allowed.size(), 2u);
  Rng rng(10);
  std::map<int32_t, int64_t> counts;
  const int64_t draws = 30000;
  for (int64_t i = 0; i < draws; ++i) {
    Candidates c;
    c.assign(logits);
    float mu = mu_fixed;
    ++counts[mirostat_v2_sample(c, 5.0f, 0.1f, mu, rng)];
  }
  test::expect_chi_square_fits(counts, restrict_to(p, allowed), draws);

  Candidates c;
  c.assign(logits);
  float mu = 0.0f;  // no token has surprise <= 0: the most probable one is kept
  EXPECT_EQ(mirostat_v2_sample(c, 5.0f, 0.1f, mu, rng), ids_by_probability(p)[0]);
}

}  // namespace
}  // namespace splitflow
