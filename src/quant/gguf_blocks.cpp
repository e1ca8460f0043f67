// quant/gguf_blocks.cpp — GGUF / llama.cpp blocks Q4_0 .. Q6_K: scalar reference codecs.
//
// Dequantization does each element's float32 arithmetic in the order gguf.quants.dequantize (numpy)
// does, so results are bit-identical to it (quant/ compiles with -ffp-contract=off: no fused
// multiply-adds). Quantization re-implements llama.cpp's reference quantizers (quantize_row_*_ref
// in ggml-quants.c, no importance matrix) with the same float32 operation order: every type is
// byte-identical to them (tests/quant, against llama.cpp b11434), and Q4_0 .. Q8_0 also to
// gguf.quants.quantize, which ports the same reference.
#include "core/error.h"
#include "quant/codecs.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace splitflow::quant::detail {

namespace {

constexpr int kSuperBlock = 256;  // QK_K
constexpr float kGroupMaxEps = 1e-15f;  // llama.cpp's GROUP_MAX_EPS: a sub-block below it is all zero

// Round to nearest, ties to even (llama.cpp's nearest_int, which adds 1.5 * 2^23).
int nearest_int(float value) { return static_cast<int>(std::nearbyint(value)); }

uint16_t f16_bits(float value) { return f32_to_f16(value); }

// ---- Q4_0 Q4_1 Q5_0 Q5_1 Q8_0: blocks of 32 --------------------------------------------------
//  Q4_0: d f16, qs[16]            (low nibbles elements 0..15, high nibbles 16..31)
//  Q4_1: d f16, m f16, qs[16]
//  Q5_0: d f16, qh u32, qs[16]    (qh bit j: the fifth bit of element j)
//  Q5_1: d f16, m f16, qh u32, qs[16]
//  Q8_0: d f16, qs[32] int8

int nibble(const uint8_t* qs, int j) { return j < 16 ? (qs[j] & 0xf) : (qs[j - 16] >> 4); }
uint32_t load_u32(const uint8_t* bytes) {
  uint32_t value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

void dequantize_q4_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(nibble(b + 2, j) - 8);
}
void dequantize_q4_1(const uint8_t* b, float* y) {
  const float d = load_f16(b), m = load_f16(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(nibble(b + 4, j)) + m;
}
void dequantize_q5_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint32_t qh = load_u32(b + 2);
  for (int j = 0; j < 32; ++j) {
    const int q = nibble(b + 6, j) | static_cast<int>(((qh >> j) & 1u) << 4);
    y[j] = d * static_cast<float>(q - 16);
  }
}
void dequantize_q5_1(const uint8_t* b, float* y) {
  const float d = load_f16(b), m = load_f16(b + 2);
  const uint32_t qh = load_u32(b + 4);
  for (int j = 0; j < 32; ++j) {
    const int q = nibble(b + 8, j) | static_cast<int>(((qh >> j) & 1u) << 4);
    y[j] = d * static_cast<float>(q) + m;
  }
}
void dequantize_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// The element with the largest magnitude, signed (the first one on ties), as llama.cpp picks it.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  return max;
}

void store_q4_nibbles(const uint8_t* q, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((q[j] & 0xf) | ((q[j + 16] & 0xf) << 4));
}
void store_q5_high_bits(const uint8_t* q, uint8_t* qh) {
  uint32_t bits = 0;
  for (int j = 0; j < 32; ++j) bits |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
  std::memcpy(qh, &bits, sizeof bits);
}

// Symmetric 4/5-bit: d = max / -2^(bits-1), q = min(2^bits - 1, trunc(x / d + 2^(bits-1) + 0.5)).
void quantize_symmetric(const float* x, uint8_t* q, uint8_t* d_field, int bits) {
  const int half = 1 << (bits - 1), top = (1 << bits) - 1;
  const float d = signed_absmax(x, 32) / static_cast<float>(-half);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(d_field, f16_bits(d));
  for (int j = 0; j < 32; ++j) {
    const float scaled = x[j] * id;
    q[j] = static_cast<uint8_t>(std::min(top, static_cast<int>(scaled + (static_cast<float>(half) + 0.5f))));
  }
}
// Min + scale 4/5-bit: d = (max - min) / (2^bits - 1), q = min(2^bits - 1, trunc((x - min) / d + 0.5)).
void quantize_affine(const float* x, uint8_t* q, uint8_t* d_field, uint8_t* m_field, int bits) {
  const int top = (1 << bits) - 1;
  float min = x[0], max = x[0];
  for (int j = 1; j < 32; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / static_cast<float>(top);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(d_field, f16_bits(d));
  store_f16(m_field, f16_bits(min));
  for (int j = 0; j < 32; ++j) {
    const float scaled = (x[j] - min) * id;
    q[j] = static_cast<uint8_t>(std::min(top, static_cast<int>(scaled + 0.5f)));
  }
}

void quantize_q4_0(const float* x, uint8_t* b) {
  uint8_t q[32];
  quantize_symmetric(x, q, b, 4);
  store_q4_nibbles(q, b + 2);
}
void quantize_q4_1(const float* x, uint8_t* b) {
  uint8_t q[32];
  quantize_affine(x, q, b, b + 2, 4);
  store_q4_nibbles(q, b + 4);
}
void quantize_q5_0(const float* x, uint8_t* b) {
  uint8_t q[32];
  quantize_symmetric(x, q, b, 5);
  store_q5_high_bits(q, b + 2);
  store_q4_nibbles(q, b + 6);
}
void quantize_q5_1(const float* x, uint8_t* b) {
  uint8_t q[32];
  quantize_affine(x, q, b, b + 2, 5);
  store_q5_high_bits(q, b + 4);
  store_q4_nibbles(q, b + 8);
}
void quantize_q8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(b, f16_bits(d));
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
}

// ---- K-quants: super-blocks of 256 --------------------------------------------------------------
//  Q2_K (84):  scales[16] (low nibble scale, high nibble min), qs[64], d f16, dmin f16
//  Q3_K (110): hmask[32], qs[64], scales[12] (16 x 6 bits, offset 32), d f16
//  Q4_K (144): d f16, dmin f16, scales[12] (8 scales + 8 mins, 6 bits), qs[128]
//  Q5_K (176): d f16, dmin f16, scales[12], qh[32], qs[128]
//  Q6_K (210): ql[128], qh[64], scales[16] int8, d f16
// Element e of a 2-bit plane (Q2_K, Q3_K low bits): e = 128 h + 32 s + l -> bits 2s of qs[32 h + l].

int two_bits(const uint8_t* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; }

// Q4_K / Q5_K 6-bit scale and min of sub-block j (ggml's get_scale_min_k4).
void k4_scale_min(const uint8_t* scales, int j, int& scale, int& min) {
  if (j < 4) {
    scale = scales[j] & 63;
    min = scales[j + 4] & 63;
  } else {
    scale = (scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4);
    min = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}
// Q3_K 6-bit scale of sub-block j, minus its offset of 32.
int q3k_scale(const uint8_t* scales, int j) {
  const int low = j < 8 ? (scales[j] & 0xf) : (scales[j - 8] >> 4);
  const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

void dequantize_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = load_f16(b + 80), dmin = load_f16(b + 82);
  for (int e = 0; e < kSuperBlock; ++e) {
    const uint8_t sc = scales[e / 16];
    const float dl = d * static_cast<float>(sc & 0xf), ml = dmin * static_cast<float>(sc >> 4);
    y[e] = dl * static_cast<float>(two_bits(qs, e)) - ml;
  }
}
void dequantize_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* scales = b + 96;
  const float d = load_f16(b + 108);
  for (int e = 0; e < kSuperBlock; ++e) {
    const float dl = d * static_cast<float>(q3k_scale(scales, e / 16));
    // hmask bit (e / 32) of byte e % 32; a clear bit subtracts 4.
    const int high = (hmask[e % 32] >> (e / 32)) & 1;
    y[e] = dl * static_cast<float>(two_bits(qs, e) - (high ? 0 : 4));
  }
}
// Element e = 64 c + 32 h + l of Q4_K / Q5_K: nibble h of qs[32 c + l], sub-block e / 32.
void dequantize_q45_k(const uint8_t* b, float* y, bool five_bits) {
  const float d = load_f16(b), dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = five_bits ? b + 48 : b + 16;
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    k4_scale_min(scales, j, sc, m);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xf;
      if (five_bits) q |= ((qh[l] >> j) & 1) << 4;
      y[32 * j + l] = dl * static_cast<float>(q) - ml;
    }
  }
}
// Element e = 128 h + r of Q6_K: low 4 bits are nibble (r / 64) of ql[64 h + r % 64], high 2 bits
// are bits 2 (r / 32) of qh[32 h + r % 32]; sub-block e / 16.
void dequantize_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int e = 0; e < kSuperBlock; ++e) {
    const int h = e / 128, r = e % 128;
    const int low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xf;
    const int high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
    const float dl = d * static_cast<float>(scales[e / 16]);
    y[e] = dl * static_cast<float>((low | (high << 4)) - 32);
  }
}

// llama.cpp's make_qkx2_quants: levels 0..nmax for x ~ scale * level - offset (offset >= 0),
// fitted by weighted least squares over a grid of candidate inverse scales
// (nmax + rmin + rdelta * i) / (max - min), i = 0..steps, keeping the one of least weighted error
// (absolute when use_mad, else squared). Returns the scale; *offset gets the (positive) offset.
float fit_scale_offset(int n, int nmax, const float* x, const float* weights, uint8_t* levels, float* offset,
                       float rmin, float rdelta, int steps, bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += weights[i];
    sum_x += weights[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(levels, levels + n, uint8_t{0});
    *offset = -min;
    return 0.0f;
  }
  const auto error_of = [&](float scale, float shift, const uint8_t* l) {
    float error = 0;
    for (int i = 0; i < n; ++i) {
      float diff = scale * static_cast<float>(l[i]) + shift - x[i];
      diff = use_mad ? std::fabs(diff) : diff * diff;
      error += weights[i] * diff;
    }
    return error;
  };
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  for (int i = 0; i < n; ++i)
    levels[i] = static_cast<uint8_t>(std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax));
  float best_error = error_of(scale, min, levels);
  uint8_t trial[32];
  for (int step = 0; step <= steps; ++step) {
    iscale = (rmin + rdelta * static_cast<float>(step) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
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
    const float error = error_of(this_scale, this_min, trial);
    if (error < best_error) {
      std::copy(trial, trial + n, levels);
      best_error = error;
      scale = this_scale;
      min = this_min;
    }
  }
  *offset = -min;
  return scale;
}

// The signed element of largest magnitude (first on ties) and that magnitude.
void absmax_of(int n, const float* x, float& max, float& amax) {
  max = 0;
  amax = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
}

// llama.cpp's make_qx_quants with rmse_type 1 and no importance: symmetric levels -nmax..nmax-1
// (returned + nmax) for x ~ scale * level, least squares weighted by x^2 over 19 candidate
// inverse scales -(nmax + 0.1 i) / max, i = -9..9.
float fit_symmetric_scale(int n, int nmax, const float* x, int8_t* levels) {
  float max, amax;
  absmax_of(n, x, max, amax);
  if (amax < kGroupMaxEps) {
    std::fill(levels, levels + n, int8_t{0});
    return 0.0f;
  }
  const auto sums = [&](float iscale, float& sumlx, float& suml2) {
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const float l = static_cast<float>(std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
  };
  const auto set_levels = [&](float iscale) {
    for (int i = 0; i < n; ++i)
      levels[i] = static_cast<int8_t>(nmax + std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1));
  };
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx, suml2;
  sums(iscale, sumlx, suml2);
  set_levels(iscale);
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(step)) / max;
    sums(iscale, sumlx, suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      set_levels(iscale);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// llama.cpp's make_q3_quants with do_rmse: symmetric levels -nmax..nmax-1 (returned + nmax), then
// up to 5 passes moving single levels while the x^2-weighted least-squares fit improves.
float fit_symmetric_scale_refined(int n, int nmax, const float* x, int8_t* levels) {
  float max, amax;
  absmax_of(n, x, max, amax);
  if (amax < kGroupMaxEps) {
    std::fill(levels, levels + n, int8_t{0});
    return 0.0f;
  }
  const float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
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
      const int new_l = std::clamp(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
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

// Packs 2-bit levels into Q2_K / Q3_K's qs plane (the inverse of two_bits).
void pack_two_bits(const uint8_t* levels, uint8_t* qs) {
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const uint8_t* L = levels + 128 * h + l;
      qs[32 * h + l] = static_cast<uint8_t>(L[0] | (L[32] << 2) | (L[64] << 4) | (L[96] << 6));
    }
}

void quantize_q2_k(const float* x, uint8_t* b) {
  uint8_t* scales = b;
  uint8_t* qs = b + 16;
  uint8_t levels[kSuperBlock];
  float sub_scales[16], sub_mins[16], weights[16];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 16; ++j) {
    for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
    sub_scales[j] = fit_scale_offset(16, 3, x + 16 * j, weights, levels + 16 * j, &sub_mins[j], -0.5f, 0.1f, 15, true);
    max_scale = std::max(max_scale, sub_scales[j]);
    max_min = std::max(max_min, sub_mins[j]);
  }
  // Sub-block scales and mins as 4-bit multiples of d = max_scale / 15 and dmin = max_min / 15.
  if (max_scale > 0) {
    const float iscale = 15.0f / max_scale;
    for (int j = 0; j < 16; ++j) scales[j] = static_cast<uint8_t>(nearest_int(iscale * sub_scales[j]));
    store_f16(b + 80, f16_bits(max_scale / 15.0f));
  } else {
    std::fill(scales, scales + 16, uint8_t{0});
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
      levels[16 * j + l] = static_cast<uint8_t>(std::clamp(nearest_int((x[16 * j + l] + dm) / d), 0, 3));
  }
  pack_two_bits(levels, qs);
}

void quantize_q3_k(const float* x, uint8_t* b) {
  uint8_t* hmask = b;
  uint8_t* qs = b + 32;
  uint8_t* scales = b + 96;
  int8_t levels[kSuperBlock];
  float sub_scales[16];
  float max_scale = 0, amax = 0;
  for (int j = 0; j < 16; ++j) {
    sub_scales[j] = fit_symmetric_scale_refined(16, 4, x + 16 * j, levels + 16 * j);
    if (std::fabs(sub_scales[j]) > amax) {
      amax = std::fabs(sub_scales[j]);
      max_scale = sub_scales[j];
    }
  }
  std::fill(scales, scales + 12, uint8_t{0});
  if (max_scale != 0) {
    // 6-bit signed sub-block scales (offset 32): low nibbles in bytes 0..7, high 2 bits in 8..11.
    const float iscale = -32.0f / max_scale;
    for (int j = 0; j < 16; ++j) {
      const int l = std::clamp(static_cast<int>(static_cast<int8_t>(nearest_int(iscale * sub_scales[j]))), -32, 31) + 32;
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
      levels[16 * j + l] = static_cast<int8_t>(std::clamp(nearest_int(x[16 * j + l] / d), -4, 3) + 4);
  }
  // Levels 0..7: bit 2 goes to hmask (element e: bit e / 32 of byte e % 32), bits 0..1 to qs.
  std::fill(hmask, hmask + 32, uint8_t{0});
  uint8_t low[kSuperBlock];
  for (int e = 0; e < kSuperBlock; ++e) {
    if (levels[e] > 3) hmask[e % 32] |= static_cast<uint8_t>(1u << (e / 32));
    low[e] = static_cast<uint8_t>(levels[e] & 3);
  }
  pack_two_bits(low, qs);
}

// Q4_K (levels 0..15) and Q5_K (0..31): 8 sub-blocks of 32, each fitted with scale and offset,
// weighted by sqrt(mean x^2) + |x|; their scales and offsets stored as 6-bit multiples of d, dmin.
void quantize_q45_k(const float* x, uint8_t* b, bool five_bits) {
  const int nmax = five_bits ? 31 : 15;
  uint8_t* scales = b + 4;
  uint8_t levels[kSuperBlock];
  float sub_scales[8], sub_mins[8], weights[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    sub_scales[j] = five_bits
                        ? fit_scale_offset(32, nmax, xs, weights, levels + 32 * j, &sub_mins[j], -0.5f, 0.1f, 15, false)
                        : fit_scale_offset(32, nmax, xs, weights, levels + 32 * j, &sub_mins[j], -1.0f, 0.1f, 20, false);
    max_scale = std::max(max_scale, sub_scales[j]);
    max_min = std::max(max_min, sub_mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  for (int j = 0; j < 8; ++j) {
    const uint8_t ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * sub_scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * sub_mins[j])));
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
      levels[32 * j + l] = static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + l] + dm) / d), 0, nmax));
  }
  // Element 64 c + 32 h + l: nibble h of qs[32 c + l]; Q5_K's fifth bit: bit (e / 32) of qh[l].
  uint8_t* qh = b + 16;
  uint8_t* qs = five_bits ? b + 48 : b + 16;
  if (five_bits) std::fill(qh, qh + 32, uint8_t{0});
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      const int l0 = levels[64 * c + l], l1 = levels[64 * c + 32 + l];
      qs[32 * c + l] = static_cast<uint8_t>((l0 & 0xf) | ((l1 & 0xf) << 4));
      if (five_bits) qh[l] |= static_cast<uint8_t>(((l0 >> 4) << (2 * c)) | ((l1 >> 4) << (2 * c + 1)));
    }
}

void quantize_q6_k(const float* x, uint8_t* b) {
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  auto* scales = reinterpret_cast<int8_t*>(b + 192);
  int8_t levels[kSuperBlock];
  float sub_scales[16];
  float max_scale = 0, max_abs_scale = 0;
  for (int j = 0; j < 16; ++j) {
    sub_scales[j] = fit_symmetric_scale(16, 32, x + 16 * j, levels + 16 * j);
    if (std::fabs(sub_scales[j]) > max_abs_scale) {
      max_abs_scale = std::fabs(sub_scales[j]);
      max_scale = sub_scales[j];
    }
  }
  if (max_abs_scale < kGroupMaxEps) {
    std::memset(b, 0, 210);
    return;
  }
  // 8-bit signed sub-block scales, multiples of d = max_scale / -128.
  const float iscale = -128.0f / max_scale;
  store_f16(b + 208, f16_bits(1 / iscale));
  for (int j = 0; j < 16; ++j) scales[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * sub_scales[j])));
  const float d_all = load_f16(b + 208);
  for (int j = 0; j < 16; ++j) {
    const float d = d_all * static_cast<float>(scales[j]);
    if (d == 0) continue;
    for (int l = 0; l < 16; ++l)
      levels[16 * j + l] = static_cast<int8_t>(std::clamp(nearest_int(x[16 * j + l] / d), -32, 31) + 32);
  }
  // Element 128 h + r: low nibble (r / 64) of ql[64 h + r % 64], 2 high bits 2 (r / 32) of qh[32 h + r % 32].
  std::fill(b, b + 192, uint8_t{0});
  for (int e = 0; e < kSuperBlock; ++e) {
    const int h = e / 128, r = e % 128, level = levels[e];
    ql[64 * h + r % 64] |= static_cast<uint8_t>((level & 0xf) << (4 * (r / 64)));
    qh[32 * h + r % 32] |= static_cast<uint8_t>((level >> 4) << (2 * (r / 32)));
  }
}

struct GgufCodec {
  int block_elems;
  int block_bytes;
  void (*dequantize)(const uint8_t*, float*);
  void (*quantize)(const float*, uint8_t*);
};

GgufCodec codec_of(DType type) {
  switch (type) {
    case DType::Q4_0: return {32, 18, dequantize_q4_0, quantize_q4_0};
    case DType::Q4_1: return {32, 20, dequantize_q4_1, quantize_q4_1};
    case DType::Q5_0: return {32, 22, dequantize_q5_0, quantize_q5_0};
    case DType::Q5_1: return {32, 24, dequantize_q5_1, quantize_q5_1};
    case DType::Q8_0: return {32, 34, dequantize_q8_0, quantize_q8_0};
    case DType::Q2_K: return {256, 84, dequantize_q2_k, quantize_q2_k};
    case DType::Q3_K: return {256, 110, dequantize_q3_k, quantize_q3_k};
    case DType::Q4_K:
      return {256, 144, [](const uint8_t* b, float* y) { dequantize_q45_k(b, y, false); },
              [](const float* x, uint8_t* b) { quantize_q45_k(x, b, false); }};
    case DType::Q5_K:
      return {256, 176, [](const uint8_t* b, float* y) { dequantize_q45_k(b, y, true); },
              [](const float* x, uint8_t* b) { quantize_q45_k(x, b, true); }};
    case DType::Q6_K: return {256, 210, dequantize_q6_k, quantize_q6_k};
    default: fail("dtype {} is not a GGUF block type", dtype_name(type));
  }
}

// Byte offsets of each block's fp16 scale fields.
struct ScaleFieldAt {
  std::string_view name;
  int offset;
};
int scale_fields_of(DType type, ScaleFieldAt fields[2]) {
  switch (type) {
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q8_0: fields[0] = {"d", 0}; return 1;
    case DType::Q4_1:
    case DType::Q5_1: fields[0] = {"d", 0}, fields[1] = {"m", 2}; return 2;
    case DType::Q4_K:
    case DType::Q5_K: fields[0] = {"d", 0}, fields[1] = {"dmin", 2}; return 2;
    case DType::Q2_K: fields[0] = {"d", 80}, fields[1] = {"dmin", 82}; return 2;
    case DType::Q3_K: fields[0] = {"d", 108}; return 1;
    case DType::Q6_K: fields[0] = {"d", 208}; return 1;
    default: fail("dtype {} is not a GGUF block type", dtype_name(type));
  }
}

}  // namespace

void dequantize_gguf_row(DType type, const uint8_t* row, float* out, int64_t k) {
  const GgufCodec codec = codec_of(type);
  for (int64_t block = 0; block < k / codec.block_elems; ++block)
    codec.dequantize(row + block * codec.block_bytes, out + block * codec.block_elems);
}

void quantize_gguf_row(DType type, const float* in, uint8_t* row, int64_t k) {
  const GgufCodec codec = codec_of(type);
  for (int64_t block = 0; block < k / codec.block_elems; ++block)
    codec.quantize(in + block * codec.block_elems, row + block * codec.block_bytes);
}

std::optional<BadScale> find_bad_gguf_scale(DType type, const uint8_t* row, int64_t k) {
  const GgufCodec codec = codec_of(type);
  ScaleFieldAt fields[2];
  const int count = scale_fields_of(type, fields);
  for (int64_t block = 0; block < k / codec.block_elems; ++block)
    for (int f = 0; f < count; ++f) {
      const float value = load_f16(row + block * codec.block_bytes + fields[f].offset);
      if (!std::isfinite(value)) return BadScale{block, fields[f].name, value};
    }
  return std::nullopt;
}

}  // namespace splitflow::quant::detail
