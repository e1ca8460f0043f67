// backend/matmul_offload.h — the GPU/CPU split's prefill offload (llama.cpp's op offload): a backend
// over the CPU stage's that runs each matrix product of at least min_rows rows on a helper backend
// (the GPU), copying the matrix over for that product. A prompt's products have enough rows that
// the copy over PCIe costs less than the CPU's arithmetic; decode's (a row per sequence) stay on
// the CPU, which holds the weights. Everything else stays the CPU's: attention, norms, the KV
// cache, the residual stream.
//
// A matrix streams from a copy in the helper's pinned host memory, made at its first product (as
// stored for packed types and floats in the helper's activation dtype, other floats converted to
// it): pageable memory crosses PCIe at a fraction of pinned memory's rate (6.3 against 53 GB/s on
// an H100 host), and the copy costs host memory once more for the CPU's layers. x crosses in the helper's activation dtype (bf16 on a GPU: an
// offloaded product rounds its input as the GPU stage's products do), y comes back in f32; the
// bias and `accumulate` are applied on the host. Rows cross in chunks of chunk_rows, so the
// helper's staging is bounded: the largest matrix offloaded, and a chunk of x and of y at the
// widest shapes (it grows to them during the first prompt).
// staging_bytes() is that, for the GPU's memory plan (parallel/gpu_layer_fit.h).
// Owns the helper and its staging; never decides the split or the threshold.
#pragma once

#include "backend/forwarding_backend.h"

#include <cstdint>
#include <memory>
#include <unordered_map>

namespace splitflow {

struct MatmulOffloadOptions {
  int64_t min_rows = 32;     // products with fewer rows run on the CPU
  int64_t chunk_rows = 512;  // rows per trip to the helper
};

class MatmulOffloadBackend final : public ForwardingBackend {
 public:
  MatmulOffloadBackend(std::unique_ptr<Backend> cpu, std::unique_ptr<Backend> helper, MatmulOffloadOptions options);

  std::string name() const override;
  DeviceBuffer allocate(DType dtype, Shape shape) override;
  DeviceBuffer upload(const Tensor& host) override;
  void matmul(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias, const DeviceTensor& y,
              bool accumulate) override;

  int64_t offloaded_products() const { return offloaded_products_; }
  int64_t offloaded_weight_bytes() const { return offloaded_weight_bytes_; }

  // The helper's device memory for matrices of at most `largest_matrix_bytes` as the helper stores
  // them (twice: a packed one is also uploaded once, briefly, to size the helper's scratch), inputs of at most `widest` columns in `helper_dtype` (its activation dtype) and outputs of
  // at most `widest` in f32, at chunk_rows rows per trip; plus kHelperReserveBytes for what the
  // helper backend allocates for itself (GEMM workspace, dequantization scratch: an estimate).
  static constexpr int64_t kHelperReserveBytes = int64_t{512} << 20;
  static int64_t staging_bytes(int64_t largest_matrix_bytes, int64_t widest, DType helper_dtype,
                               const MatmulOffloadOptions& options);

 private:
  // A matrix the CPU holds, as the helper will read it from `host`.
  struct Source {
    const void* host = nullptr;
    DType dtype = DType::F32;
    Shape shape;
    RowRuns row_runs;
    std::shared_ptr<void> pinned;  // the helper's pinned host copy `host` points to
    size_t bytes() const { return storage_bytes(dtype, shape, row_runs); }
  };
  // The Source of an uploaded matrix, made at its first offloaded product (so tables that are
  // never multiplied, the embeddings, cost nothing).
  const Source& source_of(const DeviceTensor& w);
  // Grows the helper's staging to hold `source` and chunks of `widest` columns.
  void ensure_staging(const Source& source, int64_t widest);
  void offload(const Source& source, const DeviceTensor& x, const DeviceTensor& bias, const DeviceTensor& y,
               bool accumulate);

  std::unique_ptr<Backend> helper_;
  MatmulOffloadOptions options_;
  DType helper_dtype_;
  std::unordered_map<const void*, DeviceTensor> uploaded_;  // matrices the CPU holds, by address
  std::unordered_map<const void*, Source> sources_;         // the ones offloaded so far
  // The helper's staging, grown to the largest matrix and the widest rows offloaded so far.
  DeviceBuffer w_stage_, x_stage_, y_stage_;
  std::shared_ptr<void> x_host_, y_host_;  // pinned chunks: x in the helper's dtype, y in f32
  size_t w_stage_bytes_ = 0, largest_packed_bytes_ = 0;
  int64_t staged_width_ = 0;
  int64_t offloaded_products_ = 0;
  int64_t offloaded_weight_bytes_ = 0;
};

}  // namespace splitflow
