// backend/cuda/quantize_matrix.cu — the kernels of --quantization in device memory: a float matrix
// chunk widened to f32, then quantized by quant/block_quantizers.h (the host reference's own code),
// one thread per block. Compiled with -fmad=false (cmake/Cuda.cmake): the quantizers' a * b + c
// must round twice, as on the host, for the bytes to be identical.
#include "backend/cuda/quantize_matrix.h"
#include "core/counter_hash.h"
#include "quant/block_quantizers.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

namespace splitflow::cuda {
namespace {

namespace blocks = quant::blocks;

constexpr int kThreads = 128;

__global__ void matrix_to_f32_kernel(const void* src, DType dtype, uint64_t key, float stddev, int64_t first,
                                     float* out, int64_t count) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride) {
    float value;
    if (src == nullptr) {
      value = generated_normal_value(key, stddev, first + i);
      if (dtype == DType::BF16) value = __bfloat162float(__float2bfloat16_rn(value));
      if (dtype == DType::F16) value = __half2float(__float2half_rn(value));
    } else if (dtype == DType::F32) {
      value = static_cast<const float*>(src)[i];
    } else if (dtype == DType::F16) {
      value = __half2float(static_cast<const __half*>(src)[i]);
    } else {  // BF16
      value = __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(src)[i]) << 16);
    }
    out[i] = value;
  }
}

constexpr bool is_fp8(DType t) { return t == DType::F8_CHANNEL || t == DType::F8_G128; }
constexpr bool is_int8_group(DType t) { return t == DType::I8_G32 || t == DType::I8_G64 || t == DType::I8_G128; }
constexpr bool is_inferflow(DType t) {
  return static_cast<int>(t) >= static_cast<int>(DType::Q2_B32) && static_cast<int>(t) <= static_cast<int>(DType::Q3H_B64);
}

// Thread u quantizes unit u % units_per_row of row u / units_per_row: a block (unit_bytes each,
// back to back) or a scale group (scale at 4 j, codes at scale_bytes + j unit_elems).
template <DType kType>
__global__ void quantize_rows_kernel(const float* x, int64_t cols, int64_t units, int64_t units_per_row,
                                     int64_t unit_elems, int64_t unit_bytes, int64_t row_bytes, int64_t scale_bytes,
                                     uint8_t* out, unsigned long long* bad_block) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t u = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; u < units; u += stride) {
    const int64_t row = u / units_per_row, j = u % units_per_row;
    const float* in = x + row * cols + j * unit_elems;
    uint8_t* row_out = out + row * row_bytes;
    if constexpr (is_fp8(kType)) {
      blocks::quantize_fp8_group(in, unit_elems, row_out + 4 * j, row_out + scale_bytes + j * unit_elems);
    } else if constexpr (is_int8_group(kType)) {
      blocks::quantize_int8_group(in, unit_elems, row_out + 4 * j, row_out + scale_bytes + j * unit_elems);
    } else if constexpr (is_inferflow(kType)) {
      if (!blocks::quantize_inferflow_block(blocks::inferflow_geometry(kType), in, row_out + j * unit_bytes))
        atomicMin(bad_block, static_cast<unsigned long long>(u));
    } else {
      blocks::quantize_gguf_block(kType, in, row_out + j * unit_bytes);
    }
  }
}

template <DType kType>
cudaError_t launch_quantize(const float* x, int64_t rows, int64_t cols, uint8_t* out, unsigned long long* bad_block,
                            cudaStream_t stream) {
  const int64_t row_bytes = static_cast<int64_t>(dtype_row_bytes(kType, cols));
  int64_t unit_elems, unit_bytes = 0, scale_bytes = 0;
  if constexpr (is_fp8(kType) || is_int8_group(kType)) {
    unit_elems = kType == DType::F8_CHANNEL ? cols : dtype_block_elems(kType);
    scale_bytes = blocks::group_scale_bytes(cols / unit_elems);
  } else {
    unit_elems = dtype_block_elems(kType);
    unit_bytes = static_cast<int64_t>(dtype_row_bytes(kType, unit_elems));
  }
  const int64_t units_per_row = cols / unit_elems, units = rows * units_per_row;
  if (units == 0) return cudaSuccess;
  const int64_t grid = std::min<int64_t>((units + kThreads - 1) / kThreads, int64_t{1} << 20);
  quantize_rows_kernel<kType><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
      x, cols, units, units_per_row, unit_elems, unit_bytes, row_bytes, scale_bytes, out, bad_block);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_matrix_to_f32(const void* src, DType dtype, uint64_t key, float stddev, int64_t first, float* out,
                                 int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int64_t grid = std::min<int64_t>((count + 255) / 256, 65536);
  matrix_to_f32_kernel<<<static_cast<unsigned>(grid), 256, 0, stream>>>(src, dtype, key, stddev, first, out, count);
  return cudaGetLastError();
}

cudaError_t launch_quantize_rows(DType type, const float* x, int64_t rows, int64_t cols, uint8_t* out,
                                 unsigned long long* bad_block, cudaStream_t stream) {
  switch (type) {
#define SF_QUANTIZE_CASE(T) \
  case DType::T: return launch_quantize<DType::T>(x, rows, cols, out, bad_block, stream);
    SF_QUANTIZE_CASE(Q4_0) SF_QUANTIZE_CASE(Q4_1) SF_QUANTIZE_CASE(Q5_0) SF_QUANTIZE_CASE(Q5_1)
    SF_QUANTIZE_CASE(Q8_0) SF_QUANTIZE_CASE(Q2_K) SF_QUANTIZE_CASE(Q3_K) SF_QUANTIZE_CASE(Q4_K)
    SF_QUANTIZE_CASE(Q5_K) SF_QUANTIZE_CASE(Q6_K)
    SF_QUANTIZE_CASE(Q2_B32) SF_QUANTIZE_CASE(Q3_B32) SF_QUANTIZE_CASE(Q4_B32) SF_QUANTIZE_CASE(Q5_B32)
    SF_QUANTIZE_CASE(Q6_B32) SF_QUANTIZE_CASE(Q8_B32) SF_QUANTIZE_CASE(Q2_B64) SF_QUANTIZE_CASE(Q3_B64)
    SF_QUANTIZE_CASE(Q4_B64) SF_QUANTIZE_CASE(Q5_B64) SF_QUANTIZE_CASE(Q6_B64) SF_QUANTIZE_CASE(Q8_B64)
    SF_QUANTIZE_CASE(Q3H_B64)
    SF_QUANTIZE_CASE(F8_CHANNEL) SF_QUANTIZE_CASE(F8_G128)
    SF_QUANTIZE_CASE(I8_G32) SF_QUANTIZE_CASE(I8_G64) SF_QUANTIZE_CASE(I8_G128)
#undef SF_QUANTIZE_CASE
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace splitflow::cuda
