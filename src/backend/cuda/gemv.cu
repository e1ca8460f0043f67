// backend/cuda/gemv.cu — y = x W^T (+ bias) (+ y, accumulating) for a few rows of x: the decode-time matmul, where
// the time is the weight stream (each weight is used m <= 8 times). cuBLASLt's GEMV-shaped
// kernels reach ~85 % of the copy bandwidth on H100; this kernel keeps more bytes in flight:
// one warp per output row, each lane issuing kUnroll independent 16-byte weight loads (non-
// caching: a weight is read once per step) before using any of them. The gated variant also
// applies the MLP activation, so the up projection's product never goes to memory.
#include "backend/cuda/kernels.h"
#include "backend/cuda/activation.cuh"
#include "backend/cuda/kv_cache.cuh"

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

namespace splitflow::cuda {
namespace {

// Warps a block, by rows of x: 16 for one row (Llama-2-7B / Llama-3-8B batch 1 ran 1.2-1.6 %
// faster than with 8, and 2 % slower with 4), 8 from two rows up (16 made Llama-2-7B batch 2 3 %
// slower). Alternating runs on one H100, docs/perf-notes/cuda-decode.md.
template <int M>
constexpr int kWarpsPerBlock = M == 1 ? 16 : 8;
constexpr int kUnroll = 4;

__device__ __forceinline__ uint4 load_streaming(const bf16_bits* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t bits) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
}

// The 8 bf16 values of a 16-byte word, in order.
__device__ __forceinline__ void unpack_word(const uint4& word, float (&out)[8]) {
  const uint32_t halves[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 pair = bf16x2_to_float2(halves[i]);
    out[2 * i] = pair.x;
    out[2 * i + 1] = pair.y;
  }
}

// acc[r] += dot(8 weights in w, 8 values of x row r at column word `word`); with kSquares also
// squares[r] += the 8 values' squares (for the row's RMS).
template <int M, bool kSquares>
__device__ __forceinline__ void fma_word(float (&acc)[M], float (&squares)[M], const uint4& w, const bf16_bits* x,
                                         int64_t k, int64_t word) {
  float wf[8];
  unpack_word(w, wf);
#pragma unroll
  for (int r = 0; r < M; ++r) {
    float xf[8];
    unpack_word(__ldg(reinterpret_cast<const uint4*>(x + r * k) + word), xf);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[r] = fmaf(wf[i], xf[i], acc[r]);
    if constexpr (kSquares) {
#pragma unroll
      for (int i = 0; i < 8; ++i) squares[r] = fmaf(xf[i], xf[i], squares[r]);
    }
  }
}

__device__ __forceinline__ float warp_total(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// acc[r] = dot(w_row, x row r) for r < M, the total in every lane. x [M, k], k % 8 == 0, 16-byte
// aligned rows. With kSquares, inv_rms[r] = 1 / rms(x row r) (eps inside the root) from the same
// pass over x: an RMSNorm with its weight folded into w (InputNorm::unit_weight) costs the GEMV a
// few FMAs instead of a launch and a round trip of the normalized rows.
template <int M, bool kSquares = false>
__device__ __forceinline__ void warp_dot(const bf16_bits* w_row, const bf16_bits* x, int64_t k, float (&acc)[M],
                                         float (&inv_rms)[M], float eps = 0.0f) {
  const int lane = threadIdx.x % 32;
  const int64_t words = k / 8;
  float squares[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = squares[r] = 0.0f;
  int64_t word = lane;
  for (; word + (kUnroll - 1) * 32 < words; word += kUnroll * 32) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = load_streaming(w_row + (word + u * 32) * 8);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) fma_word<M, kSquares>(acc, squares, wv[u], x, k, word + u * 32);
  }
  for (; word < words; word += 32) fma_word<M, kSquares>(acc, squares, load_streaming(w_row + word * 8), x, k, word);
#pragma unroll
  for (int r = 0; r < M; ++r) {
    acc[r] = warp_total(acc[r]);
    if constexpr (kSquares) inv_rms[r] = rsqrtf(warp_total(squares[r]) / static_cast<float>(k) + eps);
  }
}

// warp_dot without the RMS.
template <int M>
__device__ __forceinline__ void warp_dot(const bf16_bits* w_row, const bf16_bits* x, int64_t k, float (&acc)[M]) {
  float unused[M];
  warp_dot<M, false>(w_row, x, k, acc, unused);
}

template <int M>
__device__ __forceinline__ void scale_rows(float (&acc)[M], const float (&inv_rms)[M]) {
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] *= inv_rms[r];
}

// One warp per output row. x [M, k], w [n, k] bf16; y [M, n] bf16 or f32.
template <int M>
__global__ void __launch_bounds__(kWarpsPerBlock<M> * 32)
    gemv_kernel(const bf16_bits* __restrict__ x, const bf16_bits* __restrict__ w, const float* __restrict__ bias,
                bf16_bits* y_bf16, float* y_f32, int64_t n, int64_t k, bool accumulate) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock<M> + threadIdx.x / 32;
  if (row >= n) return;
  float acc[M];
  warp_dot<M>(w + row * k, x, k, acc);
  if (threadIdx.x % 32 != 0) return;
  const float b = bias != nullptr ? bias[row] : 0.0f;
#pragma unroll
  for (int r = 0; r < M; ++r) {
    if (y_f32 != nullptr) {
      y_f32[r * n + row] = acc[r] + b + (accumulate ? y_f32[r * n + row] : 0.0f);
    } else {
      __nv_bfloat16* y = reinterpret_cast<__nv_bfloat16*>(y_bf16) + r * n + row;
      *y = __float2bfloat16(acc[r] + b + (accumulate ? __bfloat162float(*y) : 0.0f));
    }
  }
}

// One warp per output column j of a gated MLP: gate row j and up row inner + j of w [2 inner, k],
// y[r, j] = act(gate + bias) * (up + bias) from the fp32 sums (no bf16 round trip of the product).
template <int M, bool kNorm>
__global__ void __launch_bounds__(kWarpsPerBlock<M> * 32)
    gemv_gated_kernel(const bf16_bits* __restrict__ x, const bf16_bits* __restrict__ w, const float* __restrict__ bias,
                      int act, bf16_bits* y, int64_t inner, int64_t k, GemvNorm norm) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock<M> + threadIdx.x / 32;
  if (j >= inner) return;
  float gate[M], up[M], inv_rms[M];
  warp_dot<M, kNorm>(w + j * k, x, k, gate, inv_rms, norm.eps);
  warp_dot<M>(w + (inner + j) * k, x, k, up);
  if constexpr (kNorm) {
    scale_rows(gate, inv_rms);
    scale_rows(up, inv_rms);
  }
  if (threadIdx.x % 32 != 0) return;
  const float gate_bias = bias != nullptr ? bias[j] : 0.0f, up_bias = bias != nullptr ? bias[inner + j] : 0.0f;
#pragma unroll
  for (int r = 0; r < M; ++r)
    reinterpret_cast<__nv_bfloat16*>(y)[r * inner + j] =
        __float2bfloat16(activate(gate[r] + gate_bias, act) * (up[r] + up_bias));
}

// The QKV projection with RoPE and the KV write in its epilogue (launch_gemv_qkv_rope). Tasks:
// first a pair of rotated rows per (q or k head, i < half), then two consecutive rows of the
// remaining ones (dims past rotary_dim of q and k heads, every v row). A pair is rotated from its
// fp32 sums. Every task reads two rows so the blocks, all resident at once, load the SMs evenly
// (one-row v tasks left a third of the SMs with a quarter more bytes than the others).
template <int M, bool kNorm, typename Cache>
__global__ void __launch_bounds__(kWarpsPerBlock<M> * 32) gemv_qkv_rope_kernel(QkvRopeLaunch a) {
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock<M> + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int d = a.head_dim, half = a.rotary_dim / 2, rotated_heads = a.heads + a.kv_heads;
  const int64_t q_dim = static_cast<int64_t>(a.heads) * d, kv_dim = static_cast<int64_t>(a.kv_heads) * d;
  const int64_t width = q_dim + 2 * kv_dim, pair_tasks = static_cast<int64_t>(rotated_heads) * half;
  const int64_t plain_per_head = d - 2 * half;
  const int64_t plain_rows = rotated_heads * plain_per_head + kv_dim;
  if (task >= pair_tasks + (plain_rows + 1) / 2) return;
  // The cache position of row `row` (a k or v row) for token r, or -1 when it is not stored.
  const auto cache_index = [&](int64_t row, int r) -> int64_t {
    const int32_t slot = a.slots[r];
    if (row < q_dim || slot < 0 || slot >= a.capacity_slots) return -1;
    return static_cast<int64_t>(slot) * kv_dim + (row - q_dim) % kv_dim;
  };
  const auto store = [&](int64_t row, int r, float value) {
    const bf16_bits rounded = __bfloat16_as_ushort(__float2bfloat16(value));
    a.qkv[r * width + row] = rounded;
    const int64_t at = cache_index(row, r);
    if (at < 0) return;
    store_kv(static_cast<Cache*>(row < q_dim + kv_dim ? a.k_cache : a.v_cache) + at, rounded);
  };
  if (task < pair_tasks) {
    const int64_t head = task / half, i = task % half;
    const int64_t row1 = head * d + (a.interleaved ? 2 * i : i), row2 = head * d + (a.interleaved ? 2 * i + 1 : i + half);
    float first[M], second[M], inv_rms[M];
    warp_dot<M, kNorm>(a.w + row1 * a.k, a.x, a.k, first, inv_rms, a.norm.eps);
    warp_dot<M>(a.w + row2 * a.k, a.x, a.k, second);
    if constexpr (kNorm) {
      scale_rows(first, inv_rms);
      scale_rows(second, inv_rms);
    }
    if (lane != 0) return;
    const float bias1 = a.bias != nullptr ? a.bias[row1] : 0.0f, bias2 = a.bias != nullptr ? a.bias[row2] : 0.0f;
#pragma unroll
    for (int r = 0; r < M; ++r) {
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
  warp_dot<M, kNorm>(a.w + row1 * a.k, a.x, a.k, acc1, inv_rms, a.norm.eps);
  if (two) warp_dot<M>(a.w + row2 * a.k, a.x, a.k, acc2);
  if (lane != 0) return;
  if constexpr (kNorm) {
    scale_rows(acc1, inv_rms);
    if (two) scale_rows(acc2, inv_rms);
  }
  const float bias1 = a.bias != nullptr ? a.bias[row1] : 0.0f, bias2 = a.bias != nullptr ? a.bias[row2] : 0.0f;
#pragma unroll
  for (int r = 0; r < M; ++r) {
    store(row1, r, acc1[r] + bias1);
    if (two) store(row2, r, acc2[r] + bias2);
  }
}

template <int M, bool kNorm, typename Cache>
cudaError_t launch_qkv_rope(const QkvRopeLaunch& a, cudaStream_t stream) {
  const int64_t rotated_heads = a.heads + a.kv_heads, half = a.rotary_dim / 2;
  const int64_t plain_rows = rotated_heads * (a.head_dim - 2 * half) + static_cast<int64_t>(a.kv_heads) * a.head_dim;
  const int64_t tasks = rotated_heads * half + (plain_rows + 1) / 2;
  const auto blocks = static_cast<unsigned>((tasks + kWarpsPerBlock<M> - 1) / kWarpsPerBlock<M>);
  gemv_qkv_rope_kernel<M, kNorm, Cache><<<blocks, kWarpsPerBlock<M> * 32, 0, stream>>>(a);
  return cudaGetLastError();
}

template <int M>
cudaError_t launch(const bf16_bits* x, const bf16_bits* w, const float* bias, bf16_bits* y_bf16, float* y_f32, int64_t n,
                   int64_t k, bool accumulate, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((n + kWarpsPerBlock<M> - 1) / kWarpsPerBlock<M>);
  gemv_kernel<M><<<blocks, kWarpsPerBlock<M> * 32, 0, stream>>>(x, w, bias, y_bf16, y_f32, n, k, accumulate);
  return cudaGetLastError();
}

template <int M, bool kNorm>
cudaError_t launch_gated(const bf16_bits* x, const bf16_bits* w, const float* bias, int act, bf16_bits* y,
                         int64_t inner, int64_t k, const GemvNorm& norm, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((inner + kWarpsPerBlock<M> - 1) / kWarpsPerBlock<M>);
  gemv_gated_kernel<M, kNorm><<<blocks, kWarpsPerBlock<M> * 32, 0, stream>>>(x, w, bias, act, y, inner, k, norm);
  return cudaGetLastError();
}

// launch(std::integral_constant<int, m>{}) for m in 1..kMaxGemvRows: the row count as a template argument.
template <typename Launch>
cudaError_t with_rows(int64_t m, Launch&& launch) {
  switch (m) {
    case 1: return launch(std::integral_constant<int, 1>{});
    case 2: return launch(std::integral_constant<int, 2>{});
    case 3: return launch(std::integral_constant<int, 3>{});
    case 4: return launch(std::integral_constant<int, 4>{});
    case 5: return launch(std::integral_constant<int, 5>{});
    case 6: return launch(std::integral_constant<int, 6>{});
    case 7: return launch(std::integral_constant<int, 7>{});
    case 8: return launch(std::integral_constant<int, 8>{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool gemv_supported(const void* x, const void* w, int64_t m, int64_t k) {
  return m >= 1 && m <= kMaxGemvRows && k % 8 == 0 && aligned_to(x, 16) && aligned_to(w, 16);
}

cudaError_t launch_gemv(const bf16_bits* x, const bf16_bits* w, const float* bias, bf16_bits* y_bf16, float* y_f32,
                        int64_t m, int64_t n, int64_t k, bool accumulate, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return with_rows(m, [&](auto rows) {
    return launch<decltype(rows)::value>(x, w, bias, y_bf16, y_f32, n, k, accumulate, stream);
  });
}

cudaError_t launch_gemv_gated(const bf16_bits* x, const bf16_bits* w, const float* bias, int act, bf16_bits* y,
                              int64_t m, int64_t inner, int64_t k, const GemvNorm& norm, cudaStream_t stream) {
  if (inner == 0) return cudaSuccess;
  return with_rows(m, [&](auto rows) {
    constexpr int kRows = decltype(rows)::value;
    return norm.on ? launch_gated<kRows, true>(x, w, bias, act, y, inner, k, norm, stream)
                   : launch_gated<kRows, false>(x, w, bias, act, y, inner, k, norm, stream);
  });
}

cudaError_t launch_gemv_qkv_rope(const QkvRopeLaunch& a, cudaStream_t stream) {
  return with_kv_element(a.kv_fp8, [&](auto element) {
    using Cache = decltype(element);
    return with_rows(a.m, [&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      return a.norm.on ? launch_qkv_rope<kRows, true, Cache>(a, stream)
                       : launch_qkv_rope<kRows, false, Cache>(a, stream);
    });
  });
}

}  // namespace splitflow::cuda
