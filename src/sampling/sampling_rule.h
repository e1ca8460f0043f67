// backend/sampling_rule.h — the device-side sampling rule shared by the CPU and CUDA backends'
// sample(): per-row parameters and the Gumbel noise of the draw. C++17, host and device.
//
// Greedy (temperature 0): argmax, the first index on ties. Otherwise z = logits / temperature,
// then top-k (keep z >= the k-th largest, ties kept), top-p (keep z when the probability mass
// strictly above it within the top-k set is < top_p, ties kept), min-p (keep p >= min_p * p_max),
// then the token with the largest z + Gumbel(seed, step, token) among those kept: an exact draw
// from the renormalized distribution. The engine's host Sampler applies the same filters in the
// same order; it draws from its own RNG, so only greedy results coincide token for token.
#pragma once

#include "core/counter_hash.h"

#include <cmath>
#include <cstdint>

namespace splitflow {

// One logits row's parameters, 32 bytes: rows are staged on the device as I32 [R, 8].
struct SamplingRow {
  float temperature = 0.0f;  // 0: greedy (the other fields are ignored)
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;         // with step, selects the noise: same logits + seed + step, same token
  uint64_t step = 0;         // e.g. the sequence's number of generated tokens
};
static_assert(sizeof(SamplingRow) == 32, "SamplingRow is staged as 8 int32 words");
constexpr int kSamplingRowWords = 8;

SF_HOST_DEVICE uint32_t sampling_noise_key(uint64_t seed, uint64_t step) {
  return static_cast<uint32_t>(mix64(seed ^ mix64(step + 0x9e3779b97f4a7c15ull)));
}

// Standard Gumbel noise -log(-log(u)) for token `index`.
SF_HOST_DEVICE float gumbel_noise(uint32_t key, uint32_t index) {
  return -logf(-logf(unit_uniform(key, index)));  // full-precision logf on both sides
}

}  // namespace splitflow
