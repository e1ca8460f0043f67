// backend/cuda/quant_gemv.cu — the decode GEMVs on quantized weights (quant_kernels.h): one warp per
// output row as gemv.cu, each lane taking 32-element units of the row (lane, lane + 32, ...):
// the unit's packed bytes are decoded into fp32 registers (quant_decode.cuh) and multiplied with
// the bf16 x rows, accumulating in fp32. Only the packed bytes cross the memory bus (4.5 bits per
// weight for Q4_0 instead of bf16's 16). Kernels are instantiated per decoder: one kernel holding
// every decoder behind a switch took the register count of the largest (one block per SM, too few
// rows' loads in flight to cover the memory latency: no faster than bf16). A Mixed matrix is one
// plain GEMV launch per run, into its output columns; the fused gated and QKV kernels take a
// single-dtype matrix (a Mixed one goes the unfused way). The epilogues are gemv.cu's: bias, accumulate, the gated activation, RoPE
// with the KV write, and an input RMSNorm, here with its weight applied to x on the fly (the
// quantized matrices cannot take a folded norm weight).
//
// Rows of x: M is a template bound (1, 2, 4, 8); rows past m read row m - 1 and are not stored.
#include "backend/cuda/activation.cuh"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/quant_decode.cuh"
#include "backend/cuda/quant_kernels.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

namespace splitflow::cuda {
namespace {

template <int M>
constexpr int kWarps = M == 1 ? 16 : 8;

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

// The x operand: m rows of k bf16, and the input norm.
struct XOperand {
  const bf16_bits* x;
  int m;
  int64_t k;
  QuantNorm norm;
};

// acc[r] += dot(row, x row r) over this lane's units; squares[r] += x^2 when want_squares.
template <typename Dec, int M>
__device__ __forceinline__ void dot_units(const uint8_t* row, const XOperand& x, bool want_squares, float (&acc)[M],
                                          float (&squares)[M]) {
  const int lane = threadIdx.x % 32;
  const int64_t k = x.k, units = k / 32;
  const float* gw = x.norm.weight;
#pragma unroll 2
  for (int64_t u = lane; u < units; u += 32) {
    float w[32];
    Dec::unit(row, k, u, w);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = 32 * u + 8 * j;
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
        if (want_squares) {
#pragma unroll
          for (int i = 0; i < 8; ++i) squares[r] = fmaf(xf[i], xf[i], squares[r]);
        }
        if (gw != nullptr) {
#pragma unroll
          for (int i = 0; i < 8; ++i) xf[i] *= g[i];
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r] = fmaf(w[8 * j + i], xf[i], acc[r]);
      }
    }
  }
}

// acc[r] = dot(row `row` of w, x row r (times the norm weight)), the total in every lane. With
// want_rms (the norm on), inv_rms[r] = the row's 1 / rms from the same pass over x. One call site
// per kernel: each inlines every decoder.
template <typename Dec, int M>
__device__ __forceinline__ void row_dot(const QuantRun& w, int64_t row, const XOperand& x, bool want_rms,
                                        float (&acc)[M], float (&inv_rms)[M]) {
  const uint8_t* p = w.data + (row - w.first_row) * w.row_bytes;
  float squares[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = squares[r] = 0.0f;
  dot_units<Dec, M>(p, x, want_rms, acc, squares);
#pragma unroll
  for (int r = 0; r < M; ++r) {
    acc[r] = warp_total(acc[r]);
    if (want_rms) inv_rms[r] = rsqrtf(warp_total(squares[r]) / static_cast<float>(x.k) + x.norm.eps);
  }
}

// row_dot of row1 (with the rms when the norm is on), then of row2 when `second`, through one
// row_dot call site (a loop, not unrolled), so each kernel holds one copy of the decoders.
template <typename Dec, int M>
__device__ __forceinline__ void two_rows(const QuantRun& w, int64_t row1, int64_t row2, bool second,
                                         const XOperand& x, float (&acc1)[M], float (&acc2)[M], float (&inv_rms)[M]) {
#pragma unroll 1
  for (int pass = 0; pass < (second ? 2 : 1); ++pass) {
    float acc[M], rms[M];
    row_dot<Dec, M>(w, pass == 0 ? row1 : row2, x, pass == 0 && x.norm.on, acc, rms);
#pragma unroll
    for (int r = 0; r < M; ++r) {
      if (pass == 0) {
        acc1[r] = acc[r];
        inv_rms[r] = rms[r];
      } else {
        acc2[r] = acc[r];
      }
    }
  }
}

// The normalized product of row `row`: row_dot, then scaled by the given inv_rms (norm on).
template <int M>
__device__ __forceinline__ void scale_rows(float (&acc)[M], const float (&inv_rms)[M], bool on) {
  if (!on) return;
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] *= inv_rms[r];
}

// Rows [w.first_row, w.end_row) of y's n columns (one run of the matrix).
template <typename Dec, int M>
__global__ void __launch_bounds__(kWarps<M> * 32)
    quant_gemv_kernel(QuantRun w, int64_t n, XOperand x, const float* __restrict__ bias, bf16_bits* y_bf16,
                      float* y_f32, bool accumulate) {
  const int64_t row = w.first_row + static_cast<int64_t>(blockIdx.x) * kWarps<M> + threadIdx.x / 32;
  if (row >= w.end_row) return;
  float acc[M], unused[M];
  row_dot<Dec, M>(w, row, x, false, acc, unused);
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
__global__ void __launch_bounds__(kWarps<M> * 32)
    quant_gemv_gated_kernel(QuantRun w, XOperand x, const float* __restrict__ bias, int act, bf16_bits* y) {
  const int64_t inner = w.end_row / 2;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kWarps<M> + threadIdx.x / 32;
  if (j >= inner) return;
  float gate[M], up[M], inv_rms[M];
  two_rows<Dec, M>(w, j, inner + j, true, x, gate, up, inv_rms);
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
__global__ void __launch_bounds__(kWarps<M> * 32) quant_gemv_qkv_rope_kernel(QuantRun w, XOperand x, QkvRopeLaunch a) {
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps<M> + threadIdx.x / 32;
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
    float first[M], second[M], inv_rms[M];
    two_rows<Dec, M>(w, row1, row2, true, x, first, second, inv_rms);
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
  float acc1[M], acc2[M], inv_rms[M];
  two_rows<Dec, M>(w, row1, row2, two, x, acc1, acc2, inv_rms);
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

unsigned blocks_for(int64_t tasks, int warps) { return static_cast<unsigned>((tasks + warps - 1) / warps); }

}  // namespace

cudaError_t launch_quant_gemv(const QuantMatrix& w, const bf16_bits* x, const float* bias, bf16_bits* y_bf16,
                              float* y_f32, int64_t m, bool accumulate, cudaStream_t stream) {
  if (w.n == 0 || m == 0) return cudaSuccess;
  const XOperand xo{x, static_cast<int>(m), w.k, QuantNorm{}};
  for (int i = 0; i < w.count; ++i) {
    const QuantRun& run = w.runs[i];
    cudaError_t err = cudaErrorInvalidValue;
    quant_decode::with_decoder(run.dtype, [&](auto dec) {
      err = with_row_bound(m, [&](auto bound) {
        constexpr int M = decltype(bound)::value;
        quant_gemv_kernel<decltype(dec), M><<<blocks_for(run.end_row - run.first_row, kWarps<M>), kWarps<M> * 32, 0,
                                              stream>>>(run, w.n, xo, bias, y_bf16, y_f32, accumulate);
        return cudaGetLastError();
      });
    });
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t launch_quant_gemv_gated(const QuantMatrix& w, const bf16_bits* x, const float* bias, int act,
                                    bf16_bits* y, int64_t m, const QuantNorm& norm, cudaStream_t stream) {
  if (w.n == 0 || m == 0) return cudaSuccess;
  if (w.count != 1) return cudaErrorInvalidValue;
  const XOperand xo{x, static_cast<int>(m), w.k, norm};
  const QuantRun& run = w.runs[0];
  cudaError_t err = cudaErrorInvalidValue;
  quant_decode::with_decoder(run.dtype, [&](auto dec) {
    err = with_row_bound(m, [&](auto bound) {
      constexpr int M = decltype(bound)::value;
      quant_gemv_gated_kernel<decltype(dec), M><<<blocks_for(w.n / 2, kWarps<M>), kWarps<M> * 32, 0, stream>>>(
          run, xo, bias, act, y);
      return cudaGetLastError();
    });
  });
  return err;
}

cudaError_t launch_quant_gemv_qkv_rope(const QuantMatrix& w, const QkvRopeLaunch& a, const QuantNorm& norm,
                                       cudaStream_t stream) {
  if (w.count != 1) return cudaErrorInvalidValue;
  const XOperand xo{a.x, a.m, w.k, norm};
  const int64_t rotated_heads = a.heads + a.kv_heads, half = a.rotary_dim / 2;
  const int64_t plain_rows = rotated_heads * (a.head_dim - 2 * half) + static_cast<int64_t>(a.kv_heads) * a.head_dim;
  const int64_t tasks = rotated_heads * half + (plain_rows + 1) / 2;
  const QuantRun& run = w.runs[0];
  cudaError_t err = cudaErrorInvalidValue;
  quant_decode::with_decoder(run.dtype, [&](auto dec) {
    err = with_row_bound(a.m, [&](auto bound) {
      constexpr int M = decltype(bound)::value;
      quant_gemv_qkv_rope_kernel<decltype(dec), M><<<blocks_for(tasks, kWarps<M>), kWarps<M> * 32, 0, stream>>>(
          run, xo, a);
      return cudaGetLastError();
    });
  });
  return err;
}

}  // namespace splitflow::cuda
