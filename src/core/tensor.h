// core/tensor.h — a host tensor: dtype, shape (outermost first, row-major, as torch) and bytes,
// either owned or a view that keeps its backing storage (e.g. a MappedFile) alive.
#pragma once

#include "core/dtype.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace splitflow {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);  // "[4096, 128]"
int64_t shape_numel(const Shape& shape);

// The runs of rows of a DType::Mixed matrix [rows, cols]: run i is `rows` consecutive rows stored
// in `dtype` (each row dtype_row_bytes(dtype, cols)), the runs back to back in memory.
struct RowRun {
  DType dtype = DType::F32;
  int64_t rows = 0;
  bool operator==(const RowRun&) const = default;
};
using RowRuns = std::shared_ptr<const std::vector<RowRun>>;

// Bytes a tensor of this dtype and shape occupies: numel x dtype_size for plain types, rows x
// dtype_row_bytes(innermost dim) for quantized ones, the sum of the runs for Mixed (runs must be
// set and add up to shape[0]). Throws, naming the problem, when the shape does not fit the type.
size_t storage_bytes(DType dtype, const Shape& shape, const RowRuns& runs = {});

// Elements not stored yet but generated where the tensor is placed: element i is
// generated_normal_value(key, stddev, i) (core/counter_hash.h) rounded to the dtype. The seeded
// dummy weights use it so a backend's upload() can fill device memory directly: an 8B-parameter
// model never exists on the host.
struct GeneratedNormal {
  uint64_t key = 0;
  float stddev = 0.0f;
};

struct Tensor {
  DType dtype = DType::F32;
  Shape shape;
  void* data = nullptr;            // null for an empty tensor (a missing optional weight)
  std::shared_ptr<void> storage;   // keeps `data` alive
  std::optional<GeneratedNormal> generated;  // set (with data null) until materialize()d
  RowRuns row_runs;                          // DType::Mixed only

  // Zero-initialised owned tensor, 64-byte aligned.
  static Tensor zeros(DType dtype, Shape shape);
  // Non-owning view; `keepalive` (may be null) is held for as long as the tensor lives.
  static Tensor view(DType dtype, Shape shape, const void* data, std::shared_ptr<const void> keepalive);
  // A tensor whose elements are generated when placed (F32, F16 or BF16).
  static Tensor generated_normal(DType dtype, Shape shape, GeneratedNormal values);

  bool empty() const { return data == nullptr && !generated; }
  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return storage_bytes(dtype, shape, row_runs); }
  int64_t dim(int axis) const { return shape.at(axis < 0 ? shape.size() + axis : axis); }

  template <typename T>
  T* as() { return static_cast<T*>(data); }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data); }
};

// A generated tensor's elements in host memory (owned); any other tensor is returned as is.
Tensor materialize(const Tensor& tensor);

// Returns an owned copy converted to `dtype` (a float type); same dtype copies.
Tensor to_dtype(const Tensor& src, DType dtype);

}  // namespace splitflow
