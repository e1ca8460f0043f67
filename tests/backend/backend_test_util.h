// tests/backend/backend_test_util.h — moving host data through a Backend, random inputs, and
// matrices stored in F32/F16/BF16 together with the exact values the device reads.
#pragma once

#include "backend/backend.h"
#include "core/dtype.h"

#include <cstring>
#include <random>
#include <vector>

namespace splitflow::test {

template <typename T>
inline DType dtype_of();
template <>
inline DType dtype_of<float>() { return DType::F32; }
template <>
inline DType dtype_of<int32_t>() { return DType::I32; }

template <typename T>
DeviceBuffer to_device(Backend& backend, const std::vector<T>& values, Shape shape) {
  DeviceBuffer buffer = backend.allocate(dtype_of<T>(), std::move(shape));
  backend.copy_to_device(values.data(), buffer.view());
  return buffer;
}

inline std::vector<float> to_host(Backend& backend, const DeviceTensor& tensor) {
  std::vector<float> values(tensor.numel());
  backend.copy_to_host(tensor, values.data());
  return values;
}

inline std::vector<float> random_floats(std::mt19937_64& rng, size_t count, float low = -1.0f, float high = 1.0f) {
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

// A matrix stored in `dtype` plus the values it holds (after rounding), for references.
struct StoredMatrix {
  DeviceBuffer buffer;
  std::vector<double> values;
};

inline StoredMatrix store_matrix(Backend& backend, const std::vector<float>& values, Shape shape, DType dtype) {
  Tensor host = Tensor::zeros(dtype, shape);
  convert_from_f32(values.data(), dtype, host.data, values.size());
  std::vector<float> rounded(values.size());
  convert_to_f32(dtype, host.data, rounded.data(), values.size());
  StoredMatrix matrix{backend.allocate(dtype, std::move(shape)), std::vector<double>(rounded.begin(), rounded.end())};
  backend.copy_to_device(host.data, matrix.buffer.view());
  return matrix;
}

}  // namespace splitflow::test
