// backend/cuda/quant_f8x.cuh — the decode GEMVs' dot for FP8 weight-only matrices (F8_CHANNEL,
// F8_G128) over fp16 activations: each block converts x once into shared memory as fp16, each
// 32-element unit scaled by a power of two into (-1, 1) (exact; the power is undone in fp32), and
// a lane converts its unit's e4m3 bytes two at a time to fp16 pairs (cvt.f16x2.e4m3x2, exact) and
// multiplies them with x by fp16 pair FMAs, eight per accumulator before it is widened to fp32. Per
// weight that is about one instruction instead of the fp32 path's four to five. The activations
// stay 16-bit floats (weight-only quantization, as reference 000's FP8 path); what differs from the
// fp32 path is the fp16 rounding of x' and of the 8-term partial sums (|w x'| < 448, so a partial
// sum stays below 3584: no overflow), about 2^-11 relative: below the bf16 output's own rounding.
// FloatDot's interface (quant_gemv.cuh).
#pragma once

#include "backend/cuda/quant_decode.cuh"
#include "backend/cuda/quant_staging.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace splitflow::cuda::quant_f8x {

// Per row of x (rounded up to 16 bytes): k fp16 values, then per 32-element unit the float power
// of two its values were divided by.
__host__ __device__ constexpr int64_t x_row_bytes(int64_t k) { return (2 * k + k / 32 * 4 + 15) / 16 * 16; }

// Two e4m3 bytes (bits 0..15) as an fp16 pair, exactly.
__device__ __forceinline__ __half2 e4m3x2_to_half2(uint32_t two) {
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffff), __NV_E4M3);
  return __half2(raw);
}

}  // namespace splitflow::cuda::quant_f8x

namespace splitflow::cuda::quant_gemv_detail {

template <typename Dec, int M_, int R_>
struct F16Dot {
  static constexpr int M = M_, R = R_;
  static constexpr int kWarps = quant_gemv_detail::kWarps<Dec, R>;
  static constexpr int kMinBlocks = quant_gemv_detail::kMinBlocks<R, M>;
  static constexpr int kInvRmsBytes = (4 * M + 15) / 16 * 16;  // the M inverse rms after x
  static constexpr bool kGrouped = Dec::kPerGroup;
  __host__ __device__ static constexpr int64_t x_bytes(int64_t k) { return M * quant_f8x::x_row_bytes(k); }
  __host__ __device__ static constexpr int64_t shared_bytes(int64_t k) {
    return x_bytes(k) + kInvRmsBytes + kWarps * static_cast<int64_t>(sizeof(StageBuffers<Dec, R>));
  }

  XOperand x;
  bool want_rms;
  uint8_t* shared;
  float* inv_rms_at;
  StageBuffers<Dec, R>* stages;

  __device__ F16Dot(uint8_t* shared_memory, const XOperand& x_operand, bool rms)
      : x(x_operand), want_rms(rms), shared(shared_memory),
        inv_rms_at(reinterpret_cast<float*>(shared_memory + x_bytes(x_operand.k))),
        stages(reinterpret_cast<StageBuffers<Dec, R>*>(shared_memory + x_bytes(x_operand.k) + kInvRmsBytes)) {}

  // Where quarter q (16 bytes) of unit u's 64 bytes is stored: rotated by u / 2, so the 8 lanes of a
  // quarter-warp (consecutive units, 64 bytes apart) load from 8 different bank groups (unrotated,
  // four of them met in each).
  __device__ static int slot(int64_t u, int q) { return (q + static_cast<int>(u >> 1)) & 3; }

  // Every thread: x's rows as scaled fp16 units; inv_rms_at[r] (1 without the norm).
  __device__ void convert_x() {
    const int64_t k = x.k;
    convert_x_rows<M>(x, want_rms, inv_rms_at, [&](int r, int64_t u, const float(&v)[32], float amax) {
      uint8_t* row = shared + r * quant_f8x::x_row_bytes(k);
      int exponent = 0;
      frexpf(amax, &exponent);  // amax < 2^exponent
      const float down = ldexpf(1.0f, -exponent);
      uint32_t h[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const __half2 pair = __floats2half2_rn(v[2 * j] * down, v[2 * j + 1] * down);
        h[j] = *reinterpret_cast<const uint32_t*>(&pair);
      }
      uint4* out = reinterpret_cast<uint4*>(row + 64 * u);
#pragma unroll
      for (int q = 0; q < 4; ++q) out[slot(u, q)] = make_uint4(h[4 * q], h[4 * q + 1], h[4 * q + 2], h[4 * q + 3]);
      reinterpret_cast<float*>(row + 2 * k)[u] = ldexpf(1.0f, exponent);
    });
  }

  template <typename RowsOf, typename End>
  __device__ void stream(const QuantRun& w, int64_t tasks, RowsOf&& rows_of, End&& end) {
    const int64_t k = x.k;
    const uint8_t* x_shared = shared;
    float acc[R][M] = {};
    const auto unit = [&](int lu, int64_t u, auto& staged, auto& row_at) {
      __half2 wh[R][16];
      float scale[R];
#pragma unroll
      for (int i = 0; i < R; ++i) {
        scale[i] = __ldg(reinterpret_cast<const float*>(row_at[i]) + (kGrouped ? u / 4 : 0));
        const uint4 a = quant_decode::ld128(staged[i] + 32 * lu), b = quant_decode::ld128(staged[i] + 32 * lu + 16);
        const uint32_t words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          wh[i][2 * j] = quant_f8x::e4m3x2_to_half2(words[j]);
          wh[i][2 * j + 1] = quant_f8x::e4m3x2_to_half2(words[j] >> 16);
        }
      }
#pragma unroll
      for (int r = 0; r < M; ++r) {
        const uint8_t* row = x_shared + r * quant_f8x::x_row_bytes(k);
        __half2 xh[16];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint4 v = reinterpret_cast<const uint4*>(row + 64 * u)[slot(u, q)];
          xh[4 * q] = *reinterpret_cast<const __half2*>(&v.x);
          xh[4 * q + 1] = *reinterpret_cast<const __half2*>(&v.y);
          xh[4 * q + 2] = *reinterpret_cast<const __half2*>(&v.z);
          xh[4 * q + 3] = *reinterpret_cast<const __half2*>(&v.w);
        }
        const float power = reinterpret_cast<const float*>(row + 2 * k)[u];
#pragma unroll
        for (int i = 0; i < R; ++i) {
          __half2 sum[2] = {__float2half2_rn(0.0f), __float2half2_rn(0.0f)};
#pragma unroll
          for (int j = 0; j < 16; ++j) sum[j % 2] = __hfma2(wh[i][j], xh[j], sum[j % 2]);
          const float2 a = __half22float2(sum[0]), b = __half22float2(sum[1]);
          acc[i][r] = fmaf(scale[i] * power, (a.x + a.y) + (b.x + b.y), acc[i][r]);
        }
      }
    };
    stream_tasks<Dec, R>(w, k, stages[threadIdx.x / 32], tasks, rows_of, [&] { convert_x(); }, unit,
                         [&](int64_t task) { end_task(acc, inv_rms_at, task, end); });
  }
};

}  // namespace splitflow::cuda::quant_gemv_detail
