// sampling/host_rule.h — the sampling rule (sampling/sampling_rule.h) on the host: the CPU
// backend's sample() and the engine's host Sampler both draw through it, so a seeded sequence
// gets the same tokens whichever path samples it, and the CUDA kernel is tested against it.
// Pure functions of their arguments (no global state, no clock, no RNG object); the scratch is
// the caller's. Compiled with -ffp-contract=off (see sampling_rule.h).
#pragma once

#include "sampling/sampling_rule.h"

#include <cstdint>
#include <span>
#include <vector>

namespace splitflow {

// A candidate token and its (scaled or processed) logit.
struct TokenLogit {
  int32_t id;
  float logit;
};

// Per-thread scratch of the rule (vocabulary-sized once grown, so a draw allocates nothing after).
struct RuleScratch {
  std::vector<TokenLogit> candidates;
};

// The rule on one logits row: row.temperature 0 gives the argmax (the first index on ties).
// Logits may hold -inf (masked tokens); the caller rejects NaN and +inf where it cares.
int32_t sample_by_rule(std::span<const float> logits, const SamplingRow& row, RuleScratch& scratch);

// ---- Its steps, for a caller that inserts host-only filters between top-k and top-p (the
// engine's tail-free and typical filters). Candidate lists may be in any order: every step's
// result depends on the set alone, apart from the order of top-p's additions.

// out = (id, z) of the tokens top-k keeps (every token when top_k is 0 or >= the vocabulary).
void rule_top_k(std::span<const float> logits, float inv_temperature, int32_t top_k, std::vector<TokenLogit>& out);
// Keeps the candidates top-p keeps (top_p >= 1: all). Reorders them.
void rule_top_p(std::vector<TokenLogit>& candidates, float top_p);
// Keeps the candidates with z >= max z + ln(min_p) (min_p <= 0: all).
void rule_min_p(std::vector<TokenLogit>& candidates, float min_p);
// The candidate with the largest z + gumbel_noise(key, id), the lowest id on ties; -1 when empty.
int32_t rule_draw(std::span<const TokenLogit> candidates, uint32_t key);

}  // namespace splitflow
