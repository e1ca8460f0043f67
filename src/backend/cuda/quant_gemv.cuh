// backend/cuda/quant_gemv.cuh — the decode GEMVs on quantized weights (quant_kernels.h): one warp per
// output row (or per pair: gate and up, a RoPE pair), as gemv.cu, reading its rows through
// quant_staging.cuh's shared-memory chunks. Three dots: int8 activations with dp4a (Q8Dot,
// quant_q8x.cuh; the default for the types with a Q8 decoder, as llama.cpp's GPU and this
// project's CPU backend run them), fp16 activations with fp16 pair FMAs for FP8 (F16Dot,
// quant_f8x.cuh), and fp32 activations (FloatDot below: each lane decodes a unit into fp32
// registers (quant_decode.cuh) and multiplies it with the bf16 x rows; every type can take it: FP8
// past 2 rows, x too large for the others' shared memory, and everything with
// SPLITFLOW_CUDA_Q8_ACTIVATIONS=0 SPLITFLOW_CUDA_F16_ACTIVATIONS=0). Only the packed bytes cross the memory bus
// (4.5 bits per weight for Q4_0 instead of bf16's 16). Kernels are instantiated per decoder: one
// kernel holding every decoder behind a switch took the register count of the largest. A Mixed
// matrix is one plain GEMV launch per run, into its output columns; the fused gated and QKV kernels
// take a single-dtype matrix (a Mixed one goes the unfused way). The epilogues are gemv.cu's: bias,
// accumulate, the gated activation, RoPE with the KV write, and an input RMSNorm, here with its
// weight applied to x on the fly (the quantized matrices cannot take a folded norm weight).
//
// The three launchers live in their own files (quant_gemv_{plain,gated,qkv}.cu): every decoder x M
// instantiation of one kernel per translation unit, so a build compiles them in parallel.
//
// Rows of x: M is a template bound (1, 2, 4, 8); rows past m read row m - 1 and are not stored.
#pragma once

#include "backend/cuda/activation.cuh"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/quant_decode.cuh"
#include "backend/cuda/quant_f8x.cuh"
#include "backend/cuda/quant_kernels.h"
#include "backend/cuda/quant_q8x.cuh"
#include "backend/cuda/quant_staging.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace splitflow::cuda::quant_gemv_detail {

// The dot of a warp's tasks (R rows of w each) with M bf16 rows of x in fp32 (the Dot interface,
// with Q8Dot in quant_q8x.cuh): stream(w, tasks, rows_of, end) runs stream_tasks and calls
// end(task, acc, inv_rms) with acc[i][r] = dot(row i of the task, x row r (times the norm
// weight)), the total in every lane, and with want_rms (the norm on) inv_rms[r] = x row r's
// 1 / rms, here from the same pass over x. Shared memory: the warps' stages.
template <typename Dec, int M_, int R_>
struct FloatDot {
  static constexpr int M = M_, R = R_;
  static constexpr int kWarps = quant_gemv_detail::kWarps<Dec, R>;
  // fp32 units take more registers than int8 codes: a lower cap than Q8Dot's rather than spills.
  static constexpr int kMinBlocks = M >= 4 ? 2 : 3;
  static constexpr int64_t shared_bytes(int64_t) { return kWarps * static_cast<int64_t>(sizeof(StageBuffers<Dec, R>)); }

  XOperand x;
  bool want_rms;
  StageBuffers<Dec, R>* stages;

  __device__ FloatDot(uint8_t* shared_memory, const XOperand& x_operand, bool rms)
      : x(x_operand), want_rms(rms), stages(reinterpret_cast<StageBuffers<Dec, R>*>(shared_memory)) {}

  template <typename RowsOf, typename End>
  __device__ void stream(const QuantRun& w, int64_t tasks, RowsOf&& rows_of, End&& end) {
    const int64_t k = x.k;
    float acc[R][M], squares[M];
    const auto clear = [&] {
#pragma unroll
      for (int r = 0; r < M; ++r) {
        squares[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < R; ++i) acc[i][r] = 0.0f;
      }
    };
    clear();
    const float* gw = x.norm.weight;
    const auto unit = [&](int lu, int64_t u, auto& staged, auto& row_at) {
      float wv[R][32];
#pragma unroll
      for (int i = 0; i < R; ++i) Dec::unit(staged[i], lu, row_at[i], k, u, wv[i]);
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
    };
    stream_tasks<Dec, R>(w, k, stages[threadIdx.x / 32], tasks, rows_of, [] {}, unit, [&](int64_t task) {
      float inv_rms[M];
#pragma unroll
      for (int r = 0; r < M; ++r) {
#pragma unroll
        for (int i = 0; i < R; ++i) acc[i][r] = warp_total(acc[i][r]);
        inv_rms[r] = want_rms ? rsqrtf(warp_total(squares[r]) / static_cast<float>(k) + x.norm.eps) : 1.0f;
      }
      end(task, acc, inv_rms);
      clear();
    });
  }
};

// Dot: FloatDot or Q8Dot (R = 1 here, 2 in the gated and QKV kernels); shared memory as its
// shared_bytes(k) says, given at launch. The grid holds at most the blocks that fit the GPU at once
// (resident_blocks()); warps take tasks in turn (stream_tasks).
extern __shared__ __align__(16) uint8_t quant_gemv_shared[];

template <typename Dot>
__global__ void __launch_bounds__(Dot::kWarps * 32, Dot::kMinBlocks)
    quant_gemv_kernel(QuantRun w, int64_t n, XOperand x, const float* __restrict__ bias, bf16_bits* y_bf16,
                      float* y_f32, bool accumulate) {
  constexpr int M = Dot::M;
  Dot dot(quant_gemv_shared, x, false);
  dot.stream(
      w, w.end_row - w.first_row, [&](int64_t task, int64_t(&rows)[1]) { rows[0] = w.first_row + task; },
      [&](int64_t task, const float(&dots)[1][M], const float(&)[M]) {
        if (threadIdx.x % 32 != 0) return;
        const int64_t row = w.first_row + task;
        const float b = bias != nullptr ? bias[row] : 0.0f;
#pragma unroll
        for (int r = 0; r < M; ++r) {
          if (r >= x.m) break;
          if (y_f32 != nullptr) {
            y_f32[r * n + row] = dots[0][r] + b + (accumulate ? y_f32[r * n + row] : 0.0f);
          } else {
            __nv_bfloat16* y = reinterpret_cast<__nv_bfloat16*>(y_bf16) + r * n + row;
            *y = __float2bfloat16(dots[0][r] + b + (accumulate ? __bfloat162float(*y) : 0.0f));
          }
        }
      });
}

template <typename Dot>
__global__ void __launch_bounds__(Dot::kWarps * 32, Dot::kMinBlocks)
    quant_gemv_gated_kernel(QuantRun w, XOperand x, const float* __restrict__ bias, int act, bf16_bits* y) {
  constexpr int M = Dot::M;
  Dot dot(quant_gemv_shared, x, x.norm.on);
  const int64_t inner = w.end_row / 2;
  dot.stream(
      w, inner,
      [&](int64_t j, int64_t(&rows)[2]) {
        rows[0] = j;
        rows[1] = inner + j;
      },
      [&](int64_t j, const float(&dots)[2][M], const float(&inv_rms)[M]) {
        if (threadIdx.x % 32 != 0) return;
        const float gate_bias = bias != nullptr ? bias[j] : 0.0f, up_bias = bias != nullptr ? bias[inner + j] : 0.0f;
#pragma unroll
        for (int r = 0; r < M; ++r) {
          if (r >= x.m) break;
          const float gate = dots[0][r] * inv_rms[r] + gate_bias, up = dots[1][r] * inv_rms[r] + up_bias;
          reinterpret_cast<__nv_bfloat16*>(y)[r * inner + j] = __float2bfloat16(activate(gate, act) * up);
        }
      });
}

// gemv.cu's gemv_qkv_rope_kernel on a quantized w: the same tasks (a pair of rotated rows per q or
// k head and i < half, then two consecutive plain rows), the same stores.
template <typename Dot>
__global__ void __launch_bounds__(Dot::kWarps * 32, Dot::kMinBlocks)
    quant_gemv_qkv_rope_kernel(QuantRun w, XOperand x, QkvRopeLaunch a) {
  constexpr int M = Dot::M;
  Dot dot(quant_gemv_shared, x, x.norm.on);
  const int d = a.head_dim, half = a.rotary_dim / 2, rotated_heads = a.heads + a.kv_heads;
  const int64_t q_dim = static_cast<int64_t>(a.heads) * d, kv_dim = static_cast<int64_t>(a.kv_heads) * d;
  const int64_t width = q_dim + 2 * kv_dim, pair_tasks = static_cast<int64_t>(rotated_heads) * half;
  const int64_t plain_per_head = d - 2 * half;
  const int64_t plain_rows = rotated_heads * plain_per_head + kv_dim;
  const auto plain_row = [&](int64_t plain) {
    return plain < rotated_heads * plain_per_head ? plain / plain_per_head * d + 2 * half + plain % plain_per_head
                                                  : q_dim + kv_dim + (plain - rotated_heads * plain_per_head);
  };
  // A task's two rows: a rotated pair, or two plain rows (a lone last one staged twice rather than
  // giving the kernel a one-row path).
  const auto rows_of = [&](int64_t task, int64_t(&rows)[2]) {
    if (task < pair_tasks) {
      const int64_t head = task / half, i = task % half;
      rows[0] = head * d + (a.interleaved ? 2 * i : i);
      rows[1] = head * d + (a.interleaved ? 2 * i + 1 : i + half);
      return;
    }
    const int64_t first_plain = 2 * (task - pair_tasks);
    rows[0] = plain_row(first_plain);
    rows[1] = first_plain + 1 < plain_rows ? plain_row(first_plain + 1) : rows[0];
  };
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
  dot.stream(w, pair_tasks + (plain_rows + 1) / 2, rows_of,
             [&](int64_t task, const float(&dots)[2][M], const float(&inv_rms)[M]) {
               if (threadIdx.x % 32 != 0) return;
               int64_t rows[2];
               rows_of(task, rows);
               const float bias1 = a.bias != nullptr ? a.bias[rows[0]] : 0.0f;
               const float bias2 = a.bias != nullptr ? a.bias[rows[1]] : 0.0f;
               const bool pair = task < pair_tasks, two = pair || 2 * (task - pair_tasks) + 1 < plain_rows;
#pragma unroll
               for (int r = 0; r < M; ++r) {
                 if (r >= x.m) break;
                 const float x1 = dots[0][r] * inv_rms[r] + bias1, x2 = dots[1][r] * inv_rms[r] + bias2;
                 if (pair) {
                   const int64_t i = task % half;
                   const float* cos = a.cos_sin + static_cast<int64_t>(a.table_rows[r]) * 2 * half;
                   const float c = cos[i], s = cos[half + i];
                   store(rows[0], r, x1 * c - x2 * s);
                   store(rows[1], r, x2 * c + x1 * s);
                 } else {
                   store(rows[0], r, x1);
                   if (two) store(rows[1], r, x2);
                 }
               }
             });
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

// The blocks of `kernel` (threads, shared bytes) that fit the current GPU at once (occupancy times
// SMs), asked once per kernel and size.
int resident_blocks(const void* kernel, int threads, int64_t shared_bytes);

// The grid for `tasks` tasks of a Dot kernel: a block per kWarps tasks, at most the resident ones.
template <typename Dot>
unsigned grid_for(const void* kernel, int64_t tasks, int64_t shared_bytes) {
  const unsigned wanted = blocks_for(tasks, Dot::kWarps);
  const int resident = resident_blocks(kernel, Dot::kWarps * 32, shared_bytes);
  return resident > 0 ? std::min<unsigned>(wanted, static_cast<unsigned>(resident)) : wanted;
}

// Most shared memory a Q8Dot / F16Dot block may take (x grows with m and k: a Llama-3-8B down
// projection, k = 14336, at m = 4 takes 72 KiB); past it the fp32 dot runs. Two blocks an SM fit.
constexpr int64_t kMaxDotSharedBytes = 112 * 1024;

// Lifts the kernel's dynamic shared-memory limit (48 KiB by default) to kMaxDotSharedBytes, once.
template <auto kKernel>
cudaError_t allow_shared_bytes(int64_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  static const cudaError_t result =
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kMaxDotSharedBytes));
  return result;
}

template <typename Dot>
struct DotTag {
  using type = Dot;
};

// launch(DotTag<Dot>{}) with the dot for a run of `dtype` and m rows of x of k: Q8Dot where the
// type has a Q8 decoder, F16Dot for FP8, each unless switched off (quant_kernels.h) or x outgrows
// kMaxDotSharedBytes; FloatDot otherwise.
template <int R, typename Launch>
cudaError_t with_dot(DType dtype, int64_t m, int64_t k, Launch&& launch) {
  return with_row_bound(m, [&](auto bound) {
    constexpr int M = decltype(bound)::value;
    cudaError_t err = cudaErrorInvalidValue;
    bool launched = false;
    const auto try_launch = [&](auto tag) {
      using Dot = typename decltype(tag)::type;
      if (Dot::shared_bytes(k) > kMaxDotSharedBytes) return;
      launched = true;
      err = launch(tag);
    };
    if (quant_q8_activations_enabled())
      quant_q8x::with_q8_decoder(dtype, [&](auto dec) { try_launch(DotTag<Q8Dot<decltype(dec), M, R>>{}); });
    // fp16 x only pays at one or two rows: at four its x traffic and shared memory made it slower
    // than the fp32 dot (H100, 2026-12-07: 4096 x 4096, 32.5 against 25.5 us).
    if constexpr (M <= 2) {
      if (!launched && quant_f16_activations_enabled()) {
        if (dtype == DType::F8_CHANNEL) try_launch(DotTag<F16Dot<quant_decode::F8<false>, M, R>>{});
        if (dtype == DType::F8_G128) try_launch(DotTag<F16Dot<quant_decode::F8<true>, M, R>>{});
      }
    }
    if (!launched)
      quant_decode::with_decoder(dtype, [&](auto dec) { err = launch(DotTag<FloatDot<decltype(dec), M, R>>{}); });
    return err;
  });
}

}  // namespace splitflow::cuda::quant_gemv_detail
