// Backend::sample on the CPU backend against the sampling rule computed independently here, the
// way transformers' warpers define it (temperature, TopK: remove scores < the k-th largest; TopP:
// sort ascending, remove tokens whose cumulative probability <= 1 - top_p; MinP: remove
// probabilities < min_p * the largest), in double precision: the kept set must match, and the
// draws over many steps must follow the renormalized probabilities (chi-square).
#include "backend/backend.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

using namespace splitflow;

namespace {

// The probabilities transformers' warpers leave (0 for removed tokens), in double.
std::vector<double> reference_distribution(const std::vector<float>& logits, const SamplingRow& p) {
  const size_t n = logits.size();
  std::vector<double> z(n);
  for (size_t i = 0; i < n; ++i) z[i] = static_cast<double>(logits[i] * (1.0f / p.temperature));
  std::vector<bool> removed(n, false);
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
    std::vector<double> sorted(z);
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    for (size_t i = 0; i < n; ++i) removed[i] = z[i] < sorted[p.top_k - 1];
  }
  const auto softmax = [&] {
    double top = -INFINITY, sum = 0;
    for (size_t i = 0; i < n; ++i)
      if (!removed[i]) top = std::max(top, z[i]);
    std::vector<double> prob(n, 0.0);
    for (size_t i = 0; i < n; ++i)
      if (!removed[i]) sum += prob[i] = std::exp(z[i] - top);
    for (double& v : prob) v /= sum;
    return prob;
  };
  if (p.top_p < 1.0f) {
    const std::vector<double> prob = softmax();
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return z[a] < z[b]; });
    double cumulative = 0;
    std::vector<bool> remove_p(n, false);
    for (size_t i = 0; i < n; ++i) {
      cumulative += prob[order[i]];
      remove_p[order[i]] = cumulative <= 1.0 - p.top_p;
    }
    remove_p[order[n - 1]] = false;  // min_tokens_to_keep = 1
    for (size_t i = 0; i < n; ++i) removed[i] = removed[i] || remove_p[i];
  }
  if (p.min_p > 0.0f) {
    const std::vector<double> prob = softmax();
    const double top = *std::max_element(prob.begin(), prob.end());
    for (size_t i = 0; i < n; ++i) removed[i] = removed[i] || prob[i] < p.min_p * top;
  }
  return softmax();
}

class CpuSampling : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend(2);

  // Samples `draws` tokens from one logits row with steps 0..draws-1 (one call, draws rows).
  std::vector<int32_t> draw(const std::vector<float>& logits, SamplingRow params, int draws) {
    const int64_t vocab = static_cast<int64_t>(logits.size());
    DeviceBuffer d_logits = backend->allocate(DType::F32, {draws, vocab});
    DeviceBuffer d_rows = backend->allocate(DType::I32, {draws, kSamplingRowWords});
    DeviceBuffer d_tokens = backend->allocate(DType::I32, {draws});
    std::vector<SamplingRow> rows(draws, params);
    for (int i = 0; i < draws; ++i) {
      rows[i].step = static_cast<uint64_t>(i);
      backend->copy_to_device(logits.data(), d_logits.view().rows(i, 1));
    }
    backend->copy_to_device(rows.data(), d_rows.view());
    backend->sample(d_logits.view(), d_rows.view(), d_tokens.view());
    std::vector<int32_t> tokens(draws);
    backend->copy_to_host(d_tokens.view(), tokens.data());
    return tokens;
  }

  // Every draw is a kept token, and the counts pass a chi-square test at p ~ 0.001.
  void check_distribution(const std::vector<float>& logits, const SamplingRow& params, int draws) {
    const std::vector<double> prob = reference_distribution(logits, params);
    std::vector<int> counts(logits.size(), 0);
    for (int32_t token : draw(logits, params, draws)) {
      ASSERT_GT(prob.at(token), 0.0) << "token " << token << " is outside the kept set";
      ++counts[token];
    }
    // Pool tokens with expected count < 5 into one cell.
    double chi2 = 0, pooled_expected = 0, pooled_observed = 0;
    int cells = 0;
    for (size_t i = 0; i < prob.size(); ++i) {
      const double expected = prob[i] * draws;
      if (prob[i] == 0.0) continue;
      if (expected < 5) {
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
    // Wilson-Hilferty: chi2/dof ~ N(1 - 2/(9 dof), 2/(9 dof)); z = 3.1 is p ~ 0.001.
    const double mean = 1 - 2 / (9 * dof), sd = std::sqrt(2 / (9 * dof));
    const double limit = dof * std::pow(mean + 3.1 * sd, 3);
    EXPECT_LT(chi2, limit) << "chi-square " << chi2 << " over " << cells << " cells";
  }
};

std::vector<float> random_logits(int64_t vocab, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> logits(vocab);
  for (float& v : logits) v = dist(rng);
  return logits;
}

TEST_F(CpuSampling, GreedyIsArgmaxWithFirstIndexOnTies) {
  std::vector<float> logits = random_logits(500, 1, 2.0f);
  logits[17] = logits[300] = 50.0f;
  SamplingRow greedy;
  for (int32_t token : draw(logits, greedy, 3)) EXPECT_EQ(token, 17);
  SamplingRow top1{1.0f, 1};
  for (int32_t token : draw(logits, top1, 20)) EXPECT_TRUE(token == 17 || token == 300);
}

TEST_F(CpuSampling, TemperatureAloneFollowsSoftmax) { check_distribution(random_logits(64, 2, 1.0f), {0.7f}, 20000); }
TEST_F(CpuSampling, TopKKeepsTheKLargest) { check_distribution(random_logits(64, 3, 1.5f), {1.0f, 5}, 20000); }
TEST_F(CpuSampling, TopPKeepsTheSmallestHeadReachingP) {
  check_distribution(random_logits(64, 4, 2.0f), {1.0f, 0, 0.6f}, 20000);
}
TEST_F(CpuSampling, MinPDropsTheTail) { check_distribution(random_logits(64, 5, 2.0f), {1.3f, 0, 1.0f, 0.1f}, 20000); }
TEST_F(CpuSampling, AllFiltersTogether) { check_distribution(random_logits(80, 6, 2.0f), {0.9f, 20, 0.8f, 0.05f}, 20000); }

TEST_F(CpuSampling, SameSeedAndStepGiveTheSameToken) {
  const std::vector<float> logits = random_logits(1000, 7, 1.0f);
  SamplingRow params{1.0f, 0, 1.0f, 0.0f, 42};
  EXPECT_EQ(draw(logits, params, 50), draw(logits, params, 50));
  SamplingRow other = params;
  other.seed = 43;
  EXPECT_NE(draw(logits, params, 50), draw(logits, other, 50));
}

TEST_F(CpuSampling, RejectsMismatchedShapes) {
  DeviceBuffer logits = backend->allocate(DType::F32, {2, 10});
  DeviceBuffer rows = backend->allocate(DType::I32, {3, kSamplingRowWords});
  DeviceBuffer tokens = backend->allocate(DType::I32, {2});
  EXPECT_THROW(backend->sample(logits.view(), rows.view(), tokens.view()), Error);
}

}  // namespace
