// sampling/sampling_rule.h — the one sampling rule: how a logits row and a row of parameters
// become a token, written once for the host (sampling/host_rule.h: the CPU backend's sample() and
// the engine's host Sampler) and the device (backend/cuda/sampling.cu). C++17, host and device.
//
// Owns: SamplingRow (the parameters, staged on a device as I32 words), the arithmetic every
// implementation of the rule must share bit for bit (the scaled logits, the top-p weights, the
// min-p floor, the Gumbel noise), and the seed/step noise keys. Must never: include a backend, the
// engine or anything CUDA-specific, allocate, or use a library exp/log (CUDA's and glibc's differ in
// the last bit; the rule's own rule_expf/rule_logf are IEEE basic operations and fmaf only, so
// both sides compute the same bits). On the host the rule runs in sampling/host_rule.cpp, which is
// compiled with -ffp-contract=off (a contracted a * b + c would round once where the device rounds
// twice); on the device these functions use the _rn intrinsics, which nvcc never contracts.
//
// The rule, per row:
//   temperature 0: argmax, the first index on ties. Done.
//   z = logit * (1 / temperature)                        (scaled_logit)
//   top-k: keep z >= the k-th largest z (ties kept)
//   top-p: keep z when the mass of the kept tokens strictly above z is < top_p times the kept
//          mass (ties kept); a token's mass is rule_expf(z - z_max), summed in double
//   min-p: keep z >= z_max + rule_logf(min_p)           (p >= min_p * p_max)
//   draw:  the kept token with the largest z + gumbel_noise(key(seed, step), token), the lowest id
//          on ties: an exact draw from the renormalized softmax of the kept z. Implementations may
//          skip the tokens may_win_draw rules out (they cannot win).
// The same (logits, row) give the same token on every implementation: top-k and min-p compare
// identical floats, the noise is identical, and top-p's double sums can differ only in their
// order of addition (a relative 1e-16; the CUDA kernel adds in parallel).
#pragma once

#include "core/counter_hash.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace splitflow {

// One logits row's parameters, 32 bytes: rows are staged on the device as I32 [R, 8].
struct SamplingRow {
  float temperature = 0.0f;  // 0: greedy (the other fields are ignored)
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;         // with step, selects the noise: same logits + seed + step, same token
  uint64_t step = 0;         // the sequence's number of generated tokens before this one
};
static_assert(sizeof(SamplingRow) == 32, "SamplingRow is staged as 8 int32 words");
constexpr int kSamplingRowWords = 8;

// ---- Arithmetic both sides round alike --------------------------------------------------------

SF_HOST_DEVICE float rule_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SF_HOST_DEVICE float rule_add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SF_HOST_DEVICE float rule_div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
SF_HOST_DEVICE float rule_fma(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return std::fmaf(a, b, c);
#endif
}
SF_HOST_DEVICE uint32_t rule_float_bits(float v) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(v);
#else
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
#endif
}
SF_HOST_DEVICE float rule_bits_float(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
#endif
}

// e^x within 2 ulp for x in (-87, 88]; 0 at or below -87 (and for NaN), +inf above 88. The rule
// only takes it of z - z_max <= 0, where e^-87 = 1.6e-38 of the top token's mass is nothing.
SF_HOST_DEVICE float rule_expf(float x) {
  if (!(x > -87.0f)) return 0.0f;
  if (x > 88.0f) return rule_bits_float(0x7f800000u);
  // x = n ln2 + r, |r| <= ln2 / 2 (Cody-Waite: ln2 = 0.693359375 - 2.12194440e-4).
  const float n = rule_add(rule_add(rule_mul(x, 1.44269504f), 12582912.0f), -12582912.0f);  // rint, |.| < 2^22
  float r = rule_fma(-n, 0.693359375f, x);
  r = rule_fma(n, 2.12194440e-4f, r);
  // e^r by its Taylor series to r^7 (remainder < 0.347^8 / 8! = 5e-9).
  float p = 1.98412698e-4f;  // 1/5040
  p = rule_fma(p, r, 1.38888889e-3f);
  p = rule_fma(p, r, 8.33333333e-3f);
  p = rule_fma(p, r, 4.16666667e-2f);
  p = rule_fma(p, r, 1.66666667e-1f);
  p = rule_fma(p, r, 0.5f);
  p = rule_fma(p, r, 1.0f);
  p = rule_fma(p, r, 1.0f);
  const int32_t e = static_cast<int32_t>(n);  // in [-125, 127]: 2^e is a normal float
  return rule_mul(p, rule_bits_float(static_cast<uint32_t>(e + 127) << 23));
}

// ln x within 2 ulp for x > 0 (subnormals included); -inf at 0, +inf at +inf, NaN below 0.
SF_HOST_DEVICE float rule_logf(float x) {
  if (!(x > 0.0f)) return x == 0.0f ? rule_bits_float(0xff800000u) : rule_bits_float(0x7fc00000u);
  if (x > 3.40282347e38f) return x;
  int32_t exponent_bias = 127;
  if (x < 1.17549435e-38f) {
    x = rule_mul(x, 8388608.0f);  // 2^23, exact
    exponent_bias += 23;
  }
  const uint32_t bits = rule_float_bits(x);
  int32_t e = static_cast<int32_t>(bits >> 23) - exponent_bias;
  float m = rule_bits_float((bits & 0x007fffffu) | 0x3f800000u);  // [1, 2)
  if (m > 1.41421356f) {
    m = rule_mul(m, 0.5f);
    e += 1;
  }
  // ln m = ln(1 + f) = 2 atanh(s), s = f / (2 + f), |s| <= 0.1716: 2s + s^3 (2/3 + s^2 (2/5 +
  // s^2 (2/7 + s^2 2/9))) (remainder < 2 s^11 / 11 = 7e-10 of 2s).
  const float f = rule_add(m, -1.0f);
  const float s = rule_div(f, rule_add(2.0f, f));
  const float s2 = rule_mul(s, s);
  float t = rule_fma(s2, 0.222222222f, 0.285714286f);
  t = rule_fma(s2, t, 0.4f);
  t = rule_fma(s2, t, 0.666666667f);
  const float log_m = rule_fma(rule_mul(s, s2), t, rule_add(s, s));
  const float ef = static_cast<float>(e);
  return rule_fma(ef, 0.693359375f, rule_fma(ef, -2.12194440e-4f, log_m));
}

// ---- The rule's steps --------------------------------------------------------------------------

SF_HOST_DEVICE float inverse_temperature(float temperature) { return rule_div(1.0f, temperature); }

// z of one logit.
SF_HOST_DEVICE float scaled_logit(float logit, float inv_temperature) { return rule_mul(logit, inv_temperature); }

// A token's top-p weight (its unnormalized probability): e^(z - z_max).
SF_HOST_DEVICE float top_p_weight(float z, float z_max) { return rule_expf(rule_add(z, -z_max)); }

// The lowest z min-p keeps (min_p > 0).
SF_HOST_DEVICE float min_p_floor(float z_max, float min_p) { return rule_add(z_max, rule_logf(min_p)); }

SF_HOST_DEVICE uint32_t sampling_noise_key(uint64_t seed, uint64_t step) {
  return static_cast<uint32_t>(mix64(seed ^ mix64(step + 0x9e3779b97f4a7c15ull)));
}

// Standard Gumbel noise -ln(-ln u) for token `index`, u uniform in (0, 1) from (key, index).
SF_HOST_DEVICE float gumbel_noise(uint32_t key, uint32_t index) {
  return -rule_logf(-rule_logf(unit_uniform(key, index)));
}

// A token's draw score: the largest among the kept tokens wins.
SF_HOST_DEVICE float draw_score(float z, uint32_t key, uint32_t index) { return rule_add(z, gumbel_noise(key, index)); }

// Whether a token of this z may win a draw where the largest kept z is z_max. The noise lies in
// [-2.82, 16.64] (u in [2^-24, 1 - 2^-24]), so a score is at most z + 17.5 and the top token's at
// least z_max - 3 (rounding is monotonic): a token failing this loses to the top token whatever its
// noise. Skipping those changes no draw and saves their noise (most of a vocabulary at T = 1).
SF_HOST_DEVICE bool may_win_draw(float z, float z_max) { return !(rule_add(z, 17.5f) < rule_add(z_max, -3.0f)); }

// A uniform in (0, 1) of this (seed, step) that no token's noise uses (index 2^32 - 1): the host
// Sampler's other random choices (randomized FSD's coin) come from it.
SF_HOST_DEVICE float step_uniform(uint64_t seed, uint64_t step) {
  return unit_uniform(sampling_noise_key(seed, step), 0xffffffffu);
}

}  // namespace splitflow
