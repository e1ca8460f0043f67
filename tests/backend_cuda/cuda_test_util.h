// tests/backend_cuda/cuda_test_util.h — a CUDA backend for tests (skipping without a GPU), bf16
// and fp8 e4m3 buffers with the exact values the device holds, and the relative error
// ‖out − ref‖ / ‖ref‖.
//
// Tolerances (METHOD.md): a kernel that rounds its fp32 result to bf16 once is within 2^-9
// relative per element, so ‖err‖/‖ref‖ stays under kOneRounding; GEMMs and attention over
// bf16 operands (fp32 accumulation, bf16 output) under kBf16Compute.
#pragma once

#include "backend/backend.h"
#include "core/dtype.h"

#ifdef SPLITFLOW_HAS_CUDA
#include "backend/cuda/device_info.h"
#endif

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace splitflow::test {

constexpr double kOneRounding = 4e-3;
constexpr double kBf16Compute = 1e-2;

inline bool have_gpu() {
#ifdef SPLITFLOW_HAS_CUDA
  return !cuda::list_devices().empty();
#else
  return false;
#endif
}

inline std::unique_ptr<Backend> make_test_cuda_backend() {
#ifdef SPLITFLOW_HAS_CUDA
  return make_cuda_backend(0);
#else
  return nullptr;
#endif
}

// Skips the test (from SetUp or the test body) when no GPU can run it.
#define SF_REQUIRE_GPU()                                                                   \
  do {                                                                                     \
    if (!::splitflow::test::have_gpu()) GTEST_SKIP() << "no CUDA GPU (or built without CUDA)"; \
  } while (0)

inline float bf16_round(float v) { return bf16_to_f32(f32_to_bf16(v)); }

inline std::vector<float> random_values(std::mt19937_64& rng, size_t count, float low = -1.0f, float high = 1.0f) {
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

// Rounds `values` to bf16 in place (they become exactly what the device holds) and uploads them.
inline DeviceBuffer to_device_bf16(Backend& backend, std::vector<float>& values, Shape shape) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    bits[i] = f32_to_bf16(values[i]);
    values[i] = bf16_to_f32(bits[i]);
  }
  DeviceBuffer buffer = backend.allocate(DType::BF16, std::move(shape));
  backend.copy_to_device(bits.data(), buffer.view());
  return buffer;
}

// A KV cache of `dtype` (BF16 or F8E4M3) holding `values`, rounded in place to what it holds
// (e4m3 through the host encoder, core/dtype.h).
inline DeviceBuffer cache_to_device(Backend& backend, std::vector<float>& values, Shape shape, DType dtype) {
  if (dtype == DType::BF16) return to_device_bf16(backend, values, std::move(shape));
  std::vector<uint8_t> bytes(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    bytes[i] = f32_to_e4m3(values[i]);
    values[i] = e4m3_to_f32(bytes[i]);
  }
  DeviceBuffer buffer = backend.allocate(DType::F8E4M3, std::move(shape));
  backend.copy_to_device(bytes.data(), buffer.view());
  return buffer;
}

inline std::vector<uint8_t> bytes_to_host(Backend& backend, const DeviceTensor& tensor) {
  std::vector<uint8_t> bytes(tensor.nbytes());
  backend.copy_to_host(tensor, bytes.data());
  return bytes;
}

inline DeviceBuffer to_device_f32(Backend& backend, const std::vector<float>& values, Shape shape) {
  DeviceBuffer buffer = backend.allocate(DType::F32, std::move(shape));
  backend.copy_to_device(values.data(), buffer.view());
  return buffer;
}

inline DeviceBuffer to_device_i32(Backend& backend, const std::vector<int32_t>& values, Shape shape) {
  DeviceBuffer buffer = backend.allocate(DType::I32, std::move(shape));
  backend.copy_to_device(values.data(), buffer.view());
  return buffer;
}

// The tensor's values as floats (bf16 or f32 on the device).
inline std::vector<float> to_host(Backend& backend, const DeviceTensor& tensor) {
  std::vector<float> values(tensor.numel());
  if (tensor.dtype == DType::F32) {
    backend.copy_to_host(tensor, values.data());
  } else {
    std::vector<uint16_t> bits(values.size());
    backend.copy_to_host(tensor, bits.data());
    for (size_t i = 0; i < bits.size(); ++i) values[i] = bf16_to_f32(bits[i]);
  }
  return values;
}

// Fills a bf16 buffer with NaN so an element the kernel leaves unwritten fails the comparison.
inline void poison_bf16(Backend& backend, const DeviceTensor& tensor) {
  std::vector<uint16_t> nan(tensor.numel(), 0x7fc0);
  backend.copy_to_device(nan.data(), tensor);
}

// ‖out − ref‖ / ‖ref‖; infinity when sizes differ or out holds NaN/inf.
// ||actual - expected|| / ||expected|| over `count` values (a row, or states).
inline double relative_l2(const float* actual, const float* expected, int64_t count) {
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < count; ++i) {
    diff += (static_cast<double>(actual[i]) - expected[i]) * (static_cast<double>(actual[i]) - expected[i]);
    ref += static_cast<double>(expected[i]) * expected[i];
  }
  return std::sqrt(diff / ref);
}

inline double relative_error(const std::vector<float>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    diff += (out[i] - ref[i]) * (out[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

// A fused QKV projection's output and the K/V it wrote, against fp64 references: qkv [m, width]
// (q, then kv_dim k, then kv_dim v columns) within `tolerance`; a bf16 cache within `tolerance` of
// k_ref / v_ref; an fp8 cache byte-exact against the e4m3 of the k / v the kernel itself produced
// (rows whose slot is -1 write nothing).
inline void expect_qkv_and_cache(Backend& backend, const DeviceTensor& qkv, const std::vector<double>& ref,
                                 const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                                 const std::vector<double>& k_ref, const std::vector<double>& v_ref,
                                 const std::vector<int32_t>& slots, int64_t q_dim, int64_t kv_dim, double tolerance,
                                 const std::string& label) {
  const std::vector<float> got = to_host(backend, qkv);
  EXPECT_LE(relative_error(got, ref), tolerance) << label;
  if (k_cache.dtype == DType::BF16) {
    EXPECT_LE(relative_error(to_host(backend, k_cache), k_ref), tolerance) << label << " k_cache";
    EXPECT_LE(relative_error(to_host(backend, v_cache), v_ref), tolerance) << label << " v_cache";
    return;
  }
  const int64_t width = qkv.dim(1);
  std::vector<uint8_t> k_bytes(k_ref.size(), 0), v_bytes(k_bytes.size(), 0);
  for (size_t r = 0; r < slots.size(); ++r)
    if (slots[r] >= 0)
      for (int64_t j = 0; j < kv_dim; ++j) {
        k_bytes[slots[r] * kv_dim + j] = f32_to_e4m3(got[r * width + q_dim + j]);
        v_bytes[slots[r] * kv_dim + j] = f32_to_e4m3(got[r * width + q_dim + kv_dim + j]);
      }
  EXPECT_EQ(bytes_to_host(backend, k_cache), k_bytes) << label << " k_cache";
  EXPECT_EQ(bytes_to_host(backend, v_cache), v_bytes) << label << " v_cache";
}

}  // namespace splitflow::test
