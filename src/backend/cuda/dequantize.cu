// backend/cuda/dequantize.cu — quantized rows into bf16 (quant_kernels.h): one thread per 32-element
// unit, decoded in registers (quant_decode.cuh), scaled, written as four 16-byte words. The prefill
// GEMM dequantizes its weight into a scratch this way (chunks of rows) and runs cuBLASLt on it;
// embed() gathers token rows of a quantized table through the same kernel.
#include "backend/cuda/quant_decode.cuh"
#include "backend/cuda/quant_q8x.cuh"
#include "backend/cuda/quant_kernels.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <vector>

namespace splitflow::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

template <typename Dec>
__global__ void __launch_bounds__(kThreads)
    dequantize_rows_kernel(QuantRun run, int64_t k, const int32_t* __restrict__ rows, int64_t first_row, int64_t count,
                           float multiplier, const bf16_bits* __restrict__ pos_table,
                           const int32_t* __restrict__ positions, bf16_bits* __restrict__ out) {
  const int64_t units = k / 32;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (index >= count * units) return;
  const int64_t i = index / units, u = index % units;
  const int64_t row = rows != nullptr ? rows[i] : first_row + i;
  float w[32];
  quant_decode::decode_unit<Dec>(run.data + (row - run.first_row) * run.row_bytes, k, u, w);
  const uint4* pos = pos_table != nullptr
                         ? reinterpret_cast<const uint4*>(pos_table + static_cast<int64_t>(positions[i]) * k + 32 * u)
                         : nullptr;
  uint4* dst = reinterpret_cast<uint4*>(out + i * k + 32 * u);
#pragma unroll
  for (int word = 0; word < 4; ++word) {
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = w[8 * word + e] * multiplier;
    if (pos != nullptr) {
      const uint4 p = pos[word];
      const uint32_t pw[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pw[e]));
        v[2 * e] += f.x;
        v[2 * e + 1] += f.y;
      }
    }
    dst[word] = make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]),
                           pack_bf16x2(v[6], v[7]));
  }
}

}  // namespace

bool quant_supported(DType dtype) {
  return quant_decode::with_decoder(dtype, [](auto) {});
}

bool quant_mma_enabled() {
  // Read at every launch (a getenv) so a test can switch paths; off by default (quant_kernels.h).
  const char* value = std::getenv("SPLITFLOW_QUANT_MMA");
  return value != nullptr && std::string_view(value) == "1";
}

namespace quant_gemv_detail {

int resident_blocks(const void* kernel, int threads, int64_t shared_bytes) {
  struct Entry {
    const void* kernel;
    int threads, device;
    int64_t shared_bytes;
    int blocks;
  };
  static std::mutex mutex;
  static std::vector<Entry> cache;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  const std::lock_guard<std::mutex> lock(mutex);
  for (const Entry& e : cache)
    if (e.kernel == kernel && e.threads == threads && e.device == device && e.shared_bytes == shared_bytes)
      return e.blocks;
  int per_sm = 0, sms = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, static_cast<size_t>(shared_bytes)) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 0;
  cache.push_back({kernel, threads, device, shared_bytes, per_sm * sms});
  return per_sm * sms;
}

}  // namespace quant_gemv_detail

bool quant_q8_activations_enabled() {
  const char* value = std::getenv("SPLITFLOW_CUDA_Q8_ACTIVATIONS");
  return value == nullptr || std::string_view(value) != "0";
}

bool quant_f16_activations_enabled() {
  const char* value = std::getenv("SPLITFLOW_CUDA_F16_ACTIVATIONS");
  return value == nullptr || std::string_view(value) != "0";
}

bool quant_f16_activations(DType dtype) { return dtype == DType::F8_CHANNEL || dtype == DType::F8_G128; }

bool quant_q8_activations(DType dtype) {
  return quant_q8x::with_q8_decoder(dtype, [](auto) {});
}

int quant_alignment(DType dtype) {
  switch (dtype) {
    case DType::Q4_K: case DType::Q5_K: case DType::F8_CHANNEL: case DType::F8_G128: return 16;
    case DType::I8_G32: case DType::I8_G64: case DType::I8_G128: return 16;
    case DType::Q2_K: case DType::Q2_B32: case DType::Q3_B32: case DType::Q4_B32: case DType::Q5_B32:
    case DType::Q6_B32: case DType::Q8_B32: case DType::Q2_B64: case DType::Q3_B64: case DType::Q4_B64:
    case DType::Q5_B64: case DType::Q6_B64: case DType::Q8_B64: case DType::Q3H_B64: return 4;
    default: return 2;
  }
}

cudaError_t launch_dequantize_rows(const QuantRun& run, int64_t k, const int32_t* rows, int64_t first_row,
                                   int64_t count, float multiplier, const bf16_bits* pos_table,
                                   const int32_t* positions, bf16_bits* out, cudaStream_t stream) {
  if (count == 0 || k == 0) return cudaSuccess;
  if (k % 32 != 0) return cudaErrorInvalidValue;
  const int64_t threads = count * (k / 32);
  const auto blocks = static_cast<unsigned>((threads + kThreads - 1) / kThreads);
  cudaError_t err = cudaErrorInvalidValue;
  quant_decode::with_decoder(run.dtype, [&](auto dec) {
    dequantize_rows_kernel<decltype(dec)><<<blocks, kThreads, 0, stream>>>(run, k, rows, first_row, count, multiplier,
                                                                            pos_table, positions, out);
    err = cudaGetLastError();
  });
  return err;
}

}  // namespace splitflow::cuda
