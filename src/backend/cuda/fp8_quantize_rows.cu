// backend/cuda/fp8_quantize_rows.cu — x rows to e4m3 codes with one scale a row (W8A8, fp8_gemm.h): one
// block a row, two passes over it (the row is in L2 for the second), 8 elements a thread step.
#include "backend/cuda/quant_kernels.h"
#include "backend/cuda/quant_staging.cuh"

#include <cuda_fp8.h>

namespace splitflow::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kE4m3Max = 448.0f;

__global__ void quantize_rows_e4m3_kernel(const bf16_bits* x, int64_t k, uint8_t* codes, float* scales) {
  using quant_gemv_detail::unpack8;
  const bf16_bits* row = x + blockIdx.x * k;
  uint8_t* out = codes + blockIdx.x * k;
  float amax = 0.0f;
  for (int64_t i = 8 * threadIdx.x; i < k; i += 8 * kThreads) {
    float v[8];
    unpack8(*reinterpret_cast<const uint4*>(row + i), v);
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[e]));
  }
  // max over the block: warps, then the first warp over their maxima
  for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  __shared__ float warp_max[kThreads / 32];
  __shared__ float row_scale;
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x < 32) {
    float m = threadIdx.x < kThreads / 32 ? warp_max[threadIdx.x] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    if (threadIdx.x == 0) {
      row_scale = m > 0.0f ? m / kE4m3Max : 1.0f;
      scales[blockIdx.x] = row_scale;
    }
  }
  __syncthreads();
  const float inverse = 1.0f / row_scale;
  for (int64_t i = 8 * threadIdx.x; i < k; i += 8 * kThreads) {
    float v[8];
    unpack8(*reinterpret_cast<const uint4*>(row + i), v);
    uint16_t pairs[4];
#pragma unroll
    for (int p = 0; p < 4; ++p)
      pairs[p] = __nv_cvt_float2_to_fp8x2(make_float2(v[2 * p] * inverse, v[2 * p + 1] * inverse), __NV_SATFINITE,
                                          __NV_E4M3);
    uint2 packed;
    packed.x = static_cast<uint32_t>(pairs[0]) | (static_cast<uint32_t>(pairs[1]) << 16);
    packed.y = static_cast<uint32_t>(pairs[2]) | (static_cast<uint32_t>(pairs[3]) << 16);
    *reinterpret_cast<uint2*>(out + i) = packed;
  }
}

}  // namespace

cudaError_t launch_quantize_rows_e4m3(const bf16_bits* x, int64_t m, int64_t k, uint8_t* codes, float* scales,
                                      cudaStream_t stream) {
  if (m == 0) return cudaSuccess;
  if (k % 8 != 0 || m > 0x7fffffff) return cudaErrorInvalidValue;
  quantize_rows_e4m3_kernel<<<static_cast<unsigned>(m), kThreads, 0, stream>>>(x, k, codes, scales);
  return cudaGetLastError();
}

}  // namespace splitflow::cuda
