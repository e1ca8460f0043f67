// backend/cpu/quant_blocks.h — the CPU kernels' decoders of quantized weight blocks (layouts in
// core/dtype.h, values as quant/quant.h defines them): Codec<T>::decode writes one block's
// floats. The types whose block is one scale and one offset (w = scale * code + offset: Q4_0 ..
// Q8_0, the Inferflow min/max blocks, FP8, the int8 groups) have vector decoders (kVector): under AVX2
// emit_codes hands the codes to a functor as 8-lane float vectors and scales() gives the pair, so
// the GEMV multiplies x by the codes and applies the scale once per block; emit() gives the
// weights themselves. The K-quants and Q3H_B64 go through a block-sized stack buffer. Blocks are addressed by (row, row length k, block index) because the
// FP8 and int8 rows start with their scales.
// Must never: allocate, or call quant/ (the reference codecs the tests hold these against).
#pragma once

#include "backend/cpu/simd.h"
#include "core/dtype.h"
#include "core/error.h"

#include <cstdint>
#include <cstring>

namespace splitflow::cpu::quant_blocks {

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
#ifdef SPLITFLOW_CPU_AVX2
  return _cvtsh_ss(bits);
#else
  return f16_to_f32(bits);
#endif
}
inline float f32_at(const uint8_t* p) {
  float value;
  std::memcpy(&value, p, sizeof value);
  return value;
}
inline uint16_t u16_at(const uint8_t* p) {
  uint16_t value;
  std::memcpy(&value, p, sizeof value);
  return value;
}
inline uint32_t u32_at(const uint8_t* p) {
  uint32_t value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

// e4m3 byte -> float, all 256 codes.
struct E4m3Table {
  float values[256];
  E4m3Table() {
    for (int i = 0; i < 256; ++i) values[i] = e4m3_to_f32(static_cast<uint8_t>(i));
  }
};
inline const float* e4m3_table() {
  static const E4m3Table table;
  return table.values;
}

// K-quant scale/min pair j (6 bits each) of Q4_K / Q5_K (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

template <DType T>
struct Codec;

#ifdef SPLITFLOW_CPU_AVX2
// The 32 nibbles of a Q4 block as floats: element j < 16 is qs[j] & 15, element j + 16 is qs[j] >> 4.
// 8 bytes widened to 32-bit lanes once serve both nibbles (one shuffle per 16 elements).
template <typename F>
inline void emit_nibbles(const uint8_t* qs_ptr, F&& f) {
  const __m256i low4 = _mm256_set1_epi32(0xF);
#pragma GCC unroll 2
  for (int g = 0; g < 2; ++g) {
    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs_ptr + 8 * g)));
    f(8 * g, _mm256_cvtepi32_ps(_mm256_and_si256(bytes, low4)));
    f(16 + 8 * g, _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4)));
  }
}
#endif

// ---- GGUF (ggml-common.h blocks) --------------------------------------------------------------
template <>
struct Codec<DType::Q4_0> {
  static constexpr int64_t kElems = 32, kBytes = 18;
  static constexpr bool kVector = true;
  static void decode(const uint8_t* row, int64_t, int64_t b, float* out) {
    const uint8_t* blk = row + b * kBytes;
    const float d = half_at(blk);
    for (int j = 0; j < 16; ++j) {
      out[j] = d * static_cast<float>((blk[2 + j] & 0xF) - 8);
      out[j + 16] = d * static_cast<float>((blk[2 + j] >> 4) - 8);
    }
  }
  // w = d * (q - 8) = d q - 8 d (exact in an FMA, rounded once).
  static void scales(const uint8_t* row, int64_t, int64_t b, float& scale, float& offset) {
    scale = half_at(row + b * kBytes);
    offset = -8.0f * scale;
  }
#ifdef SPLITFLOW_CPU_AVX2
  template <typename F>
  static void emit_codes(const uint8_t* row, int64_t, int64_t b, F&& f) {
    emit_nibbles(row + b * kBytes + 2, f);
  }
#endif
};

template <>
struct Codec<DType::Q4_1> {
  static constexpr int64_t kElems = 32, kBytes = 20;
  static constexpr bool kVector = true;
  static void decode(const uint8_t* row, int64_t, int64_t b, float* out) {
    const uint8_t* blk = row + b * kBytes;
    const float d = half_at(blk), m = half_at(blk + 2);
    for (int j = 0; j < 16; ++j) {
      out[j] = d * static_cast<float>(blk[4 + j] & 0xF) + m;
      out[j + 16] = d * static_cast<float>(blk[4 + j] >> 4) + m;
    }
  }
  static void scales(const uint8_t* row, int64_t, int64_t b, float& scale, float& offset) {
    scale = half_at(row + b * kBytes);
    offset = half_at(row + b * kBytes + 2);
  }
#ifdef SPLITFLOW_CPU_AVX2
  template <typename F>
  static void emit_codes(const uint8_t* row, int64_t, int64_t b, F&& f) {
    emit_nibbles(row + b * kBytes + 4, f);
  }
#endif
};

#ifdef SPLITFLOW_CPU_AVX2
// Bits e0 .. e0+7 of qh as the 5th bit (16) of 8 lanes.
inline __m256i high_bits8(uint32_t qh, int e0) {
  const __m256i bits = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(qh >> e0)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_slli_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(1)), 4);
}
// Element e of a Q5 block: low nibble (e < 16) or high nibble of qs[e % 16], 5th bit from qh bit e.
template <typename F>
inline void emit_q5(const uint8_t* qs_ptr, uint32_t qh, F&& f) {
  const __m256i low4 = _mm256_set1_epi32(0xF);
#pragma GCC unroll 2
  for (int g = 0; g < 2; ++g) {
    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs_ptr + 8 * g)));
    f(8 * g, _mm256_cvtepi32_ps(_mm256_or_si256(_mm256_and_si256(bytes, low4), high_bits8(qh, 8 * g))));
    f(16 + 8 * g, _mm256_cvtepi32_ps(_mm256_or_si256(_mm256_srli_epi32(bytes, 4), high_bits8(qh, 16 + 8 * g))));
  }
}
#endif

template <>
struct Codec<DType::Q5_0> {
  static constexpr int64_t kElems = 32, kBytes = 22;
  static constexpr bool kVector = true;
  static void decode(const uint8_t* row, int64_t, int64_t b, float* out) {
    const uint8_t* blk = row + b * kBytes;
    const float d = half_at(blk);
    const uint32_t qh = u32_at(blk + 2);
    for (int j = 0; j < 16; ++j) {
      const int x0 = (blk[6 + j] & 0xF) | static_cast<int>(((qh >> j) << 4) & 0x10);
      const int x1 = (blk[6 + j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
      out[j] = d * static_cast<float>(x0 - 16);
      out[j + 16] = d * static_cast<float>(x1 - 16);
    }
  }
  static void scales(const uint8_t* row, int64_t, int64_t b, float& scale, float& offset) {
    scale = half_at(row + b * kBytes);
    offset = -16.0f * scale;
  }
#ifdef SPLITFLOW_CPU_AVX2
  template <typename F>
  static void emit_codes(const uint8_t* row, int64_t, int64_t b, F&& f) {
    const uint8_t* blk = row + b * kBytes;
    emit_q5(blk + 6, u32_at(blk + 2), f);
  }
#endif
};

template <>
struct Codec<DType::Q5_1> {
  static constexpr int64_t kElems = 32, kBytes = 24;
  static constexpr bool kVector = true;
  static void decode(const uint8_t* row, int64_t, int64_t b, float* out) {
    const uint8_t* blk = row + b * kBytes;
    const float d = half_at(blk), m = half_at(blk + 2);
    const uint32_t qh = u32_at(blk + 4);
    for (int j = 0; j < 16; ++j) {
      const int x0 = (blk[8 + j] & 0xF) | static_cast<int>(((qh >> j) << 4) & 0x10);
      const int x1 = (blk[8 + j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
      out[j] = d * static_cast<float>(x0) + m;
      out[j + 16] = d * static_cast<float>(x1) + m;
    }
  }
  static void scales(const uint8_t* row, int64_t, int64_t b, float& scale, float& offset) {
    scale = half_at(row + b * kBytes);
    offset = half_at(row + b * kBytes + 2);
  }
#ifdef SPLITFLOW_CPU_AVX2
  template <typename F>
  static void emit_codes(const uint8_t* row, int64_t, int64_t b, F&& f) {
    const uint8_t* blk = row + b * kBytes;
    emit_q5(blk + 8, u32_at(blk + 4), f);
  }
#endif
};

template <>
struct Codec<DType::Q8_0> {
  static constexpr int64_t kElems = 32, kBytes = 34;
  static constexpr bool kVector = true;
  static void decode(const uint8_t* row, int64_t, int64_t b, float* out) {
    const uint8_t* blk = row + b * kBytes;
    const float d = half_at(blk);
    for (int j = 0; j < 32; ++j) out[j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
  }
  static void scales(const uint8_t* row, int64_t, int64_t b, float& scale, float& offset) {
    scale = half_at(row + b * kBytes);
    offset = 0.0f;
  }
#ifdef SPLITFLOW_CPU_AVX2
  template <typename F>
  static void emit_codes(const uint8_t* row, int64_t, int64_t b, F&& f) {
    const uint8_t* blk = row + b * kBytes;
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * g));
      f(8 * g, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    }
  }
#endif
};

template <>
struct Codec<DType::Q2_K> {  // scales[16], qs[64], d, dmin
  static constexpr int64_t kElems = 256, kBytes = 84;
  static constexpr bool kVector = false;
  static void decode(const uint8_t* row, int64_t, int64_t b, float* out) {
    const uint8_t* blk = row + b * kBytes;
    const uint8_t* scales = blk;
    const uint8_t* q = blk + 16;
    const float d = half_at(blk + 80), dmin = half_at(blk + 82);
    int is = 0;
    for (int n = 0; n < 256; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        for (int half = 0; half < 2; ++half) {
          const uint8_t sc = scales[is++];
          const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l) *out++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
        }
        shift += 2;
      }
      q += 32;
    }
  }
#ifdef SPLITFLOW_CPU_AVX2
  static constexpr bool kDirect = true;
  template <typename F>
  static void emit(const uint8_t* row, int64_t, int64_t b, F&& f) {
    const uint8_t* blk = row + b * kBytes;
    const float d = half_at(blk + 80), dmin = half_at(blk + 82);
    const __m256i three = _mm256_set1_epi32(3);
    for (int n = 0; n < 2; ++n) {
      const uint8_t* q = blk + 16 + 32 * n;
      const __m256i bytes[4] = {
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))),
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8))),
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 16))),
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 24)))};
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j)
#pragma GCC unroll 2
        for (int half = 0; half < 2; ++half) {
          const uint8_t sc = blk[8 * n + 2 * j + half];
          const __m256 dl = _mm256_set1_ps(d * static_cast<float>(sc & 0xF));
          const __m256 ml = _mm256_set1_ps(-(dmin * static_cast<float>(sc >> 4)));
          const int at = 128 * n + 32 * j + 16 * half;
#pragma GCC unroll 2
          for (int g = 0; g < 2; ++g) {
            const __m256i v = _mm256_and_si256(_mm256_srli_epi32(bytes[2 * half + g], 2 * j), three);
            f(at + 8 * g, _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), dl, ml));
          }
        }
    }
  }
#endif
};

template <>
struct Codec<DType::Q3_K> {  // hmask[32], qs[64], scales[12], d
  static constexpr int64_t kElems = 256, kBytes = 110;
  static constexpr bool kVector = false;
  // The 16 6-bit scales (ggml's kmask unpacking), biased by 32 as stored.
  static void unpack_scales(const uint8_t* blk, int8_t scales[16]) {
    uint32_t aux[4];
    std::memcpy(aux, blk + 96, 12);
    constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    const uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    std::memcpy(scales, aux, 16);
  }
  static void decode(const uint8_t* row, int64_t, int64_t b, float* out) {
    const uint8_t* blk = row + b * kBytes;
    const uint8_t* hm = blk;
    const uint8_t* q = blk + 32;
    const float d_all = half_at(blk + 108);
    int8_t scales[16];
    unpack_scales(blk, scales);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < 256; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        for (int half = 0; half < 2; ++half) {
          const float dl = d_all * static_cast<float>(scales[is++] - 32);
          for (int l = 16 * half; l < 16 * half + 16; ++l)
            *out++ = dl * static_cast<float>(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
        }
        shift += 2;
        m = static_cast<uint8_t>(m << 1);
      }
      q += 32;
    }
  }
#ifdef SPLITFLOW_CPU_AVX2
  static constexpr bool kDirect = true;
  template <typename F>
  static void emit(const uint8_t* row, int64_t, int64_t b, F&& f) {
    const uint8_t* blk = row + b * kBytes;
    const float d_all = half_at(blk + 108);
    int8_t scales[16];
    unpack_scales(blk, scales);
    const __m256i three = _mm256_set1_epi32(3), one = _mm256_set1_epi32(1), four = _mm256_set1_epi32(4);
    __m256i hm[4];
    for (int g = 0; g < 4; ++g)
      hm[g] = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 8 * g)));
    for (int n = 0; n < 2; ++n) {
      const uint8_t* q = blk + 32 + 32 * n;
      __m256i bytes[4];
      for (int g = 0; g < 4; ++g)
        bytes[g] = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * g)));
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j)
#pragma GCC unroll 2
        for (int half = 0; half < 2; ++half) {
          const __m256 dl = _mm256_set1_ps(d_all * static_cast<float>(scales[8 * n + 2 * j + half] - 32));
          const int at = 128 * n + 32 * j + 16 * half;
#pragma GCC unroll 2
          for (int g = 0; g < 2; ++g) {
            const int lane = 2 * half + g;  // bytes l = 8 * lane .. of q and hmask
            const __m256i low = _mm256_and_si256(_mm256_srli_epi32(bytes[lane], 2 * j), three);
            const __m256i high = _mm256_and_si256(_mm256_srli_epi32(hm[lane], 4 * n + j), one);
            // ((q >> shift) & 3) - (bit ? 0 : 4) = low - 4 + 4 * bit
            const __m256i v = _mm256_add_epi32(_mm256_sub_epi32(low, four), _mm256_slli_epi32(high, 2));
            f(at + 8 * g, _mm256_mul_ps(_mm256_cvtepi32_ps(v), dl));
          }
        }
    }
  }
#endif
};

template <>
struct Codec<DType::Q4_K> {  // d, dmin, scales[12], qs[128]
  static constexpr int64_t kElems = 256, kBytes = 144;
  static constexpr bool kVector = false;
  static void decode(const uint8_t* row, int64_t, int64_t b, float* out) {
    const uint8_t* blk = row + b * kBytes;
    const float d = half_at(blk), dmin = half_at(blk + 2);
    const uint8_t* scales = blk + 4;
    const uint8_t* q = blk + 16;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
      uint8_t sc, m;
      scale_min_k4(is, scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *out++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *out++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
#ifdef SPLITFLOW_CPU_AVX2
  static constexpr bool kDirect = true;  // emit() below, no buffer
  template <typename F>
  static void emit(const uint8_t* row, int64_t, int64_t b, F&& f) {
    const uint8_t* blk = row + b * kBytes;
    const float d = half_at(blk), dmin = half_at(blk + 2);
    const uint8_t* scales = blk + 4;
    const __m256i low4 = _mm256_set1_epi32(0xF);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      uint8_t sc, m;
      scale_min_k4(2 * j, scales, sc, m);
      const __m256 d1 = _mm256_set1_ps(d * sc), m1 = _mm256_set1_ps(-(dmin * m));
      scale_min_k4(2 * j + 1, scales, sc, m);
      const __m256 d2 = _mm256_set1_ps(d * sc), m2 = _mm256_set1_ps(-(dmin * m));
      const uint8_t* q = blk + 16 + 32 * j;
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * g)));
        const int base = 64 * j + 8 * g;
        f(base, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(bytes, low4)), d1, m1));
        f(base + 32, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4)), d2, m2));
      }
    }
  }
#endif
};

template <>
struct Codec<DType::Q5_K> {  // d, dmin, scales[12], qh[32], qs[128]
  static constexpr int64_t kElems = 256, kBytes = 176;
  static constexpr bool kVector = false;
  static void decode(const uint8_t* row, int64_t, int64_t b, float* out) {
    const uint8_t* blk = row + b * kBytes;
    const float d = half_at(blk), dmin = half_at(blk + 2);
    const uint8_t* scales = blk + 4;
    const uint8_t* qh = blk + 16;
    const uint8_t* ql = blk + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32) {
      uint8_t sc, m;
      scale_min_k4(is, scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *out++ = d1 * static_cast<float>((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *out++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
#ifdef SPLITFLOW_CPU_AVX2
  static constexpr bool kDirect = true;
  template <typename F>
  static void emit(const uint8_t* row, int64_t, int64_t b, F&& f) {
    const uint8_t* blk = row + b * kBytes;
    const float d = half_at(blk), dmin = half_at(blk + 2);
    const uint8_t* scales = blk + 4;
    const __m256i low4 = _mm256_set1_epi32(0xF), one = _mm256_set1_epi32(1);
    __m256i qh[4];
    for (int g = 0; g < 4; ++g)
      qh[g] = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 16 + 8 * g)));
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      uint8_t sc, m;
      scale_min_k4(2 * j, scales, sc, m);
      const __m256 d1 = _mm256_set1_ps(d * sc), m1 = _mm256_set1_ps(-(dmin * m));
      scale_min_k4(2 * j + 1, scales, sc, m);
      const __m256 d2 = _mm256_set1_ps(d * sc), m2 = _mm256_set1_ps(-(dmin * m));
      const uint8_t* ql = blk + 48 + 32 * j;
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(ql + 8 * g)));
        const __m256i h1 = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(qh[g], 2 * j), one), 4);
        const __m256i h2 = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(qh[g], 2 * j + 1), one), 4);
        const int base = 64 * j + 8 * g;
        f(base, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_or_si256(_mm256_and_si256(bytes, low4), h1)), d1, m1));
        f(base + 32, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_or_si256(_mm256_srli_epi32(bytes, 4), h2)), d2, m2));
      }
    }
  }
#endif
};

template <>
struct Codec<DType::Q6_K> {  // ql[128], qh[64], scales[16] (int8), d
  static constexpr int64_t kElems = 256, kBytes = 210;
  static constexpr bool kVector = false;
  static void decode(const uint8_t* row, int64_t, int64_t b, float* out) {
    const uint8_t* blk = row + b * kBytes;
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const float d = half_at(blk + 208);
    for (int n = 0; n < 256; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        out[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        out[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        out[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        out[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
      out += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
#ifdef SPLITFLOW_CPU_AVX2
  static constexpr bool kDirect = true;
  // 8 consecutive l of a 128-element half at a time: its 4 outputs l, l + 32, l + 64, l + 96.
  template <typename F>
  static void emit(const uint8_t* row, int64_t, int64_t b, F&& f) {
    const uint8_t* blk = row + b * kBytes;
    const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const float d = half_at(blk + 208);
    const __m256i low4 = _mm256_set1_epi32(0xF), two = _mm256_set1_epi32(3), bias = _mm256_set1_epi32(32);
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = blk + 64 * half;
      const uint8_t* qh = blk + 128 + 32 * half;
      const int8_t* scales = sc + 8 * half;
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        const int l = 8 * g, is = l / 16;
        const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(ql + l)));
        const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(ql + l + 32)));
        const __m256i h = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qh + l)));
        const auto code = [&](__m256i low, int shift) {
          const __m256i high = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, shift), two), 4);
          return _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_or_si256(low, high), bias));
        };
        const int at = 128 * half + l;
        f(at, _mm256_mul_ps(code(_mm256_and_si256(a, low4), 0), _mm256_set1_ps(d * scales[is])));
        f(at + 32, _mm256_mul_ps(code(_mm256_and_si256(c, low4), 2), _mm256_set1_ps(d * scales[is + 2])));
        f(at + 64, _mm256_mul_ps(code(_mm256_srli_epi32(a, 4), 4), _mm256_set1_ps(d * scales[is + 4])));
        f(at + 96, _mm256_mul_ps(code(_mm256_srli_epi32(c, 4), 6), _mm256_set1_ps(d * scales[is + 6])));
      }
    }
  }
#endif
};

// ---- Inferflow min/max blocks: fp16 min, fp16 scale, then BITS-bit codes LSB first ----------
template <int BITS, int ELEMS>
struct MinMaxCodec {
  static constexpr int64_t kElems = ELEMS, kBytes = 4 + ELEMS * BITS / 8;
  static constexpr bool kVector = true;
  static void decode(const uint8_t* row, int64_t, int64_t b, float* out) {
    const uint8_t* blk = row + b * kBytes;
    const float m = half_at(blk), s = half_at(blk + 2);
    const uint8_t* codes = blk + 4;
    for (int i = 0; i < ELEMS; ++i) {
      const int bit = i * BITS, byte = bit / 8, shift = bit % 8;
      uint32_t word = codes[byte];
      if (shift + BITS > 8) word |= static_cast<uint32_t>(codes[byte + 1]) << 8;
      out[i] = m + static_cast<float>((word >> shift) & ((1u << BITS) - 1)) * s;
    }
  }
  static void scales(const uint8_t* row, int64_t, int64_t b, float& scale, float& offset) {
    offset = half_at(row + b * kBytes);
    scale = half_at(row + b * kBytes + 2);
  }
#ifdef SPLITFLOW_CPU_AVX2
  // 8 codes are BITS bytes: lanes 0-3 from their first 4 BITS bits, lanes 4-7 from the rest.
  template <typename F>
  static void emit_codes(const uint8_t* row, int64_t, int64_t b, F&& f) {
    const uint8_t* blk = row + b * kBytes;
    const __m256i shifts = _mm256_setr_epi32(0, BITS, 2 * BITS, 3 * BITS, 0, BITS, 2 * BITS, 3 * BITS);
    const __m256i mask = _mm256_set1_epi32((1 << BITS) - 1);
    for (int g = 0; g < ELEMS / 8; ++g) {
      uint64_t word = 0;
      std::memcpy(&word, blk + 4 + g * BITS, BITS);
      const __m256i lanes = _mm256_setr_m128i(_mm_set1_epi32(static_cast<int>(static_cast<uint32_t>(word))),
                                              _mm_set1_epi32(static_cast<int>(static_cast<uint32_t>(word >> (4 * BITS)))));
      const __m256i q = _mm256_and_si256(_mm256_srlv_epi32(lanes, shifts), mask);
      f(8 * g, _mm256_cvtepi32_ps(q));
    }
  }
#endif
};

template <> struct Codec<DType::Q2_B32> : MinMaxCodec<2, 32> {};
template <> struct Codec<DType::Q3_B32> : MinMaxCodec<3, 32> {};
template <> struct Codec<DType::Q4_B32> : MinMaxCodec<4, 32> {};
template <> struct Codec<DType::Q5_B32> : MinMaxCodec<5, 32> {};
template <> struct Codec<DType::Q6_B32> : MinMaxCodec<6, 32> {};
template <> struct Codec<DType::Q8_B32> : MinMaxCodec<8, 32> {};
template <> struct Codec<DType::Q2_B64> : MinMaxCodec<2, 64> {};
template <> struct Codec<DType::Q3_B64> : MinMaxCodec<3, 64> {};
template <> struct Codec<DType::Q4_B64> : MinMaxCodec<4, 64> {};
template <> struct Codec<DType::Q5_B64> : MinMaxCodec<5, 64> {};
template <> struct Codec<DType::Q6_B64> : MinMaxCodec<6, 64> {};
template <> struct Codec<DType::Q8_B64> : MinMaxCodec<8, 64> {};

// Q3H_B64: 32 codes of 7 bits, code i = q[2i] * 11 + q[2i + 1], levels 0..10.
template <>
struct Codec<DType::Q3H_B64> {
  static constexpr int64_t kElems = 64, kBytes = 32;
  static constexpr bool kVector = false;
  static void decode(const uint8_t* row, int64_t, int64_t b, float* out) {
    const uint8_t* blk = row + b * kBytes;
    const float m = half_at(blk), s = half_at(blk + 2);
    const uint8_t* codes = blk + 4;
    for (int i = 0; i < 32; ++i) {
      const int bit = i * 7, byte = bit / 8, shift = bit % 8;
      uint32_t word = codes[byte];
      if (shift + 7 > 8) word |= static_cast<uint32_t>(codes[byte + 1]) << 8;
      const uint32_t code = (word >> shift) & 0x7F;
      out[2 * i] = m + static_cast<float>(code / 11) * s;
      out[2 * i + 1] = m + static_cast<float>(code % 11) * s;
    }
  }
};

// ---- FP8 e4m3 weight-only: a row is its f32 scales padded to 16 bytes, then k e4m3 bytes ------
template <int64_t GROUP>  // 0: one scale per row
struct Fp8Codec {
  static constexpr int64_t kElems = GROUP == 0 ? 16 : GROUP;
  static constexpr bool kVector = true;
  static size_t scale_bytes(int64_t k) {
    const int64_t groups = GROUP == 0 ? (k > 0 ? 1 : 0) : k / GROUP;
    return static_cast<size_t>(groups * 4 + 15) / 16 * 16;
  }
  static float scale(const uint8_t* row, int64_t b) { return f32_at(row + 4 * (GROUP == 0 ? 0 : b)); }
  static void decode(const uint8_t* row, int64_t k, int64_t b, float* out) {
    const float s = scale(row, b);
    const uint8_t* codes = row + scale_bytes(k) + b * kElems;
    const float* table = e4m3_table();
    for (int64_t i = 0; i < kElems; ++i) out[i] = table[codes[i]] * s;
  }
#ifdef SPLITFLOW_CPU_AVX2
  // The codes as f16 values 2^-8 times theirs (scales() returns the scale times 2^8: the
  // product is exact either way): e4m3 eeee mmm becomes f16 0 eeeee mmm0000000 (exponent bias 15
  // instead of 7; e4m3 subnormals land on f16 subnormals, which F16C converts exactly); the NaN
  // codes 0x7f / 0xff become f16 NaN.
  static void scales(const uint8_t* row, int64_t, int64_t b, float& scale_out, float& offset) {
    scale_out = scale(row, b) * 256.0f;
    offset = 0.0f;
  }
  template <typename F>
  static void emit_codes(const uint8_t* row, int64_t k, int64_t b, F&& f) {
    const uint8_t* codes = row + scale_bytes(k) + b * kElems;
    const __m128i magnitude = _mm_set1_epi16(0x7F), sign = _mm_set1_epi16(0x80), nan = _mm_set1_epi16(0x7E00);
#pragma GCC unroll 4
    for (int64_t g = 0; g < kElems / 8; ++g) {
      const __m128i bytes = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + 8 * g)));
      const __m128i abs = _mm_and_si128(bytes, magnitude);
      __m128i half = _mm_or_si128(_mm_slli_epi16(abs, 7), _mm_slli_epi16(_mm_and_si128(bytes, sign), 8));
      half = _mm_blendv_epi8(half, nan, _mm_cmpeq_epi16(abs, magnitude));
      f(static_cast<int>(8 * g), _mm256_cvtph_ps(half));
    }
  }
#else
  static void scales(const uint8_t* row, int64_t, int64_t b, float& scale_out, float& offset) {
    scale_out = scale(row, b);
    offset = 0.0f;
  }
#endif
};

template <> struct Codec<DType::F8_CHANNEL> : Fp8Codec<0> {};
template <> struct Codec<DType::F8_G128> : Fp8Codec<128> {};

// ---- int8 groups (llama2.c's Q8_0): a row is its f32 scales padded to 16 bytes, then k int8 -----
template <int64_t GROUP>
struct Int8Codec {
  static constexpr int64_t kElems = GROUP;
  static constexpr bool kVector = true;
  static size_t scale_bytes(int64_t k) { return static_cast<size_t>(k / GROUP * 4 + 15) / 16 * 16; }
  static void decode(const uint8_t* row, int64_t k, int64_t b, float* out) {
    const float s = f32_at(row + 4 * b);
    const auto* codes = reinterpret_cast<const int8_t*>(row + scale_bytes(k) + b * kElems);
    for (int64_t i = 0; i < kElems; ++i) out[i] = static_cast<float>(codes[i]) * s;
  }
  static void scales(const uint8_t* row, int64_t, int64_t b, float& scale_out, float& offset) {
    scale_out = f32_at(row + 4 * b);
    offset = 0.0f;
  }
#ifdef SPLITFLOW_CPU_AVX2
  template <typename F>
  static void emit_codes(const uint8_t* row, int64_t k, int64_t b, F&& f) {
    const uint8_t* codes = row + scale_bytes(k) + b * kElems;
#pragma GCC unroll 4
    for (int64_t g = 0; g < kElems / 8; ++g) {
      const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + 8 * g)));
      f(static_cast<int>(8 * g), _mm256_cvtepi32_ps(q));
    }
  }
#endif
};

template <> struct Codec<DType::I8_G32> : Int8Codec<32> {};
template <> struct Codec<DType::I8_G64> : Int8Codec<64> {};
template <> struct Codec<DType::I8_G128> : Int8Codec<128> {};

#ifdef SPLITFLOW_CPU_AVX2
// The weights of block b as 8-lane vectors: f(offset, values) for offset 0, 8, ... (every type).
template <DType T, typename F>
inline void emit(const uint8_t* row, int64_t k, int64_t b, F&& f) {
  using C = Codec<T>;
  if constexpr (C::kVector) {
    float scale, offset;
    C::scales(row, k, b, scale, offset);
    const __m256 s = _mm256_set1_ps(scale), o = _mm256_set1_ps(offset);
    C::emit_codes(row, k, b, [&](int at, __m256 codes) { f(at, _mm256_fmadd_ps(codes, s, o)); });
  } else if constexpr (requires { C::kDirect; }) {
    C::emit(row, k, b, f);
  } else {
    alignas(32) float buf[C::kElems];
    C::decode(row, k, b, buf);
    for (int at = 0; at < C::kElems; at += 8) f(at, _mm256_load_ps(buf + at));
  }
}
#endif

// Calls f.operator()<T>() for the quantized type `type`: `visit(type, [&]<DType T>() {...})`.
// Throws for any other dtype.
template <typename F>
void visit(DType type, F&& f) {
  switch (type) {
#define SPLITFLOW_QUANT_CASE(T) \
  case DType::T: f.template operator()<DType::T>(); return;
    SPLITFLOW_QUANT_CASE(Q4_0) SPLITFLOW_QUANT_CASE(Q4_1) SPLITFLOW_QUANT_CASE(Q5_0) SPLITFLOW_QUANT_CASE(Q5_1)
    SPLITFLOW_QUANT_CASE(Q8_0) SPLITFLOW_QUANT_CASE(Q2_K) SPLITFLOW_QUANT_CASE(Q3_K) SPLITFLOW_QUANT_CASE(Q4_K)
    SPLITFLOW_QUANT_CASE(Q5_K) SPLITFLOW_QUANT_CASE(Q6_K) SPLITFLOW_QUANT_CASE(Q2_B32) SPLITFLOW_QUANT_CASE(Q3_B32)
    SPLITFLOW_QUANT_CASE(Q4_B32) SPLITFLOW_QUANT_CASE(Q5_B32) SPLITFLOW_QUANT_CASE(Q6_B32) SPLITFLOW_QUANT_CASE(Q8_B32)
    SPLITFLOW_QUANT_CASE(Q2_B64) SPLITFLOW_QUANT_CASE(Q3_B64) SPLITFLOW_QUANT_CASE(Q4_B64) SPLITFLOW_QUANT_CASE(Q5_B64)
    SPLITFLOW_QUANT_CASE(Q6_B64) SPLITFLOW_QUANT_CASE(Q8_B64) SPLITFLOW_QUANT_CASE(Q3H_B64)
    SPLITFLOW_QUANT_CASE(F8_CHANNEL) SPLITFLOW_QUANT_CASE(F8_G128)
    SPLITFLOW_QUANT_CASE(I8_G32) SPLITFLOW_QUANT_CASE(I8_G64) SPLITFLOW_QUANT_CASE(I8_G128)
#undef SPLITFLOW_QUANT_CASE
    default: break;
  }
  fail("cpu: dtype {} is not a quantized matrix type", dtype_name(type));
}

// Row r of `count` rows decoded to f32 for elements [p0, p0 + count) (p0, count multiples of
// the block): the GEMM's packing and embed.
template <DType T>
void decode_range(const uint8_t* row, int64_t k, int64_t p0, int64_t count, float* out) {
  using C = Codec<T>;
  for (int64_t b = p0 / C::kElems, end = (p0 + count) / C::kElems; b < end; ++b, out += C::kElems) {
#ifdef SPLITFLOW_CPU_AVX2
    if constexpr (C::kVector || requires { C::kDirect; }) {
      emit<T>(row, k, b, [out](int at, __m256 values) { _mm256_storeu_ps(out + at, values); });
      continue;
    }
#endif
    C::decode(row, k, b, out);
  }
}

}  // namespace splitflow::cpu::quant_blocks
