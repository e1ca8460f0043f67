#include "sampling/host_rule.h"

#include <algorithm>
#include <limits>

namespace splitflow {

namespace {

// Higher z first; among equal z the lower id (a total order, so every selection is deterministic).
bool ranks_before(const TokenLogit& a, const TokenLogit& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

float max_logit(std::span<const TokenLogit> candidates) {
  float best = -std::numeric_limits<float>::infinity();
  for (const TokenLogit& c : candidates) best = std::max(best, c.logit);
  return best;
}

void keep_at_least(std::vector<TokenLogit>& candidates, float floor) {
  candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                  [&](const TokenLogit& c) { return !(c.logit >= floor); }),
                   candidates.end());
}

// Draw over a whole row: tokens with z >= floor (z_max: the row's largest z).
int32_t draw_over_row(std::span<const float> logits, float inv_temperature, float floor, float z_max, uint32_t key) {
  int32_t pick = -1;
  float pick_score = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    const float z = scaled_logit(logits[i], inv_temperature);
    if (!(z >= floor) || !may_win_draw(z, z_max)) continue;
    const float score = draw_score(z, key, static_cast<uint32_t>(i));
    if (score > pick_score) {
      pick_score = score;
      pick = static_cast<int32_t>(i);
    }
  }
  return pick;
}

}  // namespace

void rule_top_k(std::span<const float> logits, float inv_temperature, int32_t top_k, std::vector<TokenLogit>& out) {
  out.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = {static_cast<int32_t>(i), scaled_logit(logits[i], inv_temperature)};
  if (top_k <= 0 || static_cast<size_t>(top_k) >= out.size()) return;
  const auto kth = out.begin() + (top_k - 1);
  std::nth_element(out.begin(), kth, out.end(), ranks_before);
  const float floor = kth->logit;
  // [0, k) rank at or above the k-th; the rest may hold ties of it, which top-k keeps.
  const auto end = std::partition(kth + 1, out.end(), [&](const TokenLogit& c) { return c.logit >= floor; });
  out.erase(end, out.end());
}

void rule_top_p(std::vector<TokenLogit>& candidates, float top_p) {
  if (top_p >= 1.0f || candidates.size() <= 1) return;
  const float z_max = max_logit(candidates);
  double total = 0.0;
  for (const TokenLogit& c : candidates) total += top_p_weight(c.logit, z_max);
  const double target = static_cast<double>(top_p) * total;
  // The threshold is the z of the first token, in ranks_before order, at which the running mass
  // reaches the target: every token above it has less mass above it than the target (kept, its
  // ties too), every token below has at least the target above it. Halving selection finds it in
  // O(n) on average: nth_element splits the open range and the mass of the upper half says which
  // half holds it; the last few are sorted and walked.
  constexpr std::ptrdiff_t kWalk = 32;
  auto lo = candidates.begin(), hi = candidates.end();
  double mass = 0.0;  // of the tokens ranked before lo
  while (hi - lo > kWalk) {
    const auto mid = lo + (hi - lo) / 2;
    std::nth_element(lo, mid, hi, ranks_before);
    double upper = 0.0;
    for (auto it = lo; it != mid; ++it) upper += top_p_weight(it->logit, z_max);
    if (mass + upper >= target) {
      hi = mid;
    } else {
      mass += upper;
      lo = mid;
    }
  }
  std::sort(lo, hi, ranks_before);
  float floor = -std::numeric_limits<float>::infinity();  // never reached: keep everything
  for (auto it = lo; it != hi; ++it) {
    mass += top_p_weight(it->logit, z_max);
    if (mass >= target) {
      floor = it->logit;
      break;
    }
  }
  keep_at_least(candidates, floor);
}

void rule_min_p(std::vector<TokenLogit>& candidates, float min_p) {
  if (min_p <= 0.0f || candidates.empty()) return;
  keep_at_least(candidates, min_p_floor(max_logit(candidates), min_p));
}

int32_t rule_draw(std::span<const TokenLogit> candidates, uint32_t key) {
  const float z_max = max_logit(candidates);
  int32_t pick = -1;
  float pick_score = -std::numeric_limits<float>::infinity();
  for (const TokenLogit& c : candidates) {
    if (!may_win_draw(c.logit, z_max)) continue;
    const float score = draw_score(c.logit, key, static_cast<uint32_t>(c.id));
    if (score > pick_score || (score == pick_score && pick >= 0 && c.id < pick)) {
      pick_score = score;
      pick = c.id;
    }
  }
  return pick;
}

int32_t sample_by_rule(std::span<const float> logits, const SamplingRow& row, RuleScratch& scratch) {
  if (logits.empty()) return -1;
  const int32_t best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  if (row.temperature <= 0.0f) return best;
  const float inv_t = inverse_temperature(row.temperature);
  const uint32_t key = sampling_noise_key(row.seed, row.step);
  int32_t pick;
  if (row.top_k <= 0 && row.top_p >= 1.0f) {
    // No selection: one pass over the row (the same set and scores as the candidate path).
    const float z_max = scaled_logit(logits[static_cast<size_t>(best)], inv_t);
    const float floor = row.min_p > 0.0f ? min_p_floor(z_max, row.min_p) : -std::numeric_limits<float>::infinity();
    pick = draw_over_row(logits, inv_t, floor, z_max, key);
  } else {
    rule_top_k(logits, inv_t, row.top_k, scratch.candidates);
    rule_top_p(scratch.candidates, row.top_p);
    rule_min_p(scratch.candidates, row.min_p);
    pick = rule_draw(scratch.candidates, key);
  }
  return pick >= 0 ? pick : best;  // every kept score -inf (a row of -inf): the argmax, as on the device
}

}  // namespace splitflow
