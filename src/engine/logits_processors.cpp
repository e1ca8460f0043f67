#include "engine/logits_processors.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace splitflow {

namespace {

// Higher logit first; among equal logits the lower id, so orders are deterministic.
bool ranks_before(const TokenLogit& a, const TokenLogit& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Reorders [first, last) so that its first `count` elements are the `count` first ones in
// `before` order, for the smallest count with mass_before + their mass >= target, and returns
// count (last - first when even the whole range falls short). Halving selection: nth_element
// splits the open range, the mass of the lower half says which half holds the boundary, so the
// cost is O(n) on average, not a sort; only the last few elements are sorted and walked.
template <typename It, typename Before, typename MassOf>
size_t prefix_reaching_mass(It first, It last, Before before, MassOf mass_of, double target, double mass_before) {
  constexpr std::ptrdiff_t kWalk = 32;
  It lo = first;
  It hi = last;
  double mass = mass_before;
  while (hi - lo > kWalk) {
    It mid = lo + (hi - lo) / 2;
    std::nth_element(lo, mid, hi, before);
    double lower = 0.0;
    for (It it = lo; it != mid; ++it) lower += mass_of(*it);
    if (mass + lower >= target) {
      hi = mid;
    } else {
      mass += lower;
      lo = mid;
    }
  }
  std::sort(lo, hi, before);
  for (It it = lo; it != hi; ++it) {
    mass += mass_of(*it);
    if (mass >= target) return static_cast<size_t>(it - first) + 1;
  }
  return static_cast<size_t>(last - first);
}

// Keeps the items whose probability relative to the top token, exp(logit - max), is >=
// min_ratio, preserving order (and therefore the sorted prefix, since the kept set is an
// upper set of the logits).
void keep_relative_probability_at_least(Candidates& c, float max_logit, double min_ratio) {
  size_t kept_sorted = 0;
  for (size_t i = 0; i < c.sorted_size; ++i) {
    if (std::exp(static_cast<double>(c.items[i].logit) - max_logit) >= min_ratio) ++kept_sorted;
  }
  auto end = std::remove_if(c.items.begin(), c.items.end(), [&](const TokenLogit& t) {
    return !(std::exp(static_cast<double>(t.logit) - max_logit) >= min_ratio);
  });
  c.items.erase(end, c.items.end());
  c.sorted_size = kept_sorted;
}

// Index into candidates.items of a token drawn with probability softmax(logits).
size_t sample_index(Candidates& c, Rng& rng) {
  SF_CHECK(!c.items.empty(), "sampler: no candidate token left to sample from");
  const float max_logit = c.max_logit();
  c.weights.resize(c.items.size());
  double total = 0.0;
  for (size_t i = 0; i < c.items.size(); ++i) {
    total += c.weights[i] = std::exp(static_cast<double>(c.items[i].logit) - max_logit);
  }
  const double target = uniform01(rng) * total;
  double cumulative = 0.0;
  size_t last_positive = 0;
  for (size_t i = 0; i < c.items.size(); ++i) {
    cumulative += c.weights[i];
    if (c.weights[i] > 0.0) last_positive = i;
    if (target < cumulative) return i;
  }
  // Rounding left target at the very top of the cumulative sum.
  return last_positive;
}

}  // namespace

void Candidates::assign(std::span<const float> logits) {
  items.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) items[i] = {static_cast<int32_t>(i), logits[i]};
  sorted_size = 0;
}

void Candidates::sort_top(size_t n) {
  n = std::min(n, items.size());
  if (n <= sorted_size) return;
  auto first = items.begin() + static_cast<std::ptrdiff_t>(sorted_size);
  auto middle = items.begin() + static_cast<std::ptrdiff_t>(n);
  if (n == items.size()) {
    std::sort(first, items.end(), ranks_before);
  } else {
    std::partial_sort(first, middle, items.end(), ranks_before);
  }
  sorted_size = n;
}

void Candidates::keep_first(size_t n) {
  if (n >= items.size()) return;
  items.resize(n);
  sorted_size = std::min(sorted_size, n);
}

float Candidates::max_logit() const {
  if (sorted_size > 0) return items[0].logit;
  float max_value = -std::numeric_limits<float>::infinity();
  for (const TokenLogit& t : items) max_value = std::max(max_value, t.logit);
  return max_value;
}

double Candidates::sum_exp(float max_logit) const {
  double total = 0.0;
  for (const TokenLogit& t : items) total += std::exp(static_cast<double>(t.logit) - max_logit);
  return total;
}

void apply_repetition_penalty(std::span<float> logits, const TokenCounts& seen, float penalty) {
  if (penalty == 1.0f) return;
  for (const auto& [token_id, count] : seen.counts()) {
    SF_CHECK(token_id >= 0 && static_cast<size_t>(token_id) < logits.size(),
             "repetition_penalty: token id {} is outside the vocabulary [0, {})", token_id, logits.size());
    if (count <= 0) continue;
    float& logit = logits[static_cast<size_t>(token_id)];
    logit = logit > 0.0f ? logit / penalty : logit * penalty;
  }
}

void apply_frequency_presence_penalties(std::span<float> logits, const TokenCounts& generated,
                                        float frequency_penalty, float presence_penalty) {
  if (frequency_penalty == 0.0f && presence_penalty == 0.0f) return;
  for (const auto& [token_id, count] : generated.counts()) {
    SF_CHECK(token_id >= 0 && static_cast<size_t>(token_id) < logits.size(),
             "frequency/presence penalty: token id {} is outside the vocabulary [0, {})", token_id,
             logits.size());
    if (count <= 0) continue;
    logits[static_cast<size_t>(token_id)] -=
        static_cast<float>(count) * frequency_penalty + presence_penalty;
  }
}

void apply_temperature(std::span<float> logits, float temperature) {
  SF_CHECK(temperature > 0.0f, "apply_temperature: temperature must be > 0, got {}", temperature);
  if (temperature == 1.0f) return;
  const float inverse = 1.0f / temperature;
  for (float& logit : logits) logit *= inverse;
}

int32_t argmax_token(std::span<const float> logits) {
  SF_CHECK(!logits.empty(), "argmax over an empty logits row");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

void top_k_filter(Candidates& c, int32_t k) {
  if (k <= 0 || static_cast<size_t>(k) >= c.size()) return;
  c.sort_top(static_cast<size_t>(k));
  c.keep_first(static_cast<size_t>(k));
}

void top_p_filter(Candidates& c, float p) {
  if (p >= 1.0f || c.size() <= 1) return;
  const float max_logit = c.max_logit();
  const double total = c.sum_exp(max_logit);
  auto mass_of = [&](const TokenLogit& t) { return std::exp(static_cast<double>(t.logit) - max_logit) / total; };
  double mass = 0.0;
  for (size_t i = 0; i < c.sorted_size; ++i) {
    mass += mass_of(c.items[i]);
    if (mass >= p) {
      c.keep_first(i + 1);
      return;
    }
  }
  const auto rest = c.items.begin() + static_cast<std::ptrdiff_t>(c.sorted_size);
  c.keep_first(c.sorted_size + prefix_reaching_mass(rest, c.items.end(), ranks_before, mass_of, p, mass));
}

void min_p_filter(Candidates& c, float min_p) {
  if (min_p <= 0.0f || c.size() <= 1) return;
  keep_relative_probability_at_least(c, c.max_logit(), min_p);
}

void typical_filter(Candidates& c, float mass) {
  if (mass >= 1.0f || c.size() <= 1) return;
  const float max_logit = c.max_logit();
  const double total = c.sum_exp(max_logit);
  const double log_total = std::log(total);
  const size_t n = c.size();
  c.scratch.resize(n);
  double entropy = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double log_p = (static_cast<double>(c.items[i].logit) - max_logit) - log_total;
    const double p = std::exp(log_p);
    if (p > 0.0) entropy -= p * log_p;
    c.scratch[i] = {-log_p, p, static_cast<uint32_t>(i)};  // key holds -log p until H is known
  }
  for (Candidates::KeyedIndex& k : c.scratch) k.key = std::abs(k.key - entropy);
  auto more_typical = [&](const Candidates::KeyedIndex& a, const Candidates::KeyedIndex& b) {
    if (a.key != b.key) return a.key < b.key;
    return c.items[a.index].id < c.items[b.index].id;
  };
  auto mass_of = [](const Candidates::KeyedIndex& k) { return k.probability; };
  const size_t kept = prefix_reaching_mass(c.scratch.begin(), c.scratch.end(), more_typical, mass_of, mass, 0.0);
  if (kept == n) return;
  c.scratch_items.resize(kept);
  for (size_t j = 0; j < kept; ++j) c.scratch_items[j] = c.items[c.scratch[j].index];
  std::copy(c.scratch_items.begin(), c.scratch_items.end(), c.items.begin());
  c.items.resize(kept);
  c.sorted_size = 0;
}

void tail_free_filter(Candidates& c, float z) {
  if (z >= 1.0f || c.size() < 3) return;
  c.sort_top(c.size());
  const float max_logit = c.items[0].logit;
  const size_t n = c.size();
  std::vector<double>& p = c.weights;  // (n) probabilities in sorted order
  p.resize(n);
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += p[i] = std::exp(static_cast<double>(c.items[i].logit) - max_logit);
  for (double& x : p) x /= total;
  double d2_sum = 0.0;
  for (size_t i = 0; i + 2 < n; ++i) d2_sum += std::abs(p[i] - 2.0 * p[i + 1] + p[i + 2]);
  if (!(d2_sum > 0.0)) return;
  double cumulative = 0.0;
  for (size_t i = 0; i + 2 < n; ++i) {
    cumulative += std::abs(p[i] - 2.0 * p[i + 1] + p[i + 2]) / d2_sum;
    if (cumulative > z) {
      c.keep_first(i + 1);
      return;
    }
  }
}

int32_t sample_categorical(Candidates& c, Rng& rng) { return c.items[sample_index(c, rng)].id; }

int32_t sample_gumbel(const Candidates& c, uint32_t noise_key) {
  const int32_t id = rule_draw(c.items, noise_key);
  SF_CHECK(id >= 0, "sampler: no candidate token left to sample from");
  return id;
}

int32_t mirostat_v1_top_k(Candidates& c, double mu, int32_t vocab_size) {
  const size_t n = c.size();
  SF_CHECK(n > 0, "mirostat: no candidate token left");
  const size_t m = std::min(n, static_cast<size_t>(kMirostatM));
  c.sort_top(m);
  double sum_tb = 0.0;
  double sum_tt = 0.0;
  for (size_t i = 0; i + 1 < m; ++i) {
    const double b = static_cast<double>(c.items[i].logit) - static_cast<double>(c.items[i + 1].logit);
    if (!std::isfinite(b)) break;  // the rest of the top m has probability 0
    const double t = std::log(static_cast<double>(i + 2) / static_cast<double>(i + 1));
    sum_tb += t * b;
    sum_tt += t * t;
  }
  const double s_hat = sum_tt > 0.0 ? sum_tb / sum_tt : 0.0;
  // A flat top (s_hat <= 0) gives no Zipf estimate: keep everything.
  if (!(s_hat > 0.0)) return static_cast<int32_t>(n);
  const double epsilon = s_hat - 1.0;
  const double two_mu = std::exp2(mu);
  // (eps 2^mu) / (1 - N^-eps) tends to 2^mu / ln N as eps -> 0.
  const double ratio = std::abs(epsilon) < 1e-9
                           ? two_mu / std::log(static_cast<double>(vocab_size))
                           : epsilon * two_mu / (1.0 - std::pow(static_cast<double>(vocab_size), -epsilon));
  const double k = std::round(std::pow(ratio, 1.0 / s_hat));
  if (!(k >= 1.0)) return 1;
  if (k >= static_cast<double>(n)) return static_cast<int32_t>(n);
  return static_cast<int32_t>(k);
}

namespace {

// Draws from the (already truncated) candidates and updates mu with the surprise of the drawn
// token under the distribution before truncation (max_logit, total of that distribution).
TokenLogit draw(Candidates& c, Rng& rng) { return c.items[sample_index(c, rng)]; }
TokenLogit draw(Candidates& c, uint32_t noise_key) {
  const int32_t id = sample_gumbel(c, noise_key);
  return *std::find_if(c.items.begin(), c.items.end(), [&](const TokenLogit& t) { return t.id == id; });
}

template <typename Noise>
int32_t mirostat_draw_and_update(Candidates& c, float tau, float eta, float& mu, Noise& noise, float max_logit,
                                 double total) {
  const TokenLogit chosen = draw(c, noise);
  const double p = std::exp(static_cast<double>(chosen.logit) - max_logit) / total;
  const double surprise = -std::log2(p);
  mu = static_cast<float>(static_cast<double>(mu) - static_cast<double>(eta) * (surprise - tau));
  return chosen.id;
}

template <typename Noise>
int32_t mirostat_v1(Candidates& c, float tau, float eta, int32_t vocab_size, float& mu, Noise& noise) {
  const float max_logit = c.max_logit();
  const double total = c.sum_exp(max_logit);
  const int32_t k = mirostat_v1_top_k(c, mu, vocab_size);
  c.keep_first(static_cast<size_t>(k));
  return mirostat_draw_and_update(c, tau, eta, mu, noise, max_logit, total);
}

template <typename Noise>
int32_t mirostat_v2(Candidates& c, float tau, float eta, float& mu, Noise& noise) {
  SF_CHECK(c.size() > 0, "mirostat: no candidate token left");
  c.sort_top(1);
  const float max_logit = c.items[0].logit;
  const double total = c.sum_exp(max_logit);
  // -log2 p <= mu  <=>  p >= 2^-mu  <=>  exp(logit - max) >= total * 2^-mu.
  const double min_ratio = total * std::exp2(-static_cast<double>(mu));
  const TokenLogit top = c.items[0];
  keep_relative_probability_at_least(c, max_logit, min_ratio);
  if (c.items.empty()) {
    c.items.push_back(top);
    c.sorted_size = 1;
  }
  return mirostat_draw_and_update(c, tau, eta, mu, noise, max_logit, total);
}

}  // namespace

int32_t mirostat_v1_sample(Candidates& c, float tau, float eta, int32_t vocab_size, float& mu, Rng& rng) {
  return mirostat_v1(c, tau, eta, vocab_size, mu, rng);
}
int32_t mirostat_v1_sample(Candidates& c, float tau, float eta, int32_t vocab_size, float& mu, uint32_t noise_key) {
  return mirostat_v1(c, tau, eta, vocab_size, mu, noise_key);
}
int32_t mirostat_v2_sample(Candidates& c, float tau, float eta, float& mu, Rng& rng) {
  return mirostat_v2(c, tau, eta, mu, rng);
}
int32_t mirostat_v2_sample(Candidates& c, float tau, float eta, float& mu, uint32_t noise_key) {
  return mirostat_v2(c, tau, eta, mu, noise_key);
}

}  // namespace splitflow
