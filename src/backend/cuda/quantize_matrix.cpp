// backend/cuda/quantize_matrix.cpp — quantize_matrix_on_cuda (backend/backend.h): --quantization
// in device memory. The matrix goes to the GPU in chunks of rows (stored bytes copied, or generated
// there), is widened to f32 and quantized by quant/block_quantizers.h's code, one thread per block
// (backend/cuda/quantize_matrix.cu), and the packed rows come back: the bytes quant::quantize
// writes, in a fraction of its time (llama.cpp's K-quant searches cost the host seconds per
// billion weights). What the device path does not take (f64 or fp8 sources, Mixed, a bad shape)
// goes to quant::quantize, which converts it or throws naming the problem.
#include "backend/backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/quantize_matrix.h"
#include "core/error.h"
#include "quant/quant.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <mutex>

namespace splitflow {
namespace {

// By default a chunk holds at most this many elements (256 MiB of f32, plus its stored bytes and
// packed rows).
constexpr int64_t kChunkElems = int64_t{64} << 20;

// A device buffer grown to the largest request (its old contents dropped).
class GrowingBuffer {
 public:
  ~GrowingBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  void* at_least(size_t bytes, const char* what) {
    if (bytes <= bytes_ && data_ != nullptr) return data_;
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    bytes_ = 0;
    SF_CUDA_CALL(cudaMalloc(&data_, std::max<size_t>(bytes, 1)), what);
    bytes_ = bytes;
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

struct CudaMatrixQuantizer::Buffers {
  std::mutex in_use;  // copies share the buffers: one matrix at a time
  GrowingBuffer stored, values, packed, bad;
};

CudaMatrixQuantizer::CudaMatrixQuantizer(int64_t chunk_elems)
    : chunk_elems_(chunk_elems), buffers_(std::make_shared<Buffers>()) {}

Tensor quantize_matrix_on_cuda(const Tensor& matrix, DType type, int64_t chunk_elems) {
  return CudaMatrixQuantizer(chunk_elems)(matrix, type);
}

Tensor CudaMatrixQuantizer::operator()(const Tensor& matrix, DType type) const {
  const bool float_source = matrix.dtype == DType::F32 || matrix.dtype == DType::F16 || matrix.dtype == DType::BF16;
  if (!is_quantized(type) || !float_source || matrix.shape.empty() || (matrix.data == nullptr && !matrix.generated))
    return quant::quantize(matrix, type);
  const int64_t cols = matrix.shape.back();
  if (cols == 0 || cols % dtype_block_elems(type) != 0) return quant::quantize(matrix, type);
  const int64_t rows = matrix.numel() / cols;
  Tensor out = Tensor::zeros(type, matrix.shape);
  if (rows == 0) return out;

  const size_t row_bytes = dtype_row_bytes(type, cols), source_elem = dtype_size(matrix.dtype);
  const int64_t chunk_elems = chunk_elems_;
  const std::lock_guard lock(buffers_->in_use);
  const int64_t chunk_rows = std::clamp<int64_t>((chunk_elems > 0 ? chunk_elems : kChunkElems) / cols, 1, rows);
  const size_t chunk_size = static_cast<size_t>(chunk_rows * cols);
  void* stored = matrix.generated ? nullptr
                                  : buffers_->stored.at_least(chunk_size * source_elem,
                                                              "quantize on the GPU: allocate the source chunk");
  void* values = buffers_->values.at_least(chunk_size * sizeof(float), "quantize on the GPU: allocate the f32 chunk");
  void* packed = buffers_->packed.at_least(static_cast<size_t>(chunk_rows) * row_bytes,
                                           "quantize on the GPU: allocate the packed chunk");
  void* bad = buffers_->bad.at_least(sizeof(unsigned long long), "quantize on the GPU: allocate the error flag");
  SF_CUDA_CALL(cudaMemset(bad, 0xff, sizeof(unsigned long long)), "quantize on the GPU: clear the error flag");
  const uint64_t key = matrix.generated ? matrix.generated->key : 0;
  const float stddev = matrix.generated ? matrix.generated->stddev : 0.0f;

  for (int64_t first = 0; first < rows; first += chunk_rows) {
    const int64_t count = std::min(chunk_rows, rows - first);
    const size_t elems = static_cast<size_t>(count * cols);
    if (stored)
      SF_CUDA_CALL(cudaMemcpy(stored, static_cast<const uint8_t*>(matrix.data) + first * cols * source_elem,
                              elems * source_elem, cudaMemcpyHostToDevice),
                   "quantize on the GPU: copy the matrix");
    SF_CUDA_CALL(cuda::launch_matrix_to_f32(stored, matrix.dtype, key, stddev, first * cols,
                                            static_cast<float*>(values), static_cast<int64_t>(elems), nullptr),
                 "quantize on the GPU: widen to f32");
    SF_CUDA_CALL(cudaMemset(packed, 0, static_cast<size_t>(count) * row_bytes),
                 "quantize on the GPU: clear the packed rows");
    SF_CUDA_CALL(cuda::launch_quantize_rows(type, static_cast<const float*>(values), count, cols,
                                            static_cast<uint8_t*>(packed),
                                            static_cast<unsigned long long*>(bad), nullptr),
                 fmt::format("quantize on the GPU to {}", dtype_name(type)));
    SF_CUDA_CALL(cudaMemcpy(out.as<uint8_t>() + first * row_bytes, packed, static_cast<size_t>(count) * row_bytes,
                            cudaMemcpyDeviceToHost),
                 "quantize on the GPU: copy the packed rows back");
  }
  unsigned long long first_bad = 0;
  SF_CUDA_CALL(cudaMemcpy(&first_bad, bad, sizeof first_bad, cudaMemcpyDeviceToHost),
               "quantize on the GPU: read the error flag");
  // A block whose fp16 min or scale overflowed: the host quantizer fails on the same block and
  // says which row and values.
  if (first_bad != ~0ull) return quant::quantize(matrix, type);
  return out;
}

}  // namespace splitflow
