// engine/logits_processors.h — the decoding steps as small functions a test can call alone:
// penalties and temperature over a logits row, truncation filters over a candidate list, and the
// final draws (categorical, mirostat v1/v2). engine/sampler.h chains them in a fixed order.
//
// Probabilities are always the softmax of the current candidates' logits, computed in double.
// Ties between equal logits are broken by the lower token id, so every filter is deterministic.
// The filters and draws allocate nothing once a Candidates' buffers have grown to the vocabulary.
#pragma once

#include "sampling/host_rule.h"

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

namespace splitflow {

using Rng = std::mt19937_64;

// Uniform in [0, 1) from the top 53 bits: the same numbers on every standard library (unlike
// std::uniform_real_distribution), so a seed reproduces tokens across platforms.
inline double uniform01(Rng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// Candidate tokens of one sampling step. Starts as the whole vocabulary (assign); filters drop
// tokens. items[0, sorted_size) hold the highest logits in descending order (ties: lower id
// first) and every later item ranks below all of them, so sorting more only touches the rest.
// top-k, mirostat v1 and FSD sort only a prefix (partial_sort), and only tail-free sorts
// everything; top-p and typical find their sets by mass-guided selection (nth_element), which is
// O(vocabulary) on average.
struct Candidates {
  std::vector<TokenLogit> items;  // (size)
  size_t sorted_size = 0;

  void assign(std::span<const float> logits);  // ids 0..logits.size()-1, unsorted
  size_t size() const { return items.size(); }
  // Extends the sorted prefix to min(n, size()) items.
  void sort_top(size_t n);
  // Keeps items[0, n).
  void keep_first(size_t n);
  float max_logit() const;
  // softmax normalizer: sum_i exp(logit_i - max_logit()), in double.
  double sum_exp(float max_logit) const;

  // Scratch: tokens ordered by another key (typical sampling), per-item weights.
  struct KeyedIndex {
    double key;
    double probability;
    uint32_t index;
  };
  std::vector<KeyedIndex> scratch;
  std::vector<TokenLogit> scratch_items;
  std::vector<double> weights;
};

// Occurrence counts of token ids in a token stream, sparse (a long context holds a few thousand
// distinct tokens; a dense vocabulary-sized array per sequence would not scale to many sequences).
class TokenCounts {
 public:
  void add(int32_t token_id) { ++counts_[token_id]; }
  void clear() { counts_.clear(); }
  int32_t count(int32_t token_id) const {
    auto it = counts_.find(token_id);
    return it == counts_.end() ? 0 : it->second;
  }
  const std::unordered_map<int32_t, int32_t>& counts() const { return counts_; }

 private:
  std::unordered_map<int32_t, int32_t> counts_;
};

// ---- Over a logits row (vocabulary order) --------------------------------------------------

// CTRL (Keskar et al. 2019) as HF implements it: for every distinct token of `seen`, logit /=
// penalty when the logit is > 0, logit *= penalty otherwise. Applied once per distinct token.
void apply_repetition_penalty(std::span<float> logits, const TokenCounts& seen, float penalty);

// OpenAI: logit[t] -= count[t] * frequency_penalty + (count[t] > 0) * presence_penalty.
void apply_frequency_presence_penalties(std::span<float> logits, const TokenCounts& generated,
                                        float frequency_penalty, float presence_penalty);

// logit /= temperature (temperature > 0).
void apply_temperature(std::span<float> logits, float temperature);

// Index of the largest logit (lowest id among equal ones).
int32_t argmax_token(std::span<const float> logits);

// ---- Truncation filters over Candidates ---------------------------------------------------

// Keeps the k highest logits (k >= size(): no-op).
void top_k_filter(Candidates& candidates, int32_t k);
// Nucleus (Holtzman et al. 2020): sorted by probability, keeps the smallest prefix whose mass
// is >= p. p >= 1: no-op.
void top_p_filter(Candidates& candidates, float p);
// Keeps tokens with p >= min_p * p_max. min_p <= 0: no-op.
void min_p_filter(Candidates& candidates, float min_p);
// Locally typical sampling (Meister et al. 2023): H = -sum p log p; orders tokens by
// |-log p - H| ascending and keeps the smallest prefix of that order whose mass is >= mass.
// Leaves the candidates in that order (sorted_size = 0). mass >= 1: no-op.
void typical_filter(Candidates& candidates, float mass);
// Tail-free sampling (Bricken 2019): with the probabilities sorted descending p_0 >= p_1 >= ...,
// d2_i = |p_i - 2 p_{i+1} + p_{i+2}| for i = 0..n-3, normalized to sum 1; keeps tokens 0..i
// where i is the first index whose cumulative normalized d2 exceeds z (as the original
// implementation centres the cut). Fewer than 3 candidates, all d2 zero, or z >= 1: no-op.
void tail_free_filter(Candidates& candidates, float z);

// ---- Draws ---------------------------------------------------------------------------------

// Draws a token with probability softmax(logits) over the candidates.
int32_t sample_categorical(Candidates& candidates, Rng& rng);
// The same distribution by the sampling rule's draw (sampling/host_rule.h rule_draw): Gumbel-max
// with noise keyed by noise_key (sampling_noise_key(seed, step)), what the host Sampler uses.
int32_t sample_gumbel(const Candidates& candidates, uint32_t noise_key);

// Mirostat v1 (Basu et al. 2021, Algorithm 1). From the top m = 100 sorted probabilities,
// s_hat = sum t_i b_i / sum t_i^2 with t_i = ln((i+2)/(i+1)), b_i = ln(p_i / p_{i+1});
// eps = s_hat - 1; k = round(((eps * 2^mu) / (1 - N^-eps))^(1/s_hat)), N = vocab_size,
// clamped to [1, size()]. Leaves the candidates sorted and returns k.
int32_t mirostat_v1_top_k(Candidates& candidates, double mu, int32_t vocab_size);
inline constexpr int32_t kMirostatM = 100;

// One mirostat step. v1 samples from the top-k of mirostat_v1_top_k; v2 keeps the tokens whose
// surprise -log2 p is <= mu (at least the most probable one). Both then update
// mu -= eta * (S - tau), with S = -log2 p(token) under the distribution *before* truncation, as
// the authors' reference code does (llama.cpp uses the renormalized truncated distribution).
// The Rng overloads draw by sample_categorical, the noise_key ones by sample_gumbel.
int32_t mirostat_v1_sample(Candidates& candidates, float tau, float eta, int32_t vocab_size,
                           float& mu, Rng& rng);
int32_t mirostat_v2_sample(Candidates& candidates, float tau, float eta, float& mu, Rng& rng);
int32_t mirostat_v1_sample(Candidates& candidates, float tau, float eta, int32_t vocab_size, float& mu,
                           uint32_t noise_key);
int32_t mirostat_v2_sample(Candidates& candidates, float tau, float eta, float& mu, uint32_t noise_key);

}  // namespace splitflow
