// backend/cuda/attention_decode.cu — paged attention for decode steps (one new token per
// sequence) with head_dim 64, 128 or 256 and GQA groups of 1, 2, 4 or 8 query heads: one block of
// 4 warps per (sequence, kv head, KV partition) serves the kv head's whole group, so K and V are
// read once for all its query heads. Every warp works: warp w takes key chunks w, w + 4, ... of
// 32 keys. Scores: lane j reads key j's whole row (head_dim / 8 16-byte loads, all issued before
// use) and dots it with each query head's q in shared memory. Values: D / 8 lanes share a key,
// 8 dims (one 16-byte load) per lane, so a warp covers 32 / (D / 8) keys per pass. The warps'
// online-softmax states merge in shared memory; with several partitions the result goes to the
// split-KV partials that attention_combine_kernel merges (the layout of kernels.cu's
// attention_kernel).
#include "backend/cuda/kernels.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

namespace splitflow::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kChunk = 32;                   // keys per warp step
constexpr int kMinKeys = kWarps * kChunk;    // smallest partition: one chunk per warp

__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float (&f)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 pair = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
    f[2 * i] = pair.x;
    f[2 * i + 1] = pair.y;
  }
}

template <int D, int G>
__global__ void __launch_bounds__(kWarps * 32) attention_decode_kernel(AttentionLaunch a, float* partials) {
  constexpr int kWords = D / 8;               // 16-byte words per row
  constexpr int kLanesPerKey = D / 8;         // value phase
  constexpr int kKeysPerPass = 32 / kLanesPerKey;
  constexpr int kWordGroup = kWords < 16 ? kWords : 16;  // key words in flight per lane
  __shared__ __align__(16) float q_s[G][D];
  __shared__ float warp_m[kWarps][G], warp_l[kWarps][G];
  __shared__ __align__(16) float warp_acc[kWarps][G][D];

  // The block serves the G query heads of one kv head: K and V are read once for all of them.
  const int s = blockIdx.x, kv_head = blockIdx.y, head0 = kv_head * G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q_row = a.query_start[s];
  if (a.query_start[s + 1] - q_row < 1) return;
  const int pos = a.context_lens[s] - 1;
  const int first_visible = a.sliding_window > 0 ? max(0, pos - a.sliding_window + 1) : 0;
  const int visible = pos + 1 - first_visible;
  const int parts = static_cast<int>(gridDim.z);
  const int partition_keys =
      parts == 1 ? visible : max(kMinKeys, (visible + parts * kChunk - 1) / (parts * kChunk) * kChunk);
  const int begin = first_visible + static_cast<int>(blockIdx.z) * partition_keys;
  const int end = min(pos + 1, begin + partition_keys);
  const int64_t width = static_cast<int64_t>(a.heads + 2 * a.kv_heads) * D;
  const int64_t kv_dim = static_cast<int64_t>(a.kv_heads) * D;
  const int32_t* table = a.block_tables + static_cast<int64_t>(s) * a.table_width;
  const bf16_bits* k_base = a.k_cache + static_cast<int64_t>(kv_head) * D;
  const bf16_bits* v_base = a.v_cache + static_cast<int64_t>(kv_head) * D;

  for (int i = threadIdx.x; i < G * D; i += blockDim.x)
    q_s[i / D][i % D] =
        __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(a.qkv)[q_row * width + head0 * D + i]) * a.scale;
  __syncthreads();

  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
  }
  for (int chunk0 = begin + warp * kChunk; chunk0 < end; chunk0 += kWarps * kChunk) {
    const int count = min(kChunk, end - chunk0);
    // Scores: lane j takes key chunk0 + j; its row's words load in groups of 16, all before use.
    float score[G];
#pragma unroll
    for (int g = 0; g < G; ++g) score[g] = lane < count ? 0.0f : -INFINITY;
    if (lane < count) {
      const int p = chunk0 + lane;
      const int64_t slot = static_cast<int64_t>(__ldg(table + p / a.block_size)) * a.block_size + p % a.block_size;
      const uint4* row = reinterpret_cast<const uint4*>(k_base + slot * kv_dim);
#pragma unroll
      for (int w0 = 0; w0 < kWords; w0 += kWordGroup) {
        uint4 words[kWordGroup];
#pragma unroll
        for (int w = 0; w < kWordGroup; ++w) words[w] = __ldg(row + w0 + w);
#pragma unroll
        for (int w = 0; w < kWordGroup; ++w) {
          float k[8];
          bf16x8_to_float(words[w], k);
#pragma unroll
          for (int g = 0; g < G; ++g) {
            const float4 q0 = *reinterpret_cast<const float4*>(&q_s[g][(w0 + w) * 8]);
            const float4 q1 = *reinterpret_cast<const float4*>(&q_s[g][(w0 + w) * 8 + 4]);
            score[g] += q0.x * k[0] + q0.y * k[1] + q0.z * k[2] + q0.w * k[3] + q1.x * k[4] + q1.y * k[5] +
                        q1.z * k[6] + q1.w * k[7];
          }
        }
      }
    }
    float weight[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float chunk_max = score[g];
      for (int offset = 16; offset > 0; offset >>= 1)
        chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, offset));
      const float new_m = fmaxf(m[g], chunk_max);
      const float correction = __expf(m[g] - new_m);
      weight[g] = lane < count ? __expf(score[g] - new_m) : 0.0f;
      float weight_sum = weight[g];
      for (int offset = 16; offset > 0; offset >>= 1) weight_sum += __shfl_xor_sync(0xffffffffu, weight_sum, offset);
      l[g] = l[g] * correction + weight_sum;
      m[g] = new_m;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= correction;
    }

    // Values: kKeysPerPass keys per pass, 8 dims per lane; a group of passes loads before use.
    const int my_key = lane / kLanesPerKey, my_dims = (lane % kLanesPerKey) * 8;
    constexpr int kPasses = kChunk / kKeysPerPass, kPassGroup = kPasses < 8 ? kPasses : 8;
#pragma unroll
    for (int pg = 0; pg < kPasses; pg += kPassGroup) {
      uint4 words[kPassGroup];
#pragma unroll
      for (int i = 0; i < kPassGroup; ++i) {
        const int j = (pg + i) * kKeysPerPass + my_key;
        words[i] = make_uint4(0, 0, 0, 0);
        if (j < count) {
          const int p = chunk0 + j;
          const int64_t slot = static_cast<int64_t>(__ldg(table + p / a.block_size)) * a.block_size + p % a.block_size;
          words[i] = __ldg(reinterpret_cast<const uint4*>(v_base + slot * kv_dim + my_dims));
        }
      }
#pragma unroll
      for (int i = 0; i < kPassGroup; ++i) {
        float v[8];
        bf16x8_to_float(words[i], v);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float w = __shfl_sync(0xffffffffu, weight[g], (pg + i) * kKeysPerPass + my_key);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[g][e] += w * v[e];
        }
      }
    }
  }
  // Lanes sharing dims (lane % kLanesPerKey) hold different keys' sums: add them up.
#pragma unroll
  for (int offset = kLanesPerKey; offset < 32; offset <<= 1)
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], offset);
  if (lane == 0)
#pragma unroll
    for (int g = 0; g < G; ++g) {
      warp_m[warp][g] = m[g];
      warp_l[warp][g] = l[g];
    }
  if (lane < kLanesPerKey)
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int e = 0; e < 8; ++e) warp_acc[warp][g][lane * 8 + e] = acc[g][e];
  __syncthreads();

  // Merge the warps per head (a warp with no key has m = -inf and weighs 0).
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    float top = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) top = fmaxf(top, warp_m[w][g]);
    float total = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float scale = top == -INFINITY ? 0.0f : __expf(warp_m[w][g] - top);
      total += scale * warp_l[w][g];
      sum += scale * warp_acc[w][g][d];
    }
    const int head = head0 + g;
    if (partials != nullptr) {
      float* dst = partials + ((static_cast<int64_t>(q_row) * a.heads + head) * gridDim.z + blockIdx.z) * (D + 2);
      if (d == 0) {
        dst[0] = top;
        dst[1] = total;
      }
      dst[2 + d] = sum;
    } else {
      reinterpret_cast<__nv_bfloat16*>(a.out)[(static_cast<int64_t>(q_row) * a.heads + head) * D + d] =
          __float2bfloat16(sum / total);
    }
  }
}

template <int D, int G>
cudaError_t launch_dg(const AttentionLaunch& a, int partitions, float* partials, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.seqs), static_cast<unsigned>(a.kv_heads), static_cast<unsigned>(partitions));
  attention_decode_kernel<D, G><<<grid, kWarps * 32, 0, stream>>>(a, partials);
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_d(const AttentionLaunch& a, int partitions, float* partials, cudaStream_t stream) {
  switch (a.heads / a.kv_heads) {
    case 1: return launch_dg<D, 1>(a, partitions, partials, stream);
    case 2: return launch_dg<D, 2>(a, partitions, partials, stream);
    case 4: return launch_dg<D, 4>(a, partitions, partials, stream);
    case 8: return launch_dg<D, 8>(a, partitions, partials, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool attention_decode_supported(const AttentionLaunch& a) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int group = a.heads / a.kv_heads;
  const bool group_ok = group == 1 || group == 2 || group == 4 || (group == 8 && a.head_dim <= 128);
  return a.max_query_len == 1 && (a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256) && group_ok &&
         aligned(a.k_cache) && aligned(a.v_cache);
}

int attention_decode_partitions(const AttentionLaunch& a) {
  const int64_t blocks = int64_t{a.seqs} * a.kv_heads;
  if (a.partials == nullptr || blocks >= 2 * int64_t{a.sm_count} || a.max_context_len <= kMinKeys) return 1;
  const int64_t wanted = (2 * int64_t{a.sm_count} + blocks - 1) / blocks;
  const int64_t parts = std::min<int64_t>(wanted, (a.max_context_len + kMinKeys - 1) / kMinKeys);
  const int64_t floats = int64_t{a.tokens} * a.heads * parts * (a.head_dim + 2);
  return parts > 1 && floats <= a.partials_floats ? static_cast<int>(parts) : 1;
}

cudaError_t launch_attention_decode(const AttentionLaunch& a, int partitions, cudaStream_t stream) {
  float* partials = partitions > 1 ? a.partials : nullptr;
  switch (a.head_dim) {
    case 64: return launch_d<64>(a, partitions, partials, stream);
    case 128: return launch_d<128>(a, partitions, partials, stream);
    case 256: return launch_d<256>(a, partitions, partials, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace splitflow::cuda
