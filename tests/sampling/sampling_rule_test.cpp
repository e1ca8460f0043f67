// The sampling rule on the host (sampling/host_rule.h) against references written here: its exp
// and log against the C library in double, the kept set of every filter against the rule's
// definition computed in double (sort, thresholds), and the draws against the exact renormalized
// distribution by a chi-square test. The rule's steps compose to sample_by_rule, and its one-pass
// path (no top-k, no top-p) draws what the candidate path draws.
#include "sampling/host_rule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

namespace splitflow {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// |got - want| in units of the float spacing at want.
double ulps(float got, double want) {
  const double spacing = std::nextafter(static_cast<float>(std::abs(want)), kInf) - static_cast<float>(std::abs(want));
  return std::abs(static_cast<double>(got) - want) / spacing;
}

TEST(RuleMath, ExpWithinTwoUlpsAndZeroBelowTheCutoff) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> any(-87.0f, 88.0f), near_zero(-1.0f, 1.0f);
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = i % 2 ? any(rng) : near_zero(rng);
    if (!(x > -87.0f)) continue;
    worst = std::max(worst, ulps(rule_expf(x), std::exp(static_cast<double>(x))));
  }
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(rule_expf(0.0f), 1.0f);
  EXPECT_EQ(rule_expf(-87.0f), 0.0f);
  EXPECT_EQ(rule_expf(-kInf), 0.0f);
  EXPECT_EQ(rule_expf(89.0f), kInf);
}

TEST(RuleMath, LogWithinTwoUlpsOverEveryExponent) {
  std::mt19937_64 rng(2);
  std::uniform_int_distribution<uint32_t> bits(1, 0x7f7fffffu);  // every positive finite float
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = rule_bits_float(bits(rng));
    const double want = std::log(static_cast<double>(x));
    if (want == 0.0) continue;
    worst = std::max(worst, ulps(rule_logf(x), want));
  }
  // Around x = 1, where ln x is tiny (relative error is what counts there too).
  std::uniform_real_distribution<float> near_one(0.7f, 1.42f);
  for (int i = 0; i < 200000; ++i) {
    const float x = near_one(rng);
    if (x == 1.0f) continue;
    worst = std::max(worst, ulps(rule_logf(x), std::log(static_cast<double>(x))));
  }
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(rule_logf(1.0f), 0.0f);
  EXPECT_EQ(rule_logf(0.0f), -kInf);
  EXPECT_EQ(rule_logf(kInf), kInf);
  EXPECT_TRUE(std::isnan(rule_logf(-1.0f)));
}

TEST(RuleMath, GumbelNoiseIsStandardGumbel) {
  // Mean = Euler-Mascheroni 0.5772, variance pi^2 / 6, over many indexes of one key.
  double sum = 0, sum2 = 0;
  const int n = 400000;
  for (int i = 0; i < n; ++i) {
    const double g = gumbel_noise(12345u, static_cast<uint32_t>(i));
    sum += g;
    sum2 += g * g;
  }
  const double mean = sum / n, variance = sum2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.5772156649, 0.01);
  EXPECT_NEAR(variance, M_PI * M_PI / 6, 0.02);
}

// The extreme uniforms the hash can give are strictly inside (0, 1), so the noise is finite and
// within may_win_draw's bounds (-3, 17.5). A regression: with 24 bits, the top hash gave u = 1.0
// and +inf noise, so one token in 2^24 won whatever its probability (0.8% of the draws over a
// 128k vocabulary without top-k or top-p).
TEST(RuleMath, NoiseIsFiniteAtTheHashExtremes) {
  uint32_t top_key = 0, bottom_key = 0;
  bool top = false, bottom = false;
  for (uint32_t key = 0; !(top && bottom) && key < (1u << 30); ++key) {
    const uint32_t bits = hash32(key ^ hash32(0)) >> 9;
    if (bits == 0x7fffffu && !top) top_key = key, top = true;
    if (bits == 0 && !bottom) bottom_key = key, bottom = true;
  }
  ASSERT_TRUE(top && bottom);
  EXPECT_LT(unit_uniform(top_key, 0), 1.0f);
  EXPECT_GT(unit_uniform(bottom_key, 0), 0.0f);
  const float highest = gumbel_noise(top_key, 0), lowest = gumbel_noise(bottom_key, 0);
  EXPECT_LT(highest, 17.5f);
  EXPECT_GT(lowest, -3.0f);
  EXPECT_NEAR(highest, 16.635, 1e-2);
  EXPECT_NEAR(lowest, -2.8116, 1e-3);
}

// ---- The kept set and the distribution, computed independently in double ---------------------

// The probabilities the rule draws from (0 for tokens it drops), from its definition: z = logit /
// temperature; top-k keeps z >= the k-th largest; top-p keeps z when the mass of the kept tokens
// strictly above z is < top_p times the kept mass; min-p keeps p >= min_p * p_max. All in double,
// except z itself, which is the float the rule compares.
std::vector<double> reference_distribution(const std::vector<float>& logits, const SamplingRow& row,
                                           double* top_p_margin = nullptr) {
  const size_t n = logits.size();
  std::vector<double> z(n);
  for (size_t i = 0; i < n; ++i) z[i] = static_cast<double>(logits[i] * (1.0f / row.temperature));
  std::vector<bool> kept(n, true);
  std::vector<double> sorted(z);
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  if (row.top_k > 0 && static_cast<size_t>(row.top_k) < n) {
    for (size_t i = 0; i < n; ++i) kept[i] = z[i] >= sorted[static_cast<size_t>(row.top_k) - 1];
  }
  const double z_max = sorted[0];
  if (row.top_p < 1.0f) {
    double total = 0;
    for (size_t i = 0; i < n; ++i)
      if (kept[i]) total += std::exp(z[i] - z_max);
    std::vector<bool> kept_p(kept);
    double margin = kInf;
    for (size_t i = 0; i < n; ++i) {
      if (!kept[i]) continue;
      double above = 0;
      for (size_t j = 0; j < n; ++j)
        if (kept[j] && z[j] > z[i]) above += std::exp(z[j] - z_max);
      kept_p[i] = above < row.top_p * total;
      margin = std::min(margin, std::abs(above - row.top_p * total) / total);
    }
    kept = kept_p;
    if (top_p_margin) *top_p_margin = margin;
  }
  if (row.min_p > 0.0f) {
    for (size_t i = 0; i < n; ++i) kept[i] = kept[i] && std::exp(z[i] - z_max) >= row.min_p;
  }
  std::vector<double> prob(n, 0.0);
  double sum = 0;
  for (size_t i = 0; i < n; ++i)
    if (kept[i]) sum += prob[i] = std::exp(z[i] - z_max);
  for (double& p : prob) p /= sum;
  return prob;
}

std::vector<float> random_logits(size_t vocab, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> logits(vocab);
  for (float& v : logits) v = dist(rng);
  return logits;
}

// Draws steps 0..draws-1 of one row and checks every token is kept and the counts pass a
// chi-square test at p ~ 0.001 against the reference distribution.
void check_distribution(const std::vector<float>& logits, SamplingRow row, int draws) {
  const std::vector<double> prob = reference_distribution(logits, row);
  std::vector<int> counts(logits.size(), 0);
  RuleScratch scratch;
  for (int s = 0; s < draws; ++s) {
    row.step = static_cast<uint64_t>(s);
    const int32_t token = sample_by_rule(logits, row, scratch);
    ASSERT_GE(token, 0);
    ASSERT_GT(prob.at(static_cast<size_t>(token)), 0.0) << "token " << token << " is outside the kept set";
    ++counts[static_cast<size_t>(token)];
  }
  double chi2 = 0, pooled_expected = 0, pooled_observed = 0;
  int cells = 0;
  for (size_t i = 0; i < prob.size(); ++i) {
    const double expected = prob[i] * draws;
    if (prob[i] == 0.0) continue;
    if (expected < 5) {  // tokens expected fewer than 5 times share one cell
      pooled_expected += expected;
      pooled_observed += counts[i];
      continue;
    }
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++cells;
  }
  if (pooled_expected > 0) {
    chi2 += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++cells;
  }
  const double dof = std::max(1, cells - 1);
  // Wilson-Hilferty: (chi2 / dof)^(1/3) ~ N(1 - 2 / (9 dof), 2 / (9 dof)); z = 3.1 is p ~ 0.001.
  const double mean = 1 - 2 / (9 * dof), sd = std::sqrt(2 / (9 * dof));
  EXPECT_LT(chi2, dof * std::pow(mean + 3.1 * sd, 3)) << "chi-square " << chi2 << " over " << cells << " cells";
}

TEST(RuleDistribution, TemperatureAlone) { check_distribution(random_logits(12, 1, 1.0f), {0.7f}, 40000); }
TEST(RuleDistribution, TopK) { check_distribution(random_logits(16, 2, 1.5f), {1.0f, 5}, 40000); }
TEST(RuleDistribution, TopP) { check_distribution(random_logits(16, 3, 2.0f), {1.0f, 0, 0.6f}, 40000); }
TEST(RuleDistribution, MinP) { check_distribution(random_logits(16, 4, 2.0f), {1.3f, 0, 1.0f, 0.1f}, 40000); }
TEST(RuleDistribution, AllFilters) { check_distribution(random_logits(24, 5, 2.0f), {0.9f, 12, 0.8f, 0.05f}, 40000); }
TEST(RuleDistribution, HighTemperatureOverAWiderVocabulary) {
  check_distribution(random_logits(200, 6, 1.0f), {1.7f, 0, 0.95f}, 50000);
}

TEST(RuleDistribution, TiesAreKeptTogether) {
  // Four tokens tie at the top-k boundary and at the top-p boundary: all of them are kept.
  const std::vector<float> logits = {3.0f, 1.0f, 1.0f, 1.0f, 1.0f, -1.0f, -2.0f, 0.5f};
  check_distribution(logits, {1.0f, 2}, 30000);  // k = 2: z >= 1 keeps tokens 0..4
  const std::vector<double> prob = reference_distribution(logits, {1.0f, 2});
  EXPECT_GT(prob[4], 0.0);
  EXPECT_EQ(prob[7], 0.0);
  check_distribution(logits, {1.0f, 0, 0.75f}, 30000);
}

// ---- Exact kept sets ----------------------------------------------------------------------------

std::set<int32_t> kept_by_steps(const std::vector<float>& logits, const SamplingRow& row) {
  std::vector<TokenLogit> candidates;
  rule_top_k(logits, inverse_temperature(row.temperature), row.top_k, candidates);
  rule_top_p(candidates, row.top_p);
  rule_min_p(candidates, row.min_p);
  std::set<int32_t> ids;
  for (const TokenLogit& c : candidates) ids.insert(c.id);
  return ids;
}

TEST(RuleSteps, KeptSetsEqualTheDefinitionOnManyRows) {
  const std::vector<SamplingRow> settings = {{1.0f, 40}, {0.8f, 0, 0.9f},   {1.2f, 0, 1.0f, 0.05f},
                                             {0.7f, 50, 0.8f, 0.02f}, {1.0f, 1}, {1.0f, 0, 0.01f},
                                             {2.0f, 3, 0.5f}, {1.0f, 200, 0.99f, 0.001f}};
  int checked = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    std::vector<float> logits = random_logits(500, 100 + seed, seed % 2 ? 1.0f : 3.0f);
    if (seed % 5 == 0) logits[seed] = logits[seed + 1] = logits[seed + 2] = 6.0f;  // ties at the top
    if (seed % 7 == 0) std::fill(logits.begin() + 100, logits.begin() + 200, -kInf);  // masked tokens
    for (const SamplingRow& row : settings) {
      double margin = kInf;
      const std::vector<double> prob = reference_distribution(logits, row, &margin);
      if (row.top_p < 1.0f && margin < 1e-6) continue;  // the float weights may fall either side
      std::set<int32_t> want;
      for (size_t i = 0; i < prob.size(); ++i)
        if (prob[i] > 0) want.insert(static_cast<int32_t>(i));
      EXPECT_EQ(kept_by_steps(logits, row), want) << "seed " << seed << " top_k " << row.top_k << " top_p " << row.top_p;
      ++checked;
    }
  }
  EXPECT_GT(checked, 300);
}

TEST(RuleSteps, ComposeToSampleByRule) {
  RuleScratch scratch;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> logits = random_logits(1000, seed, 2.0f);
    for (const SamplingRow& base : {SamplingRow{0.9f}, SamplingRow{1.1f, 0, 1.0f, 0.02f}, SamplingRow{0.8f, 30, 0.9f}}) {
      for (uint64_t step = 0; step < 20; ++step) {
        SamplingRow row = base;
        row.seed = seed;
        row.step = step;
        std::vector<TokenLogit> candidates;
        rule_top_k(logits, inverse_temperature(row.temperature), row.top_k, candidates);
        rule_top_p(candidates, row.top_p);
        rule_min_p(candidates, row.min_p);
        EXPECT_EQ(sample_by_rule(logits, row, scratch), rule_draw(candidates, sampling_noise_key(seed, step)));
      }
    }
  }
}

// The draw skips tokens may_win_draw rules out: the same token as scoring every kept token, on rows
// spread wide enough that most tokens are skipped.
TEST(RuleSteps, SkippingHopelessTokensChangesNoDraw) {
  RuleScratch scratch;
  int skipped_rows = 0;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    const std::vector<float> logits = random_logits(3000, 50 + seed, 4.0f + static_cast<float>(seed));
    for (const SamplingRow& base : {SamplingRow{1.0f}, SamplingRow{0.7f, 0, 1.0f, 1e-9f}, SamplingRow{1.5f, 500, 0.999f}}) {
      for (uint64_t step = 0; step < 10; ++step) {
        SamplingRow row = base;
        row.seed = seed;
        row.step = step;
        std::vector<TokenLogit> kept;
        rule_top_k(logits, inverse_temperature(row.temperature), row.top_k, kept);
        rule_top_p(kept, row.top_p);
        rule_min_p(kept, row.min_p);
        const float z_max = std::max_element(kept.begin(), kept.end(), [](auto a, auto b) { return a.logit < b.logit; })->logit;
        int32_t want = -1;
        float best = -kInf;
        int hopeless = 0;
        for (const TokenLogit& c : kept) {
          hopeless += !may_win_draw(c.logit, z_max);
          const float score = draw_score(c.logit, sampling_noise_key(seed, step), static_cast<uint32_t>(c.id));
          if (score > best || (score == best && c.id < want)) {
            best = score;
            want = c.id;
          }
        }
        skipped_rows += hopeless > 0;
        EXPECT_EQ(sample_by_rule(logits, row, scratch), want);
      }
    }
  }
  EXPECT_GT(skipped_rows, 100);
}

TEST(RuleSteps, GreedyIsTheFirstArgmaxAndSeedsSelectTheNoise) {
  std::vector<float> logits = random_logits(300, 9, 2.0f);
  logits[17] = logits[200] = 40.0f;
  RuleScratch scratch;
  EXPECT_EQ(sample_by_rule(logits, SamplingRow{}, scratch), 17);
  std::vector<int32_t> a, b, c;
  const std::vector<float> flat = random_logits(300, 10, 0.5f);
  for (uint64_t step = 0; step < 40; ++step) {
    a.push_back(sample_by_rule(flat, {1.0f, 0, 1.0f, 0.0f, 42, step}, scratch));
    b.push_back(sample_by_rule(flat, {1.0f, 0, 1.0f, 0.0f, 42, step}, scratch));
    c.push_back(sample_by_rule(flat, {1.0f, 0, 1.0f, 0.0f, 43, step}, scratch));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // A row of -inf but one token: that token.
  std::vector<float> masked(50, -kInf);
  masked[33] = 0.0f;
  for (uint64_t step = 0; step < 10; ++step) EXPECT_EQ(sample_by_rule(masked, {1.0f, 0, 0.9f, 0.0f, 1, step}, scratch), 33);
}

}  // namespace
}  // namespace splitflow
