// quant/block_quantizers.h — the quantizer of every type for one block (one scale group for FP8
// and int8), written once for the host and the device. C++17, host and device.
//
// Owns: the arithmetic of quantization: llama.cpp's reference quantizers (quantize_row_*_ref, no
// importance matrix) for Q4_0 .. Q6_K, Inferflow's min/max blocks and Q3H, FP8 and int8 groups,
// each one block into its packed bytes. quant/*.cpp run them over rows on the host (the reference,
// tested against llama.cpp and gguf); backend/cuda/quantize_matrix.cu runs them on the device, one
// thread per block, for --quantization in device memory. Must never: allocate, throw, log, or use
// anything but IEEE basic operations, sqrt and rounding (bit-identical on both sides: the host TUs
// compile with -ffp-contract=off, the device TU with -fmad=false, so neither fuses a * b + c).
// Layouts and formulas: quant/quant.h; the dequantizers stay in quant/*.cpp (host only).
#pragma once

#include "core/counter_hash.h"  // SF_HOST_DEVICE
#include "core/dtype.h"
#include "core/fp16.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#include <cuda_fp8.h>
#endif

namespace splitflow::quant::blocks {

// std::min / std::max / std::clamp's results (ties and signed zeros included), host and device.
template <typename T>
SF_HOST_DEVICE T min_of(T a, T b) { return b < a ? b : a; }
template <typename T>
SF_HOST_DEVICE T max_of(T a, T b) { return a < b ? b : a; }
template <typename T>
SF_HOST_DEVICE T clamp_of(T v, T lo, T hi) { return v < lo ? lo : (hi < v ? hi : v); }

// Finite (not NaN or infinite): x - x is 0 only then. No library call, so host and device agree.
SF_HOST_DEVICE bool is_finite(double value) { return value - value == 0; }

// Round to nearest, ties to even (llama.cpp's nearest_int).
SF_HOST_DEVICE int nearest_int(float value) { return static_cast<int>(nearbyintf(value)); }

// fp16 bits of a float (nearest even, overflow to inf) and back, by core/fp16.h's integer
// algorithm on both sides (core/dtype.h's conversions are it too). Not the cvt instructions: with
// them, on the H100, the GGUF quantizers' d fields differed from the host's (cause not yet found).
SF_HOST_DEVICE uint16_t f16_bits(float value) { return fp16::from_f32(value); }
SF_HOST_DEVICE float f16_value(uint16_t bits) { return fp16::to_f32(bits); }
SF_HOST_DEVICE uint8_t e4m3_bits(float value) {
#ifdef __CUDA_ARCH__
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3));
#else
  return f32_to_e4m3(value);
#endif
}

// Little-endian fp16 fields (blocks are byte-packed).
SF_HOST_DEVICE void store_f16(uint8_t* bytes, uint16_t bits) {
  bytes[0] = static_cast<uint8_t>(bits & 0xff);
  bytes[1] = static_cast<uint8_t>(bits >> 8);
}
SF_HOST_DEVICE float load_f16(const uint8_t* bytes) {
  return f16_value(static_cast<uint16_t>(bytes[0] | (bytes[1] << 8)));
}
SF_HOST_DEVICE void store_f32(uint8_t* bytes, float value) {
  uint32_t word;
  memcpy(&word, &value, sizeof word);
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<uint8_t>(word >> (8 * i));
}

// ---- Q4_0 Q4_1 Q5_0 Q5_1 Q8_0: blocks of 32 --------------------------------------------------
//  Q4_0: d f16, qs[16]            (low nibbles elements 0..15, high nibbles 16..31)
//  Q4_1: d f16, m f16, qs[16]
//  Q5_0: d f16, qh u32, qs[16]    (qh bit j: the fifth bit of element j)
//  Q5_1: d f16, m f16, qh u32, qs[16]
//  Q8_0: d f16, qs[32] int8

// The element with the largest magnitude, signed (the first one on ties), as llama.cpp picks it.
SF_HOST_DEVICE float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j)
    if (amax < fabsf(x[j])) {
      amax = fabsf(x[j]);
      max = x[j];
    }
  return max;
}

SF_HOST_DEVICE void store_q4_nibbles(const uint8_t* q, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((q[j] & 0xf) | ((q[j + 16] & 0xf) << 4));
}
SF_HOST_DEVICE void store_q5_high_bits(const uint8_t* q, uint8_t* qh) {
  uint32_t bits = 0;
  for (int j = 0; j < 32; ++j) bits |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
  for (int i = 0; i < 4; ++i) qh[i] = static_cast<uint8_t>(bits >> (8 * i));
}

// Symmetric 4/5-bit: d = max / -2^(bits-1), q = min(2^bits - 1, trunc(x / d + 2^(bits-1) + 0.5)).
SF_HOST_DEVICE void quantize_symmetric(const float* x, uint8_t* q, uint8_t* d_field, int bits) {
  const int half = 1 << (bits - 1), top = (1 << bits) - 1;
  const float d = signed_absmax(x, 32) / static_cast<float>(-half);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(d_field, f16_bits(d));
  for (int j = 0; j < 32; ++j) {
    const float scaled = x[j] * id;
    q[j] = static_cast<uint8_t>(min_of(top, static_cast<int>(scaled + (static_cast<float>(half) + 0.5f))));
  }
}
// Min + scale 4/5-bit: d = (max - min) / (2^bits - 1), q = min(2^bits - 1, trunc((x - min) / d + 0.5)).
SF_HOST_DEVICE void quantize_affine(const float* x, uint8_t* q, uint8_t* d_field, uint8_t* m_field, int bits) {
  const int top = (1 << bits) - 1;
  float min = x[0], max = x[0];
  for (int j = 1; j < 32; ++j) {
    min = min_of(min, x[j]);
    max = max_of(max, x[j]);
  }
  const float d = (max - min) / static_cast<float>(top);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(d_field, f16_bits(d));
  store_f16(m_field, f16_bits(min));
  for (int j = 0; j < 32; ++j) {
    const float scaled = (x[j] - min) * id;
    q[j] = static_cast<uint8_t>(min_of(top, static_cast<int>(scaled + 0.5f)));
  }
}

SF_HOST_DEVICE void quantize_q4_0(const float* x, uint8_t* b) {
  uint8_t q[32];
  quantize_symmetric(x, q, b, 4);
  store_q4_nibbles(q, b + 2);
}
SF_HOST_DEVICE void quantize_q4_1(const float* x, uint8_t* b) {
  uint8_t q[32];
  quantize_affine(x, q, b, b + 2, 4);
  store_q4_nibbles(q, b + 4);
}
SF_HOST_DEVICE void quantize_q5_0(const float* x, uint8_t* b) {
  uint8_t q[32];
  quantize_symmetric(x, q, b, 5);
  store_q5_high_bits(q, b + 2);
  store_q4_nibbles(q, b + 6);
}
SF_HOST_DEVICE void quantize_q5_1(const float* x, uint8_t* b) {
  uint8_t q[32];
  quantize_affine(x, q, b, b + 2, 5);
  store_q5_high_bits(q, b + 4);
  store_q4_nibbles(q, b + 8);
}
SF_HOST_DEVICE void quantize_q8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = max_of(amax, fabsf(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(b, f16_bits(d));
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(roundf(x[j] * id)));
}

// ---- K-quants: super-blocks of 256 --------------------------------------------------------------
//  Q2_K (84):  scales[16] (low nibble scale, high nibble min), qs[64], d f16, dmin f16
//  Q3_K (110): hmask[32], qs[64], scales[12] (16 x 6 bits, offset 32), d f16
//  Q4_K (144): d f16, dmin f16, scales[12] (8 scales + 8 mins, 6 bits), qs[128]
//  Q5_K (176): d f16, dmin f16, scales[12], qh[32], qs[128]
//  Q6_K (210): ql[128], qh[64], scales[16] int8, d f16
// Element e of a 2-bit plane (Q2_K, Q3_K low bits): e = 128 h + 32 s + l -> bits 2s of qs[32 h + l].
constexpr int kSuperBlock = 256;        // QK_K
constexpr float kGroupMaxEps = 1e-15f;  // llama.cpp's GROUP_MAX_EPS: a sub-block below it is all zero

// Q4_K / Q5_K 6-bit scale and min of sub-block j (ggml's get_scale_min_k4).
SF_HOST_DEVICE void k4_scale_min(const uint8_t* scales, int j, int& scale, int& min) {
  if (j < 4) {
    scale = scales[j] & 63;
    min = scales[j + 4] & 63;
  } else {
    scale = (scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4);
    min = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}
// Q3_K 6-bit scale of sub-block j, minus its offset of 32.
SF_HOST_DEVICE int q3k_scale(const uint8_t* scales, int j) {
  const int low = j < 8 ? (scales[j] & 0xf) : (scales[j - 8] >> 4);
  const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// Weighted error of levels l under x ~ scale * l + shift (absolute when use_mad, else squared).
SF_HOST_DEVICE float fit_error(int n, const float* x, const float* weights, float scale, float shift,
                               const uint8_t* l, bool use_mad) {
  float error = 0;
  for (int i = 0; i < n; ++i) {
    float diff = scale * static_cast<float>(l[i]) + shift - x[i];
    diff = use_mad ? fabsf(diff) : diff * diff;
    error += weights[i] * diff;
  }
  return error;
}

// llama.cpp's make_qkx2_quants: levels 0..nmax for x ~ scale * level - offset (offset >= 0),
// fitted by weighted least squares over a grid of candidate inverse scales
// (nmax + rmin + rdelta * i) / (max - min), i = 0..steps, keeping the one of least weighted error
// (absolute when use_mad, else squared). Returns the scale; *offset gets the (positive) offset.
// n <= 32.
SF_HOST_DEVICE float fit_scale_offset(int n, int nmax, const float* x, const float* weights, uint8_t* levels,
                                      float* offset, float rmin, float rdelta, int steps, bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = min_of(min, x[i]);
    max = max_of(max, x[i]);
    sum_w += weights[i];
    sum_x += weights[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) levels[i] = 0;
    *offset = -min;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  for (int i = 0; i < n; ++i)
    levels[i] = static_cast<uint8_t>(clamp_of(nearest_int(iscale * (x[i] - min)), 0, nmax));
  float best_error = fit_error(n, x, weights, scale, min, levels, use_mad);
  uint8_t trial[32];
  for (int step = 0; step <= steps; ++step) {
    iscale = (rmin + rdelta * static_cast<float>(step) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_of(nearest_int(iscale * (x[i] - min)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      const float w = weights[i], fl = static_cast<float>(l);
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    const float error = fit_error(n, x, weights, this_scale, this_min, trial, use_mad);
    if (error < best_error) {
      for (int i = 0; i < n; ++i) levels[i] = trial[i];
      best_error = error;
      scale = this_scale;
      min = this_min;
    }
  }
  *offset = -min;
  return scale;
}

// The signed element of largest magnitude (first on ties) and that magnitude.
SF_HOST_DEVICE void absmax_of(int n, const float* x, float& max, float& amax) {
  max = 0;
  amax = 0;
  for (int i = 0; i < n; ++i)
    if (fabsf(x[i]) > amax) {
      amax = fabsf(x[i]);
      max = x[i];
    }
}

// Sums of make_qx_quants' fit for one candidate inverse scale.
SF_HOST_DEVICE void symmetric_sums(int n, int nmax, const float* x, float iscale, float& sumlx, float& suml2) {
  sumlx = suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const float l = static_cast<float>(clamp_of(nearest_int(iscale * x[i]), -nmax, nmax - 1));
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
}
SF_HOST_DEVICE void symmetric_levels(int n, int nmax, const float* x, float iscale, int8_t* levels) {
  for (int i = 0; i < n; ++i)
    levels[i] = static_cast<int8_t>(nmax + clamp_of(nearest_int(iscale * x[i]), -nmax, nmax - 1));
}

// llama.cpp's make_qx_quants with rmse_type 1 and no importance: symmetric levels -nmax..nmax-1
// (returned + nmax) for x ~ scale * level, least squares weighted by x^2 over 19 candidate
// inverse scales -(nmax + 0.1 i) / max, i = -9..9.
SF_HOST_DEVICE float fit_symmetric_scale(int n, int nmax, const float* x, int8_t* levels) {
  float max, amax;
  absmax_of(n, x, max, amax);
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) levels[i] = 0;
    return 0.0f;
  }
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx, suml2;
  symmetric_sums(n, nmax, x, iscale, sumlx, suml2);
  symmetric_levels(n, nmax, x, iscale, levels);
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(step)) / max;
    symmetric_sums(n, nmax, x, iscale, sumlx, suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      symmetric_levels(n, nmax, x, iscale, levels);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// llama.cpp's make_q3_quants with do_rmse: symmetric levels -nmax..nmax-1 (returned + nmax), then
// up to 5 passes moving single levels while the x^2-weighted least-squares fit improves.
SF_HOST_DEVICE float fit_symmetric_scale_refined(int n, int nmax, const float* x, int8_t* levels) {
  float max, amax;
  absmax_of(n, x, max, amax);
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) levels[i] = 0;
    return 0.0f;
  }
  const float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_of(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    levels[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i], fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i], old_l = static_cast<float>(levels[i]);
      float slx = sumlx - w * x[i] * old_l;
      if (slx <= 0) continue;
      float sl2 = suml2 - w * old_l * old_l;
      const int new_l = clamp_of(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
      if (new_l == levels[i]) continue;
      const float fl = static_cast<float>(new_l);
      slx += w * x[i] * fl;
      sl2 += w * fl * fl;
      if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
        levels[i] = static_cast<int8_t>(new_l);
        sumlx = slx;
        suml2 = sl2;
        ++changed;
      }
    }
    if (changed == 0) break;
  }
  for (int i = 0; i < n; ++i) levels[i] = static_cast<int8_t>(levels[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Packs 2-bit levels into Q2_K / Q3_K's qs plane (the inverse of the dequantizers' two_bits).
SF_HOST_DEVICE void pack_two_bits(const uint8_t* levels, uint8_t* qs) {
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const uint8_t* L = levels + 128 * h + l;
      qs[32 * h + l] = static_cast<uint8_t>(L[0] | (L[32] << 2) | (L[64] << 4) | (L[96] << 6));
    }
}

SF_HOST_DEVICE void quantize_q2_k(const float* x, uint8_t* b) {
  uint8_t* scales = b;
  uint8_t* qs = b + 16;
  uint8_t levels[kSuperBlock];
  float sub_scales[16], sub_mins[16], weights[16];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 16; ++j) {
    for (int l = 0; l < 16; ++l) weights[l] = fabsf(x[16 * j + l]);
    sub_scales[j] = fit_scale_offset(16, 3, x + 16 * j, weights, levels + 16 * j, &sub_mins[j], -0.5f, 0.1f, 15, true);
    max_scale = max_of(max_scale, sub_scales[j]);
    max_min = max_of(max_min, sub_mins[j]);
  }
  // Sub-block scales and mins as 4-bit multiples of d = max_scale / 15 and dmin = max_min / 15.
  if (max_scale > 0) {
    const float iscale = 15.0f / max_scale;
    for (int j = 0; j < 16; ++j) scales[j] = static_cast<uint8_t>(nearest_int(iscale * sub_scales[j]));
    store_f16(b + 80, f16_bits(max_scale / 15.0f));
  } else {
    for (int j = 0; j < 16; ++j) scales[j] = 0;
    store_f16(b + 80, f16_bits(0.0f));
  }
  if (max_min > 0) {
    const float iscale = 15.0f / max_min;
    for (int j = 0; j < 16; ++j) scales[j] |= static_cast<uint8_t>(nearest_int(iscale * sub_mins[j]) << 4);
    store_f16(b + 82, f16_bits(max_min / 15.0f));
  } else {
    store_f16(b + 82, f16_bits(0.0f));
  }
  // Requantize against the scales as stored.
  const float d_all = load_f16(b + 80), dmin_all = load_f16(b + 82);
  for (int j = 0; j < 16; ++j) {
    const float d = d_all * static_cast<float>(scales[j] & 0xf);
    if (d == 0) continue;
    const float dm = dmin_all * static_cast<float>(scales[j] >> 4);
    for (int l = 0; l < 16; ++l)
      levels[16 * j + l] = static_cast<uint8_t>(clamp_of(nearest_int((x[16 * j + l] + dm) / d), 0, 3));
  }
  pack_two_bits(levels, qs);
}

SF_HOST_DEVICE void quantize_q3_k(const float* x, uint8_t* b) {
  uint8_t* hmask = b;
  uint8_t* qs = b + 32;
  uint8_t* scales = b + 96;
  int8_t levels[kSuperBlock];
  float sub_scales[16];
  for (int j = 0; j < 16; ++j) sub_scales[j] = fit_symmetric_scale_refined(16, 4, x + 16 * j, levels + 16 * j);
  float max_scale, amax;
  absmax_of(16, sub_scales, max_scale, amax);
  for (int i = 0; i < 12; ++i) scales[i] = 0;
  if (max_scale != 0) {
    // 6-bit signed sub-block scales (offset 32): low nibbles in bytes 0..7, high 2 bits in 8..11.
    const float iscale = -32.0f / max_scale;
    for (int j = 0; j < 16; ++j) {
      const int l = clamp_of(static_cast<int>(static_cast<int8_t>(nearest_int(iscale * sub_scales[j]))), -32, 31) + 32;
      if (j < 8)
        scales[j] = static_cast<uint8_t>(l & 0xf);
      else
        scales[j - 8] |= static_cast<uint8_t>((l & 0xf) << 4);
      scales[8 + j % 4] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
    }
    store_f16(b + 108, f16_bits(1 / iscale));
  } else {
    store_f16(b + 108, f16_bits(0.0f));
  }
  const float d_all = load_f16(b + 108);
  for (int j = 0; j < 16; ++j) {
    const float d = d_all * static_cast<float>(q3k_scale(scales, j));
    if (d == 0) continue;
    for (int l = 0; l < 16; ++l)
      levels[16 * j + l] = static_cast<int8_t>(clamp_of(nearest_int(x[16 * j + l] / d), -4, 3) + 4);
  }
  // Levels 0..7: bit 2 goes to hmask (element e: bit e / 32 of byte e % 32), bits 0..1 to qs.
  for (int i = 0; i < 32; ++i) hmask[i] = 0;
  uint8_t low[kSuperBlock];
  for (int e = 0; e < kSuperBlock; ++e) {
    if (levels[e] > 3) hmask[e % 32] |= static_cast<uint8_t>(1u << (e / 32));
    low[e] = static_cast<uint8_t>(levels[e] & 3);
  }
  pack_two_bits(low, qs);
}

// Q4_K (levels 0..15) and Q5_K (0..31): 8 sub-blocks of 32, each fitted with scale and offset,
// weighted by sqrt(mean x^2) + |x|; their scales and offsets stored as 6-bit multiples of d, dmin.
SF_HOST_DEVICE void quantize_q45_k(const float* x, uint8_t* b, bool five_bits) {
  const int nmax = five_bits ? 31 : 15;
  uint8_t* scales = b + 4;
  uint8_t levels[kSuperBlock];
  float sub_scales[8], sub_mins[8], weights[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = sqrtf(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(xs[l]);
    sub_scales[j] = five_bits
                        ? fit_scale_offset(32, nmax, xs, weights, levels + 32 * j, &sub_mins[j], -0.5f, 0.1f, 15, false)
                        : fit_scale_offset(32, nmax, xs, weights, levels + 32 * j, &sub_mins[j], -1.0f, 0.1f, 20, false);
    max_scale = max_of(max_scale, sub_scales[j]);
    max_min = max_of(max_min, sub_mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  for (int j = 0; j < 8; ++j) {
    const uint8_t ls = min_of<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * sub_scales[j])));
    const uint8_t lm = min_of<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * sub_mins[j])));
    if (j < 4) {
      scales[j] = ls;
      scales[j + 4] = lm;
    } else {
      scales[j + 4] = static_cast<uint8_t>((ls & 0xf) | ((lm & 0xf) << 4));
      scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  store_f16(b, f16_bits(max_scale / 63.0f));
  store_f16(b + 2, f16_bits(max_min / 63.0f));
  const float d_all = load_f16(b), dmin_all = load_f16(b + 2);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    k4_scale_min(scales, j, sc, m);
    const float d = d_all * static_cast<float>(sc);
    if (d == 0) continue;
    const float dm = dmin_all * static_cast<float>(m);
    for (int l = 0; l < 32; ++l)
      levels[32 * j + l] = static_cast<uint8_t>(clamp_of(nearest_int((x[32 * j + l] + dm) / d), 0, nmax));
  }
  // Element 64 c + 32 h + l: nibble h of qs[32 c + l]; Q5_K's fifth bit: bit (e / 32) of qh[l].
  uint8_t* qh = b + 16;
  uint8_t* qs = five_bits ? b + 48 : b + 16;
  if (five_bits)
    for (int l = 0; l < 32; ++l) qh[l] = 0;
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      const int l0 = levels[64 * c + l], l1 = levels[64 * c + 32 + l];
      qs[32 * c + l] = static_cast<uint8_t>((l0 & 0xf) | ((l1 & 0xf) << 4));
      if (five_bits) qh[l] |= static_cast<uint8_t>(((l0 >> 4) << (2 * c)) | ((l1 >> 4) << (2 * c + 1)));
    }
}

SF_HOST_DEVICE void quantize_q6_k(const float* x, uint8_t* b) {
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  auto* scales = reinterpret_cast<int8_t*>(b + 192);
  int8_t levels[kSuperBlock];
  float sub_scales[16];
  for (int j = 0; j < 16; ++j) sub_scales[j] = fit_symmetric_scale(16, 32, x + 16 * j, levels + 16 * j);
  float max_scale, max_abs_scale;
  absmax_of(16, sub_scales, max_scale, max_abs_scale);
  if (max_abs_scale < kGroupMaxEps) {
    for (int i = 0; i < 210; ++i) b[i] = 0;
    return;
  }
  // 8-bit signed sub-block scales, multiples of d = max_scale / -128.
  const float iscale = -128.0f / max_scale;
  store_f16(b + 208, f16_bits(1 / iscale));
  for (int j = 0; j < 16; ++j) scales[j] = static_cast<int8_t>(min_of(127, nearest_int(iscale * sub_scales[j])));
  const float d_all = load_f16(b + 208);
  for (int j = 0; j < 16; ++j) {
    const float d = d_all * static_cast<float>(scales[j]);
    if (d == 0) continue;
    for (int l = 0; l < 16; ++l)
      levels[16 * j + l] = static_cast<int8_t>(clamp_of(nearest_int(x[16 * j + l] / d), -32, 31) + 32);
  }
  // Element 128 h + r: low nibble (r / 64) of ql[64 h + r % 64], 2 high bits 2 (r / 32) of qh[32 h + r % 32].
  for (int i = 0; i < 192; ++i) b[i] = 0;
  for (int e = 0; e < kSuperBlock; ++e) {
    const int h = e / 128, r = e % 128, level = levels[e];
    ql[64 * h + r % 64] |= static_cast<uint8_t>((level & 0xf) << (4 * (r / 64)));
    qh[32 * h + r % 32] |= static_cast<uint8_t>((level >> 4) << (2 * (r / 32)));
  }
}

// ---- Inferflow Qk_B32 / Qk_B64 and Q3H_B64 ------------------------------------------------------
// A block is [min fp16][scale fp16][codes], the codes a little-endian bit stream (code i occupies
// stream bits [i b, i b + b), stream bit t is bit t % 8 of byte t / 8); Q3H's code holds two
// weights, q[2i] * 11 + q[2i+1]. Formulas: quant/inferflow_blocks.cpp.
struct InferflowGeometry {
  int block_elems = 0;  // 0: not an Inferflow type
  int code_bits = 0;    // bits per code
  int codes = 0;        // codes per block
  int levels = 0;       // largest level L
  bool paired = false;  // Q3H: one code holds two weights
  SF_HOST_DEVICE int block_bytes() const { return 4 + codes * code_bits / 8; }
};

SF_HOST_DEVICE InferflowGeometry inferflow_geometry(DType type) {
  switch (type) {
    case DType::Q2_B32: return {32, 2, 32, 3, false};
    case DType::Q3_B32: return {32, 3, 32, 7, false};
    case DType::Q4_B32: return {32, 4, 32, 15, false};
    case DType::Q5_B32: return {32, 5, 32, 31, false};
    case DType::Q6_B32: return {32, 6, 32, 63, false};
    case DType::Q8_B32: return {32, 8, 32, 255, false};
    case DType::Q2_B64: return {64, 2, 64, 3, false};
    case DType::Q3_B64: return {64, 3, 64, 7, false};
    case DType::Q4_B64: return {64, 4, 64, 15, false};
    case DType::Q5_B64: return {64, 5, 64, 31, false};
    case DType::Q6_B64: return {64, 6, 64, 63, false};
    case DType::Q8_B64: return {64, 8, 64, 255, false};
    case DType::Q3H_B64: return {64, 7, 32, 10, true};
    default: return {};
  }
}

SF_HOST_DEVICE void write_code(uint8_t* stream, int index, int bits, uint32_t code) {
  for (int t = 0; t < bits; ++t) {
    const int bit = index * bits + t;
    stream[bit / 8] |= static_cast<uint8_t>(((code >> t) & 1u) << (bit % 8));
  }
}

// The fp16 nearest to a double (ties to even), rounded once: scaling by a power of two is exact,
// so nearbyint rounds the fp16 mantissa directly. Overflow gives infinity.
SF_HOST_DEVICE uint16_t f64_to_f16(double value) {
  if (value == 0 || !is_finite(value)) return f16_bits(static_cast<float>(value));
  const int exponent = max_of(ilogb(value), -14);  // below 2^-14 the subnormals share one
  const double rounded = ldexp(nearbyint(ldexp(value, 10 - exponent)), exponent - 10);
  return f16_bits(static_cast<float>(rounded));  // exact: `rounded` is an fp16 value (or >= 65536)
}

// One block; false (the block written with its non-finite fields) when min or scale is not a
// finite fp16 (|values| > 65504): the caller reports it.
SF_HOST_DEVICE bool quantize_inferflow_block(const InferflowGeometry& g, const float* x, uint8_t* block) {
  float min = x[0], max = x[0];
  for (int i = 1; i < g.block_elems; ++i) {
    min = min_of(min, x[i]);
    max = max_of(max, x[i]);
  }
  const uint16_t m_bits = f16_bits(min);
  const uint16_t s_bits = f64_to_f16((static_cast<double>(max) - static_cast<double>(min)) / g.levels);
  const float m = f16_value(m_bits), s = f16_value(s_bits);
  for (int i = 0; i < g.block_bytes(); ++i) block[i] = 0;
  store_f16(block, m_bits);
  store_f16(block + 2, s_bits);
  if (!is_finite(m) || !is_finite(s)) return false;
  if (s == 0) return true;
  uint8_t* stream = block + 4;
  for (int i = 0; i < g.codes; ++i) {
    uint32_t code = 0;
    for (int half = 0; half < (g.paired ? 2 : 1); ++half) {
      const float w = x[g.paired ? 2 * i + half : i];
      const double t = floor((static_cast<double>(w) - static_cast<double>(m)) / static_cast<double>(s) + 0.5);
      code = code * 11 + static_cast<uint32_t>(clamp_of(t, 0.0, static_cast<double>(g.levels)));
    }
    write_code(stream, i, g.code_bits, code);
  }
  return true;
}

// ---- FP8 E4M3 and int8 groups: rows of [f32 scales, padded to 16 bytes][codes] --------------------
// One group of n elements: its scale into `scale_field`, its codes into `codes`.
// FP8: scale = absmax / 448, e = e4m3(w / scale); int8: scale = absmax / 127, q = round-even(w /
// scale). A group of zeros (or below the smallest f32 scale) stores scale 0 and zero codes.
SF_HOST_DEVICE void quantize_fp8_group(const float* x, int64_t n, uint8_t* scale_field, uint8_t* codes) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < n; ++i) absmax = max_of(absmax, fabsf(x[i]));
  const float scale = absmax / 448.0f;
  store_f32(scale_field, scale);
  for (int64_t i = 0; i < n; ++i) codes[i] = scale == 0.0f ? uint8_t{0} : e4m3_bits(x[i] / scale);
}
SF_HOST_DEVICE void quantize_int8_group(const float* x, int64_t n, uint8_t* scale_field, uint8_t* codes) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < n; ++i) absmax = max_of(absmax, fabsf(x[i]));
  const float scale = absmax / 127.0f;
  store_f32(scale_field, scale);
  for (int64_t i = 0; i < n; ++i) {
    const float q = scale == 0.0f ? 0.0f : nearbyintf(x[i] / scale);  // ties to even
    codes[i] = static_cast<uint8_t>(static_cast<int8_t>(clamp_of(q, -127.0f, 127.0f)));
  }
}
// Bytes of a group row's padded scale area (FP8 and int8 rows of `groups` groups).
SF_HOST_DEVICE int64_t group_scale_bytes(int64_t groups) { return (groups * 4 + 15) / 16 * 16; }

// ---- one block of any GGUF type ----------------------------------------------------------------
// Quantizes one block of a GGUF type (Q4_0 .. Q6_K); false for any other type.
SF_HOST_DEVICE bool quantize_gguf_block(DType type, const float* x, uint8_t* b) {
  switch (type) {
    case DType::Q4_0: quantize_q4_0(x, b); return true;
    case DType::Q4_1: quantize_q4_1(x, b); return true;
    case DType::Q5_0: quantize_q5_0(x, b); return true;
    case DType::Q5_1: quantize_q5_1(x, b); return true;
    case DType::Q8_0: quantize_q8_0(x, b); return true;
    case DType::Q2_K: quantize_q2_k(x, b); return true;
    case DType::Q3_K: quantize_q3_k(x, b); return true;
    case DType::Q4_K: quantize_q45_k(x, b, false); return true;
    case DType::Q5_K: quantize_q45_k(x, b, true); return true;
    case DType::Q6_K: quantize_q6_k(x, b); return true;
    default: return false;
  }
}

}  // namespace splitflow::quant::blocks
