#include "engine/fsd.h"

#include "core/error.h"

#include <cmath>
#include <limits>

namespace splitflow {

size_t NgramAntiLm::KeyHash::operator()(const Key& key) const {
  // splitmix64 finalizer over the packed ids: contexts of real text differ in few ids.
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (int32_t id : key) {
    h ^= static_cast<uint32_t>(id);
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
  }
  return static_cast<size_t>(h);
}

NgramAntiLm::NgramAntiLm(int32_t order, float beta)
    : order_(order), beta_(beta), ngram_counts_(static_cast<size_t>(order)),
      context_totals_(static_cast<size_t>(order)) {
  SF_CHECK(order >= 1 && order <= kKeySize, "fsd_ngram_order must be in [1, {}], got {}", kKeySize, order);
  SF_CHECK(beta > 0.0f && beta <= 1.0f, "fsd_beta must be in (0, 1], got {}", beta);
}

NgramAntiLm::Key NgramAntiLm::context_key(int32_t context_length) const {
  Key key;
  key.fill(-1);
  const size_t start = tokens_.size() - static_cast<size_t>(context_length);
  for (int32_t j = 0; j < context_length; ++j) key[static_cast<size_t>(j)] = tokens_[start + static_cast<size_t>(j)];
  return key;
}

void NgramAntiLm::append(int32_t token_id) {
  for (int32_t i = 0; i < order_ && static_cast<size_t>(i) <= tokens_.size(); ++i) {
    Key key = context_key(i);
    ++context_totals_[static_cast<size_t>(i)][key];
    key[static_cast<size_t>(i)] = token_id;
    ++ngram_counts_[static_cast<size_t>(i)][key];
  }
  tokens_.push_back(token_id);
}

void NgramAntiLm::clear() {
  tokens_.clear();
  for (auto& counts : ngram_counts_) counts.clear();
  for (auto& totals : context_totals_) totals.clear();
}

double NgramAntiLm::probability(int32_t candidate) const {
  if (tokens_.size() < static_cast<size_t>(order_ - 1)) return 0.0;
  double remaining = 1.0;
  double score = 0.0;
  for (int32_t i = order_ - 1; i >= 0; --i) {
    Key key = context_key(i);
    const auto total_it = context_totals_[static_cast<size_t>(i)].find(key);
    if (total_it == context_totals_[static_cast<size_t>(i)].end()) continue;
    key[static_cast<size_t>(i)] = candidate;
    const auto count_it = ngram_counts_[static_cast<size_t>(i)].find(key);
    if (count_it == ngram_counts_[static_cast<size_t>(i)].end()) continue;
    const double count = count_it->second;
    const double total = total_it->second;
    score += i > 0 ? remaining * beta_ * count / (total + 1.0) : remaining * count / total;
    remaining -= remaining * beta_;
  }
  return score;
}

int32_t fsd_select(Candidates& candidates, int32_t top_k, float alpha, const NgramAntiLm& anti_lm) {
  SF_CHECK(candidates.size() > 0, "fsd: no candidate token left");
  const float max_logit = candidates.max_logit();
  const double total = candidates.sum_exp(max_logit);
  top_k_filter(candidates, top_k);
  candidates.sort_top(candidates.size());
  int32_t best_id = candidates.items[0].id;
  double best_score = -std::numeric_limits<double>::infinity();
  for (const TokenLogit& t : candidates.items) {
    const double p_lm = std::exp(static_cast<double>(t.logit) - max_logit) / total;
    const double score = (1.0 - alpha) * p_lm - static_cast<double>(alpha) * anti_lm.probability(t.id);
    if (score > best_score) {
      best_score = score;
      best_id = t.id;
    }
  }
  return best_id;
}

}  // namespace splitflow
