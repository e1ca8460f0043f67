// backend/cuda/sampling.cu — one token per logits row on the GPU, so a decode step copies R
// token ids to the host instead of R x vocab logits. One block of 1024 threads per row.
//
// The rule of sampling/sampling_rule.h (greedy: argmax, the first index on ties; else temperature,
// top-k, top-p, min-p, then a Gumbel-max draw keyed by (seed, step, token)), computing every value
// with that header's functions so that it rounds as the host does (sampling/host_rule.h, which
// tests/backend_cuda checks it against token for token). Thresholds are exact values found by
// radix select over the row's order-preserving float keys (4 passes of 8 bits): top-k keeps every
// value >= the k-th largest (ties kept); top-p keeps a value v when the mass strictly above v,
// within the top-k set, is < top_p times that set's mass (ties kept; masses are the rule's
// rule_expf weights, summed in double so that only the order of addition differs from the host);
// min-p keeps z >= z_max + rule_logf(min_p).
#include "backend/cuda/kernels.h"
#include "sampling/sampling_rule.h"

#include <cstdint>

namespace splitflow::cuda {
namespace {

constexpr int kSampleThreads = 1024;
constexpr int kBins = 256;

// -0 and +0 get one key (the host compares them equal).
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t bits = __float_as_uint(__fadd_rn(v, 0.0f));
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}
__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? key & 0x7fffffffu : ~key);
}

struct ArgMax {
  float value;
  int index;
};
__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}

// Block-wide argmax (first index on ties); every thread gets the result.
__device__ ArgMax block_argmax(ArgMax v) {
  __shared__ ArgMax partial[32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    ArgMax other{__shfl_xor_sync(0xffffffffu, v.value, offset), __shfl_xor_sync(0xffffffffu, v.index, offset)};
    v = better(v, other);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  ArgMax result = partial[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) result = better(result, partial[w]);
  __syncthreads();
  return result;
}

__device__ double block_total(double v) {
  __shared__ double partial[32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += partial[w];
  __syncthreads();
  return total;
}

// Radix select over the order keys of z = scaled_logit(row, inv_temperature), restricted to keys
// >= floor_key, where an element weighs 1 (by_mass false: top-k) or top_p_weight(z, z_max)
// (top-p). Returns the key K
// of the lowest element whose weight strictly above it is < target: for counts, the target-th
// largest key; for mass, the smallest value top-p keeps. Most significant byte first: in each
// pass the chosen bin is the highest non-empty one where the running weight reaches the target
// (or the lowest non-empty one), and the next pass looks inside it.
__device__ uint32_t radix_threshold(const float* row, int64_t vocab, float inv_temperature, float z_max,
                                    uint32_t floor_key, bool by_mass, double target) {
  __shared__ double bin_weight[kBins];
  __shared__ uint32_t chosen_prefix;
  __shared__ double chosen_above;
  uint32_t prefix = 0;
  double above = 0.0;  // weight of the keys above the current prefix's range
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) bin_weight[b] = 0.0;
    __syncthreads();
    const uint32_t high_mask = shift == 24 ? 0u : ~((1u << (shift + 8)) - 1u);
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float z = scaled_logit(row[i], inv_temperature);
      const uint32_t key = order_key(z);
      if (key < floor_key || (key & high_mask) != prefix) continue;
      atomicAdd(&bin_weight[(key >> shift) & 0xffu], by_mass ? static_cast<double>(top_p_weight(z, z_max)) : 1.0);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double running = above;
      int chosen = 0;
      double chosen_running = above;
      for (int b = kBins - 1; b >= 0; --b) {
        const double w = bin_weight[b];
        if (w == 0.0) continue;
        chosen = b;
        chosen_running = running;
        if (running + w >= target) break;
        running += w;
      }
      chosen_prefix = prefix | (static_cast<uint32_t>(chosen) << shift);
      chosen_above = chosen_running;
    }
    __syncthreads();
    prefix = chosen_prefix;
    above = chosen_above;
    __syncthreads();
  }
  return prefix;
}

// The row's argmax (first index on ties), every thread getting it. A thread keeps kArgmaxWords
// 16-byte loads in flight: the row was just written and sits in L2, so a scalar loop would wait one
// L2 round trip per element it takes (125 of them for a 128k vocabulary).
__device__ ArgMax row_argmax(const float* row, int64_t vocab) {
  constexpr int kArgmaxWords = 4;
  ArgMax best{-INFINITY, 0x7fffffff};
  int64_t scalar_from = 0;
  if (reinterpret_cast<uintptr_t>(row) % 16 == 0) {
    const auto* words = reinterpret_cast<const float4*>(row);
    const int64_t count = vocab / 4;
    for (int64_t w0 = threadIdx.x; w0 < count; w0 += kArgmaxWords * blockDim.x) {
      float4 word[kArgmaxWords];
#pragma unroll
      for (int u = 0; u < kArgmaxWords; ++u) {
        const int64_t w = w0 + u * blockDim.x;
        word[u] = w < count ? words[w] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
      }
#pragma unroll
      for (int u = 0; u < kArgmaxWords; ++u) {
        // Past the row: (-inf, the largest index), which never replaces a candidate.
        const int64_t w = w0 + u * blockDim.x;
        const bool inside = w < count;
        const int i = static_cast<int>(4 * w);
        best = better(best, ArgMax{word[u].x, inside ? i : 0x7fffffff});
        best = better(best, ArgMax{word[u].y, inside ? i + 1 : 0x7fffffff});
        best = better(best, ArgMax{word[u].z, inside ? i + 2 : 0x7fffffff});
        best = better(best, ArgMax{word[u].w, inside ? i + 3 : 0x7fffffff});
      }
    }
    scalar_from = 4 * count;
  }
  for (int64_t i = scalar_from + threadIdx.x; i < vocab; i += blockDim.x)
    best = better(best, ArgMax{row[i], static_cast<int>(i)});
  return block_argmax(best);
}

__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const float* logits, const SamplingRow* rows, int32_t* tokens, int64_t vocab) {
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const SamplingRow params = rows[blockIdx.x];
  const ArgMax best = row_argmax(row, vocab);
  if (params.temperature <= 0.0f) {
    if (threadIdx.x == 0) tokens[blockIdx.x] = best.index;
    return;
  }
  const float inv_t = inverse_temperature(params.temperature);
  const float z_max = scaled_logit(best.value, inv_t);

  uint32_t floor_key = 0;
  if (params.top_k > 0 && params.top_k < vocab)
    floor_key = radix_threshold(row, vocab, inv_t, z_max, 0, false, static_cast<double>(params.top_k));
  if (params.top_p < 1.0f) {
    double kept_mass = 0.0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float z = scaled_logit(row[i], inv_t);
      if (order_key(z) >= floor_key) kept_mass += top_p_weight(z, z_max);
    }
    kept_mass = block_total(kept_mass);
    const uint32_t p_key =
        radix_threshold(row, vocab, inv_t, z_max, floor_key, true, static_cast<double>(params.top_p) * kept_mass);
    floor_key = max(floor_key, p_key);
  }
  float floor_z = floor_key == 0 ? -INFINITY : key_value(floor_key);
  if (params.min_p > 0.0f) floor_z = fmaxf(floor_z, min_p_floor(z_max, params.min_p));

  const uint32_t key = sampling_noise_key(params.seed, params.step);
  ArgMax pick{-INFINITY, 0x7fffffff};
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float z = scaled_logit(row[i], inv_t);
    if (z < floor_z || !may_win_draw(z, z_max)) continue;
    pick = better(pick, ArgMax{draw_score(z, key, static_cast<uint32_t>(i)), static_cast<int>(i)});
  }
  pick = block_argmax(pick);
  if (threadIdx.x == 0) tokens[blockIdx.x] = pick.index == 0x7fffffff ? best.index : pick.index;
}

}  // namespace

cudaError_t launch_sample(const float* logits, const SamplingRow* rows, int32_t* tokens, int64_t count, int64_t vocab,
                          cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  sample_kernel<<<static_cast<unsigned>(count), kSampleThreads, 0, stream>>>(logits, rows, tokens, vocab);
  return cudaGetLastError();
}

}  // namespace splitflow::cuda
