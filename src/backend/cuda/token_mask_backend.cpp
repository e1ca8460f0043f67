// CudaBackend::apply_token_mask (kernel: backend/cuda/token_mask.cu).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/token_mask.h"
#include "core/error.h"

namespace splitflow::cuda {

void CudaBackend::apply_token_mask(const DeviceTensor& logits, const DeviceTensor& mask) {
  SF_CHECK(logits.dtype == DType::F32 && logits.shape.size() == 2, "cuda apply_token_mask: logits must be F32 [rows, vocab], got {} {}",
           dtype_name(logits.dtype), shape_str(logits.shape));
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  SF_CHECK(mask.dtype == DType::I32 && mask.shape == Shape({rows, (vocab + 31) / 32}),
           "cuda apply_token_mask: mask must be I32 [{}, {}], got {} {}", rows, (vocab + 31) / 32,
           dtype_name(mask.dtype), shape_str(mask.shape));
  const cudaError_t err = launch_apply_token_mask(logits.as<float>(), static_cast<const uint32_t*>(mask.data), rows,
                                                  vocab, stream_);
  SF_CHECK(err == cudaSuccess, "cuda apply_token_mask: {}", cudaGetErrorString(err));
}

}  // namespace splitflow::cuda
