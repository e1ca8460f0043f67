// tests/engine/sampling_reference.h — double-precision reference definitions the sampling tests
// compare against, written from the published definitions and independent of src/engine.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

namespace splitflow::test {

inline std::vector<double> softmax(const std::vector<float>& logits) {
  double max_logit = -INFINITY;
  for (float l : logits) max_logit = std::max(max_logit, static_cast<double>(l));
  std::vector<double> p(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) total += p[i] = std::exp(static_cast<double>(logits[i]) - max_logit);
  for (double& x : p) x /= total;
  return p;
}

// Token ids by probability descending, ties by lower id.
// Normal(0, stddev) logits, seeded.
inline std::vector<float> random_logits(size_t n, uint64_t seed, double stddev) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, stddev);
  std::vector<float> logits(n);
  for (float& l : logits) l = static_cast<float>(normal(gen));
  return logits;
}

inline std::vector<int32_t> ids_by_probability(const std::vector<double>& p) {
  std::vector<int32_t> ids(p.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)]; });
  return ids;
}

// Probabilities restricted to `kept` and renormalized (0 elsewhere).
inline std::vector<double> restrict_to(const std::vector<double>& p, const std::set<int32_t>& kept) {
  std::vector<double> q(p.size(), 0.0);
  double total = 0.0;
  for (int32_t id : kept) total += p[static_cast<size_t>(id)];
  for (int32_t id : kept) q[static_cast<size_t>(id)] = p[static_cast<size_t>(id)] / total;
  return q;
}

// Pearson chi-square of observed counts against probabilities `expected` (summing to 1) over
// num_draws draws; tokens with expected probability 0 must never be drawn. Fails the test when
// the statistic exceeds the 0.05 % critical value (Wilson-Hilferty approximation).
inline void expect_chi_square_fits(const std::map<int32_t, int64_t>& observed, const std::vector<double>& expected,
                                   int64_t num_draws) {
  double statistic = 0.0;
  int degrees = -1;
  for (size_t id = 0; id < expected.size(); ++id) {
    auto it = observed.find(static_cast<int32_t>(id));
    const double count = it == observed.end() ? 0.0 : static_cast<double>(it->second);
    if (expected[id] == 0.0) {
      EXPECT_EQ(count, 0.0) << "token " << id << " has probability 0 but was drawn";
      continue;
    }
    const double e = expected[id] * static_cast<double>(num_draws);
    statistic += (count - e) * (count - e) / e;
    ++degrees;
  }
  for (const auto& [id, count] : observed) {
    EXPECT_LT(static_cast<size_t>(id), expected.size()) << "drawn token " << id << " outside the vocabulary";
  }
  if (degrees <= 0) return;
  const double k = degrees;
  const double z = 3.29;
  const double critical = k * std::pow(1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k)), 3.0);
  EXPECT_LT(statistic, critical) << "chi-square " << statistic << " with " << degrees << " degrees of freedom";
}

}  // namespace splitflow::test
