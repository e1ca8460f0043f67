// tests/comm_cuda/comm_test_util.h — host-side helpers for the multi-GPU comm tests: deterministic
// per-rank inputs (every rank can regenerate every other rank's), encoding to f32/f16/bf16 bytes,
// the fp64 ground truth, per-element error bounds, and device buffer helpers.
//
// Error bounds (|out - ref|, ref the fp64 sum of the values the device holds):
//  - fp32 accumulation then one rounding to T (the custom kernels):
//      0.5 ulp_T(|ref| + acc) + acc,  acc = N * 2^-24 * sum |x_i|
//  - NCCL, which may accumulate in T: (N - 1) ulp_T(sum |x_i|) + acc.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace splitflow::test {

inline int visible_gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

#define SF_COMM_CUDA_OK(call)                                                          \
  do {                                                                                 \
    const cudaError_t sf_status = (call);                                              \
    ASSERT_EQ(sf_status, cudaSuccess) << #call << ": " << cudaGetErrorString(sf_status); \
  } while (0)

// Uniform in [-2, 2) from (seed, rank, index): the same on every rank.
inline float input_value(uint64_t seed, int rank, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank + 1) * 0xBF58476D1CE4E5B9ull + index;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-53 * 4.0 - 2.0);
}

// `values` rounded to `dtype`, as bytes; `values` is replaced by what the bytes hold.
inline std::vector<uint8_t> encode(std::vector<double>& values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const float v = static_cast<float>(values[i]);
    if (dtype == DType::F32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
      values[i] = v;
    } else {
      const uint16_t bits = dtype == DType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
      values[i] = dtype == DType::F16 ? f16_to_f32(bits) : bf16_to_f32(bits);
    }
  }
  return bytes;
}

inline std::vector<double> decode(const std::vector<uint8_t>& bytes, DType dtype) {
  const size_t count = bytes.size() / dtype_size(dtype);
  std::vector<double> values(count);
  for (size_t i = 0; i < count; ++i) {
    if (dtype == DType::F32) {
      float v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      values[i] = v;
    } else {
      uint16_t bits;
      std::memcpy(&bits, bytes.data() + 2 * i, 2);
      values[i] = dtype == DType::F16 ? f16_to_f32(bits) : bf16_to_f32(bits);
    }
  }
  return values;
}

// Rank `rank`'s input of `count` elements, as the device holds it.
inline std::vector<double> rank_input(uint64_t seed, int rank, size_t count, DType dtype, std::vector<uint8_t>* bytes) {
  std::vector<double> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = input_value(seed, rank, i);
  std::vector<uint8_t> encoded = encode(values, dtype);
  if (bytes) *bytes = std::move(encoded);
  return values;
}

inline int mantissa_bits(DType dtype) { return dtype == DType::F32 ? 23 : dtype == DType::F16 ? 10 : 7; }
inline int min_exponent(DType dtype) { return dtype == DType::F16 ? -14 : -126; }

// Spacing of `dtype` values at magnitude |x|.
inline double ulp(double x, DType dtype) {
  int exponent = 0;
  std::frexp(std::abs(x), &exponent);  // |x| = m * 2^exponent, m in [0.5, 1)
  const int e = std::max(exponent - 1, min_exponent(dtype));
  return std::ldexp(1.0, e - mantissa_bits(dtype));
}

inline double custom_bound(double ref, double abs_sum, int world_size, DType dtype) {
  const double acc = world_size * 0x1.0p-24 * abs_sum;
  return 0.5 * ulp(std::abs(ref) + acc, dtype) + acc;
}

inline double nccl_bound(double abs_sum, int world_size, DType dtype) {
  return (world_size - 1) * ulp(abs_sum, dtype) + world_size * 0x1.0p-24 * abs_sum;
}

// Host -> device copy that has landed when it returns: a cudaMemcpy from pageable memory may
// still be in flight, and the tests' non-blocking streams do not wait for it.
inline cudaError_t upload(void* device, const void* host, size_t bytes) {
  const cudaError_t status = cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice);
  return status != cudaSuccess ? status : cudaDeviceSynchronize();
}

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  char* bytes() const { return static_cast<char*>(ptr); }
};

}  // namespace splitflow::test
