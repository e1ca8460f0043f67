// backend/cuda/norms.cu — see norms.h. One warp per row (a head of qkv, or a hidden row strided
// over the warp's lanes); statistics in fp32.
#include "backend/cuda/norms.h"

#include <cuda_bf16.h>

#include <algorithm>

namespace splitflow::cuda {
namespace {

__device__ __forceinline__ float load(const bf16_bits* p, int64_t i) {
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
}
__device__ __forceinline__ void store(bf16_bits* p, int64_t i, float v) {
  reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
}
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

constexpr int kWarpsPerBlock = 4;

// The (1 / rms, mean) of row[0, n) over the calling warp (every lane gets them).
__device__ void row_stats(const bf16_bits* row, int64_t n, bool layer_norm, float eps, float& inv, float& mean) {
  const int lane = threadIdx.x % 32;
  mean = 0.0f;
  if (layer_norm) {
    float sum = 0.0f;
    for (int64_t i = lane; i < n; i += 32) sum += load(row, i);
    mean = warp_sum(sum) / static_cast<float>(n);
  }
  float squares = 0.0f;
  for (int64_t i = lane; i < n; i += 32) {
    const float d = load(row, i) - mean;
    squares += d * d;
  }
  inv = rsqrtf(warp_sum(squares) / static_cast<float>(n) + eps);
}

__global__ void norm_add_kernel(const bf16_bits* x, const float* weight, bool layer_norm, float eps, float offset,
                                bf16_bits* residual, int64_t tokens, int64_t hidden) {
  const int64_t t = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  if (t >= tokens) return;
  const bf16_bits* row = x + t * hidden;
  float inv, mean;
  row_stats(row, hidden, layer_norm, eps, inv, mean);
  bf16_bits* r = residual + t * hidden;
  for (int64_t i = threadIdx.x % 32; i < hidden; i += 32)
    store(r, i, load(r, i) + round_bf16((load(row, i) - mean) * inv * (offset + weight[i])));
}

__global__ void qk_norm_kernel(bf16_bits* qkv, const float* q_weight, const float* k_weight, float eps, float offset,
                               int64_t tokens, int heads, int kv_heads, int head_dim) {
  const int64_t row = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;  // (token, head)
  const int normed = heads + kv_heads;
  if (row >= tokens * normed) return;
  const int64_t t = row / normed;
  const int h = static_cast<int>(row % normed);
  bf16_bits* head = qkv + t * int64_t{heads + 2 * kv_heads} * head_dim + int64_t{h} * head_dim;
  const float* w = h < heads ? q_weight : k_weight;
  float inv, mean;
  row_stats(head, head_dim, false, eps, inv, mean);
  __syncwarp();
  for (int i = threadIdx.x % 32; i < head_dim; i += 32) store(head, i, load(head, i) * inv * (offset + w[i]));
}

__global__ void softcap_kernel(float* x, int64_t count, float cap) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

unsigned warp_blocks(int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

}  // namespace

cudaError_t launch_norm_add(const bf16_bits* x, const float* weight, bool layer_norm, float eps, float weight_offset,
                            bf16_bits* residual, int64_t tokens, int64_t hidden, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  norm_add_kernel<<<warp_blocks(tokens), 32 * kWarpsPerBlock, 0, stream>>>(x, weight, layer_norm, eps, weight_offset,
                                                                          residual, tokens, hidden);
  return cudaGetLastError();
}

cudaError_t launch_qk_norm(bf16_bits* qkv, const float* q_weight, const float* k_weight, float eps,
                           float weight_offset, int64_t tokens, int heads, int kv_heads, int head_dim,
                           cudaStream_t stream) {
  const int64_t rows = tokens * (heads + kv_heads);
  if (rows == 0) return cudaSuccess;
  qk_norm_kernel<<<warp_blocks(rows), 32 * kWarpsPerBlock, 0, stream>>>(qkv, q_weight, k_weight, eps, weight_offset,
                                                                       tokens, heads, kv_heads, head_dim);
  return cudaGetLastError();
}

cudaError_t launch_softcap(float* x, int64_t count, float cap, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((count + 255) / 256, 4096);
  softcap_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(x, count, cap);
  return cudaGetLastError();
}

}  // namespace splitflow::cuda
