// engine/fsd.h — Frustratingly Simple Decoding (FSD; Inferflow §6, Yang et al. 2023,
// arXiv 2305.12675): the anti-LM, an n-gram model of the current prefix, and the FSD choice.
//
// Our reading of the reference (the Inferflow text, checked against the authors' code that
// Inferflow's implementation follows):
//   FSD(y) = (1 - alpha) * P_LM(y | prefix) - alpha * P_antiLM(y | prefix), over the top-k
//   tokens of P_LM; deterministic FSD takes the argmax. P_LM is the softmax of the (penalized,
//   temperature-scaled) logits over the whole vocabulary.
//   The anti-LM holds, for every order i = 0..n-1, the counts of (i-token context -> next token)
//   over the whole prefix (prompt + generated). With ctx_i the last i tokens of the prefix,
//   c_i(y) the count of y after ctx_i and T_i the count of ctx_i followed by anything:
//     remaining = 1, score = 0
//     for i = n-1 down to 0, skipping orders where c_i(y) = 0:
//       score += remaining * (i > 0 ? beta * c_i(y) / (T_i + 1) : c_i(y) / T_0)
//       remaining *= 1 - beta
//   so the longest matching context gets weight beta and passes the rest of the mass down
//   (backoff), and the unigram frequency takes all that is left. A prefix shorter than n-1
//   tokens gives P_antiLM = 0. (The reference code also scales stop-word penalties; not here.)
//   Randomized FSD "selects between FSD and sampling in the first T steps": in each of the first
//   fsd_random_steps generated tokens, with probability fsd_random_probability the token is drawn
//   by the ordinary sampling chain instead (Inferflow: T = 10, probability 0.5); later, FSD.
#pragma once

#include "engine/logits_processors.h"
#include "engine/sampling_params.h"

#include <array>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace splitflow {

class NgramAntiLm {
 public:
  NgramAntiLm(int32_t order, float beta);

  // Extends the prefix by one token: updates the counts of every order in O(order).
  void append(int32_t token_id);
  void clear();
  size_t num_tokens() const { return tokens_.size(); }
  const std::vector<int32_t>& tokens() const { return tokens_; }

  // P_antiLM(candidate | current prefix), by the backoff rule above.
  double probability(int32_t candidate) const;

 private:
  static constexpr int32_t kKeySize = SamplingParams::kMaxFsdNgramOrder;
  // Up to order-1 context tokens, then (for n-gram keys) the next token; unused slots are -1.
  using Key = std::array<int32_t, kKeySize>;
  struct KeyHash {
    size_t operator()(const Key& key) const;
  };
  Key context_key(int32_t context_length) const;

  int32_t order_;
  double beta_;
  std::vector<int32_t> tokens_;
  // [i]: context of i tokens + next token -> count
  std::vector<std::unordered_map<Key, int32_t, KeyHash>> ngram_counts_;
  // [i]: context of i tokens -> how often it was followed by a token
  std::vector<std::unordered_map<Key, int32_t, KeyHash>> context_totals_;
};

// Deterministic FSD: keeps the top_k candidates of P_LM (softmax over all current candidates),
// returns the one with the largest (1 - alpha) P_LM - alpha P_antiLM (ties: the more probable).
int32_t fsd_select(Candidates& candidates, int32_t top_k, float alpha, const NgramAntiLm& anti_lm);

}  // namespace splitflow
