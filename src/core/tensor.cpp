#include "core/tensor.h"

#include "core/counter_hash.h"
#include "core/error.h"

#include <cstdlib>
#include <cstring>

namespace splitflow {

std::string shape_str(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return count;
}

size_t storage_bytes(DType dtype, const Shape& shape, const RowRuns& runs) {
  if (dtype == DType::Mixed) {
    SF_CHECK(runs && !runs->empty() && shape.size() == 2, "a mixed-dtype tensor {} needs row runs and two dimensions",
             shape_str(shape));
    size_t bytes = 0;
    int64_t rows = 0;
    for (const RowRun& run : *runs) {
      bytes += static_cast<size_t>(run.rows) * dtype_row_bytes(run.dtype, shape[1]);
      rows += run.rows;
    }
    SF_CHECK(rows == shape[0], "a mixed-dtype tensor {}: its row runs add up to {} rows", shape_str(shape), rows);
    return bytes;
  }
  if (!is_quantized(dtype)) return static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  SF_CHECK(!shape.empty(), "a {} tensor cannot be a scalar", dtype_name(dtype));
  const int64_t cols = shape.back();
  return static_cast<size_t>(shape_numel(shape) / (cols == 0 ? 1 : cols)) * dtype_row_bytes(dtype, cols);
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor tensor;
  tensor.dtype = dtype;
  tensor.shape = std::move(shape);
  const size_t bytes = (tensor.nbytes() + 63) / 64 * 64;
  void* memory = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
  SF_CHECK(memory != nullptr, "out of host memory allocating {} bytes for a {} tensor", bytes, shape_str(tensor.shape));
  std::memset(memory, 0, bytes == 0 ? 64 : bytes);
  tensor.storage = std::shared_ptr<void>(memory, std::free);
  tensor.data = memory;
  return tensor;
}

Tensor Tensor::view(DType dtype, Shape shape, const void* data, std::shared_ptr<const void> keepalive) {
  Tensor tensor;
  tensor.dtype = dtype;
  tensor.shape = std::move(shape);
  tensor.data = const_cast<void*>(data);
  tensor.storage = std::const_pointer_cast<void>(std::move(keepalive));
  return tensor;
}

Tensor Tensor::generated_normal(DType dtype, Shape shape, GeneratedNormal values) {
  SF_CHECK(dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16,
           "generated tensor {}: dtype {} is not f32, f16 or bf16", shape_str(shape), dtype_name(dtype));
  Tensor tensor;
  tensor.dtype = dtype;
  tensor.shape = std::move(shape);
  tensor.generated = values;
  return tensor;
}

namespace {

template <typename Store>
void fill_generated(const GeneratedNormal& values, int64_t count, Store store) {
#pragma omp parallel for schedule(static) if (count > (1 << 16))
  for (int64_t i = 0; i < count; ++i) store(i, generated_normal_value(values.key, values.stddev, i));
}

}  // namespace

Tensor materialize(const Tensor& tensor) {
  if (!tensor.generated) return tensor;
  const size_t bytes = (tensor.nbytes() + 63) / 64 * 64;
  void* memory = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);  // not zeroed: every element is written
  SF_CHECK(memory != nullptr, "out of host memory allocating {} bytes for a {} tensor", bytes, shape_str(tensor.shape));
  Tensor out = Tensor::view(tensor.dtype, tensor.shape, memory, std::shared_ptr<void>(memory, std::free));
  const int64_t count = tensor.numel();
  switch (tensor.dtype) {
    case DType::F32: {
      float* data = out.as<float>();
      fill_generated(*tensor.generated, count, [data](int64_t i, float value) { data[i] = value; });
      break;
    }
    case DType::BF16: {
      uint16_t* data = out.as<uint16_t>();
      fill_generated(*tensor.generated, count, [data](int64_t i, float value) { data[i] = f32_to_bf16(value); });
      break;
    }
    default: {
      uint16_t* data = out.as<uint16_t>();
      fill_generated(*tensor.generated, count, [data](int64_t i, float value) { data[i] = f32_to_f16(value); });
      break;
    }
  }
  return out;
}

Tensor to_dtype(const Tensor& src, DType dtype) {
  if (src.generated) return to_dtype(materialize(src), dtype);
  Tensor out = Tensor::zeros(dtype, src.shape);
  if (src.dtype == dtype) {
    std::memcpy(out.data, src.data, src.nbytes());
  } else if (dtype == DType::F32) {
    convert_to_f32(src.dtype, src.data, out.as<float>(), static_cast<size_t>(src.numel()));
  } else {
    Tensor f32 = to_dtype(src, DType::F32);
    convert_from_f32(f32.as<float>(), dtype, out.data, static_cast<size_t>(src.numel()));
  }
  return out;
}

}  // namespace splitflow
