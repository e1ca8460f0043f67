// backend/cuda/quant_gemv.cuh — the decode GEMVs on quantized weights (quant_kernels.h): one warp per
// output row (or per pair: gate and up, a RoPE pair), as gemv.cu. The warp copies its rows' packed
// bytes into shared memory a chunk at a time with cp.async in coalesced 16-byte words (double-
// buffered), then each lane decodes 32-element units of the chunk into fp32 registers
// (quant_decode.cuh) and multiplies them with the bf16 x rows, accumulating in fp32. Only the
// packed bytes cross the memory bus (4.5 bits per weight for Q4_0 instead of bf16's 16). Decoding
// straight from global memory instead (each lane 2-byte loads of its own 18-byte block) ran at
// 0.6x bf16's tokens/s on TinyLlama: many narrow loads per byte, and the second row of a pair only
// after the first. Kernels are instantiated per decoder: one kernel holding every decoder behind a
// switch took the register count of the largest. A Mixed matrix is one plain GEMV launch per run,
// into its output columns; the fused gated and QKV kernels take a single-dtype matrix (a Mixed one
// goes the unfused way). The epilogues are gemv.cu's: bias, accumulate, the gated activation, RoPE
// with the KV write, and an input RMSNorm, here with its weight applied to x on the fly (the
// quantized matrices cannot take a folded norm weight).
//
// The three launchers live in their own files (quant_gemv_{plain,gated,qkv}.cu): every decoder x M
// instantiation of one kernel per translation unit, so a build compiles them in parallel.
//
// Rows of x: M is a template bound (1, 2, 4, 8); rows past m read row m - 1 and are not stored.
#pragma once

#include "backend/cuda/activation.cuh"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/quant_decode.cuh"
#include "backend/cuda/quant_kernels.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

namespace splitflow::cuda::quant_gemv_detail {

// Units of a row staged at a time (two per lane), double-buffered: one chunk's copies are in flight
// while the previous one is decoded.
constexpr int kChunkUnits = 64;

template <typename Dec>
struct Staging {
  static constexpr int kBlocksPerChunk = kChunkUnits / Dec::kUnitsPerBlock;
  static constexpr int kChunkBytes = kBlocksPerChunk * Dec::kBytes;
  // Whole 16-byte words around a chunk at any address: up to 15 bytes more at each end.
  static constexpr int kStageBytes = (kChunkBytes + 30) / 16 * 16;
};

// Warps a block: as many of 8, 4, 2 as keep the block's stages within 40 KiB of static shared memory.
template <typename Dec, int R>
constexpr int kWarps = 2 * R * Staging<Dec>::kStageBytes * 8 <= 40960   ? 8
                       : 2 * R * Staging<Dec>::kStageBytes * 4 <= 40960 ? 4
                                                                         : 2;

// Blocks an SM must hold (a register cap for ptxas): a decode matrix has few rows per SM (4096 rows
// on 132 SMs: 31), and with 80 registers only 24 warps of one row each fit, so the rows took two
// rounds of memory latency instead of one.
template <int R>
constexpr int kMinBlocks = R == 1 ? 4 : 3;

template <typename Dec, int R>
using StageBuffers = uint8_t[2][R][Staging<Dec>::kStageBytes];

__device__ __forceinline__ float warp_total(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ void unpack8(const uint4& word, float (&out)[8]) {
  const uint32_t halves[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 pair = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&halves[i]));
    out[2 * i] = pair.x;
    out[2 * i + 1] = pair.y;
  }
}

// cp.async: global -> shared without registers; .cg: weights bypass L1 (each is read once a step).
__device__ __forceinline__ void copy16_async(void* smem, uintptr_t gmem) {
  const auto dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
}
__device__ __forceinline__ void commit_async() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void wait_async_but_one() { asm volatile("cp.async.wait_group 1;\n" ::); }

// The 16-byte words covering global bytes [begin, end) into `stage`, word by word across the warp:
// byte begin lands at stage + begin % 16, so every address keeps its alignment modulo 16.
__device__ __forceinline__ void stage_words(uint8_t* stage, const uint8_t* begin, const uint8_t* end, int lane) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(begin) & ~uintptr_t{15};
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(end) + 15) & ~uintptr_t{15};
  const int words = static_cast<int>((hi - lo) / 16);
  for (int i = lane; i < words; i += 32) copy16_async(stage + 16 * i, lo + 16 * i);
}

// The x operand: m rows of k bf16, and the input norm.
struct XOperand {
  const bf16_bits* x;
  int m;
  int64_t k;
  QuantNorm norm;
};

// acc[i][r] = dot(row rows[i] of w, x row r (times the norm weight)) for the warp's R rows, the total
// in every lane; with want_rms (the norm on), inv_rms[r] = x row r's 1 / rms from the same pass over
// x. The rows are copied into the warp's stages a chunk of kChunkUnits units at a time in coalesced
// 16-byte words (one warp instruction reads 512 contiguous bytes, whatever the block size), the next
// chunk's copies in flight while lanes decode the current one's units from shared memory.
template <typename Dec, int M, int R>
__device__ __forceinline__ void rows_dot(const QuantRun& w, const int64_t (&rows)[R], const XOperand& x,
                                         bool want_rms, float (&acc)[R][M], float (&inv_rms)[M],
                                         StageBuffers<Dec, R>& stage) {
  using S = Staging<Dec>;
  const int lane = threadIdx.x % 32;
  const int64_t k = x.k, units = k / 32, row_blocks = units / Dec::kUnitsPerBlock;
  const int64_t chunks = (row_blocks + S::kBlocksPerChunk - 1) / S::kBlocksPerChunk;
  const uint8_t* row_at[R];
  const uint8_t* blocks_at[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    row_at[i] = w.data + (rows[i] - w.first_row) * w.row_bytes;
    blocks_at[i] = row_at[i] + Dec::data_offset(k);
  }
  const auto issue = [&](int64_t c) {
    const int64_t first = c * S::kBlocksPerChunk, last = min(first + S::kBlocksPerChunk, row_blocks);
#pragma unroll
    for (int i = 0; i < R; ++i)
      stage_words(stage[c & 1][i], blocks_at[i] + first * Dec::kBytes, blocks_at[i] + last * Dec::kBytes, lane);
    commit_async();
  };
  float squares[M];
#pragma unroll
  for (int r = 0; r < M; ++r) {
    squares[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i][r] = 0.0f;
  }
  const float* gw = x.norm.weight;
  issue(0);
#pragma unroll 1
  for (int64_t c = 0; c < chunks; ++c) {
    if (c + 1 < chunks) {
      issue(c + 1);
    } else {
      commit_async();  // an empty group keeps "all but the newest group" meaning chunk c
    }
    wait_async_but_one();
    __syncwarp();
    const int64_t first_unit = c * kChunkUnits;
#pragma unroll
    for (int j = 0; j < kChunkUnits / 32; ++j) {
      const int lu = lane + 32 * j;
      const int64_t u = first_unit + lu;
      if (u >= units) break;
      float wv[R][32];
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const uint8_t* chunk = blocks_at[i] + c * S::kBlocksPerChunk * Dec::kBytes;
        Dec::unit(stage[c & 1][i] + (reinterpret_cast<uintptr_t>(chunk) & 15), lu, row_at[i], k, u, wv[i]);
      }
#pragma unroll
      for (int word = 0; word < 4; ++word) {
        const int64_t col = 32 * u + 8 * word;
        float g[8];
        if (gw != nullptr) {
          const float4 a = __ldg(reinterpret_cast<const float4*>(gw + col));
          const float4 b = __ldg(reinterpret_cast<const float4*>(gw + col) + 1);
          const float o = x.norm.offset;
          g[0] = o + a.x, g[1] = o + a.y, g[2] = o + a.z, g[3] = o + a.w;
          g[4] = o + b.x, g[5] = o + b.y, g[6] = o + b.z, g[7] = o + b.w;
        }
#pragma unroll
        for (int r = 0; r < M; ++r) {
          const int64_t xr = r < x.m ? r : x.m - 1;
          float xf[8];
          unpack8(__ldg(reinterpret_cast<const uint4*>(x.x + xr * k + col)), xf);
          if (want_rms) {
#pragma unroll
            for (int e = 0; e < 8; ++e) squares[r] = fmaf(xf[e], xf[e], squares[r]);
          }
          if (gw != nullptr) {
#pragma unroll
            for (int e = 0; e < 8; ++e) xf[e] *= g[e];
          }
#pragma unroll
          for (int i = 0; i < R; ++i)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[i][r] = fmaf(wv[i][8 * word + e], xf[e], acc[i][r]);
        }
      }
    }
    __syncwarp();  // this chunk's stage is refilled by the next iteration's issue(c + 2)
  }
#pragma unroll
  for (int r = 0; r < M; ++r) {
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i][r] = warp_total(acc[i][r]);
    if (want_rms) inv_rms[r] = rsqrtf(warp_total(squares[r]) / static_cast<float>(k) + x.norm.eps);
  }
}

// The normalized product of a row: scaled by the given inv_rms (norm on).
template <int M>
__device__ __forceinline__ void scale_rows(float (&acc)[M], const float (&inv_rms)[M], bool on) {
  if (!on) return;
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] *= inv_rms[r];
}

// Rows [w.first_row, w.end_row) of y's n columns (one run of the matrix).
template <typename Dec, int M>
__global__ void __launch_bounds__(kWarps<Dec, 1> * 32, kMinBlocks<1>)
    quant_gemv_kernel(QuantRun w, int64_t n, XOperand x, const float* __restrict__ bias, bf16_bits* y_bf16,
                      float* y_f32, bool accumulate) {
  __shared__ __align__(16) StageBuffers<Dec, 1> stages[kWarps<Dec, 1>];
  const int warp = threadIdx.x / 32;
  const int64_t row = w.first_row + static_cast<int64_t>(blockIdx.x) * kWarps<Dec, 1> + warp;
  if (row >= w.end_row) return;
  float dots[1][M], unused[M];
  rows_dot<Dec, M, 1>(w, {row}, x, false, dots, unused, stages[warp]);
  const float(&acc)[M] = dots[0];
  if (threadIdx.x % 32 != 0) return;
  const float b = bias != nullptr ? bias[row] : 0.0f;
#pragma unroll
  for (int r = 0; r < M; ++r) {
    if (r >= x.m) break;
    if (y_f32 != nullptr) {
      y_f32[r * n + row] = acc[r] + b + (accumulate ? y_f32[r * n + row] : 0.0f);
    } else {
      __nv_bfloat16* y = reinterpret_cast<__nv_bfloat16*>(y_bf16) + r * n + row;
      *y = __float2bfloat16(acc[r] + b + (accumulate ? __bfloat162float(*y) : 0.0f));
    }
  }
}

template <typename Dec, int M>
__global__ void __launch_bounds__(kWarps<Dec, 2> * 32, kMinBlocks<2>)
    quant_gemv_gated_kernel(QuantRun w, XOperand x, const float* __restrict__ bias, int act, bf16_bits* y) {
  __shared__ __align__(16) StageBuffers<Dec, 2> stages[kWarps<Dec, 2>];
  const int warp = threadIdx.x / 32;
  const int64_t inner = w.end_row / 2;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kWarps<Dec, 2> + warp;
  if (j >= inner) return;
  float dots[2][M], inv_rms[M];
  rows_dot<Dec, M, 2>(w, {j, inner + j}, x, x.norm.on, dots, inv_rms, stages[warp]);
  float(&gate)[M] = dots[0];
  float(&up)[M] = dots[1];
  if (threadIdx.x % 32 != 0) return;
  scale_rows(gate, inv_rms, x.norm.on);
  scale_rows(up, inv_rms, x.norm.on);
  const float gate_bias = bias != nullptr ? bias[j] : 0.0f, up_bias = bias != nullptr ? bias[inner + j] : 0.0f;
#pragma unroll
  for (int r = 0; r < M; ++r) {
    if (r >= x.m) break;
    reinterpret_cast<__nv_bfloat16*>(y)[r * inner + j] =
        __float2bfloat16(activate(gate[r] + gate_bias, act) * (up[r] + up_bias));
  }
}

// gemv.cu's gemv_qkv_rope_kernel on a quantized w: the same tasks (a pair of rotated rows per q or
// k head and i < half, then two consecutive plain rows), the same stores.
template <typename Dec, int M>
__global__ void __launch_bounds__(kWarps<Dec, 2> * 32, kMinBlocks<2>)
    quant_gemv_qkv_rope_kernel(QuantRun w, XOperand x, QkvRopeLaunch a) {
  __shared__ __align__(16) StageBuffers<Dec, 2> stages[kWarps<Dec, 2>];
  const int warp = threadIdx.x / 32;
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps<Dec, 2> + warp;
  const int lane = threadIdx.x % 32;
  const int d = a.head_dim, half = a.rotary_dim / 2, rotated_heads = a.heads + a.kv_heads;
  const int64_t q_dim = static_cast<int64_t>(a.heads) * d, kv_dim = static_cast<int64_t>(a.kv_heads) * d;
  const int64_t width = q_dim + 2 * kv_dim, pair_tasks = static_cast<int64_t>(rotated_heads) * half;
  const int64_t plain_per_head = d - 2 * half;
  const int64_t plain_rows = rotated_heads * plain_per_head + kv_dim;
  if (task >= pair_tasks + (plain_rows + 1) / 2) return;
  const auto store = [&](int64_t row, int r, float value) {
    const bf16_bits rounded = __bfloat16_as_ushort(__float2bfloat16(value));
    a.qkv[r * width + row] = rounded;
    const int32_t slot = a.slots[r];
    if (row < q_dim || slot < 0 || slot >= a.capacity_slots) return;
    const int64_t at = static_cast<int64_t>(slot) * kv_dim + (row - q_dim) % kv_dim;
    void* cache = row < q_dim + kv_dim ? a.k_cache : a.v_cache;
    if (a.kv_fp8) {
      store_kv(static_cast<e4m3_bits*>(cache) + at, rounded);
    } else {
      store_kv(static_cast<bf16_bits*>(cache) + at, rounded);
    }
  };
  const bool norm = x.norm.on;
  if (task < pair_tasks) {
    const int64_t head = task / half, i = task % half;
    const int64_t row1 = head * d + (a.interleaved ? 2 * i : i), row2 = head * d + (a.interleaved ? 2 * i + 1 : i + half);
    float dots[2][M], inv_rms[M];
    rows_dot<Dec, M, 2>(w, {row1, row2}, x, norm, dots, inv_rms, stages[warp]);
    float(&first)[M] = dots[0];
    float(&second)[M] = dots[1];
    scale_rows(first, inv_rms, norm);
    scale_rows(second, inv_rms, norm);
    if (lane != 0) return;
    const float bias1 = a.bias != nullptr ? a.bias[row1] : 0.0f, bias2 = a.bias != nullptr ? a.bias[row2] : 0.0f;
#pragma unroll
    for (int r = 0; r < M; ++r) {
      if (r >= x.m) break;
      const float* cos = a.cos_sin + static_cast<int64_t>(a.table_rows[r]) * 2 * half;
      const float x1 = first[r] + bias1, x2 = second[r] + bias2, c = cos[i], s = cos[half + i];
      store(row1, r, x1 * c - x2 * s);
      store(row2, r, x2 * c + x1 * s);
    }
    return;
  }
  const auto plain_row = [&](int64_t plain) {
    return plain < rotated_heads * plain_per_head ? plain / plain_per_head * d + 2 * half + plain % plain_per_head
                                                  : q_dim + kv_dim + (plain - rotated_heads * plain_per_head);
  };
  const int64_t first_plain = 2 * (task - pair_tasks);
  const bool two = first_plain + 1 < plain_rows;
  const int64_t row1 = plain_row(first_plain), row2 = two ? plain_row(first_plain + 1) : row1;
  // A lone last row is staged twice (row2 = row1) rather than giving the kernel a one-row path.
  float dots[2][M], inv_rms[M];
  rows_dot<Dec, M, 2>(w, {row1, row2}, x, norm, dots, inv_rms, stages[warp]);
  float(&acc1)[M] = dots[0];
  float(&acc2)[M] = dots[1];
  if (lane != 0) return;
  scale_rows(acc1, inv_rms, norm);
  if (two) scale_rows(acc2, inv_rms, norm);
  const float bias1 = a.bias != nullptr ? a.bias[row1] : 0.0f, bias2 = a.bias != nullptr ? a.bias[row2] : 0.0f;
#pragma unroll
  for (int r = 0; r < M; ++r) {
    if (r >= x.m) break;
    store(row1, r, acc1[r] + bias1);
    if (two) store(row2, r, acc2[r] + bias2);
  }
}

// launch(std::integral_constant<int, M>{}) for the smallest M in {1, 2, 4, 8} >= m.
template <typename Launch>
cudaError_t with_row_bound(int64_t m, Launch&& launch) {
  if (m == 1) return launch(std::integral_constant<int, 1>{});
  if (m == 2) return launch(std::integral_constant<int, 2>{});
  if (m >= 3 && m <= 4) return launch(std::integral_constant<int, 4>{});
  if (m >= 5 && m <= kMaxQuantGemvRows) return launch(std::integral_constant<int, 8>{});
  return cudaErrorInvalidValue;
}

inline unsigned blocks_for(int64_t tasks, int warps) { return static_cast<unsigned>((tasks + warps - 1) / warps); }

}  // namespace splitflow::cuda::quant_gemv_detail
