#include "core/tensor.h"

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

Tensor to_dtype(const Tensor& src, DType dtype) {
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
