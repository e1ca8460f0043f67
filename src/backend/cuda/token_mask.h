// backend/cuda/token_mask.h — the kernel behind CudaBackend::apply_token_mask (structured outputs).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace splitflow::cuda {

// logits [rows, vocab] F32; mask [rows, ceil(vocab / 32)]: a clear bit sets the logit to -inf.
cudaError_t launch_apply_token_mask(float* logits, const uint32_t* mask, int64_t rows, int64_t vocab,
                                    cudaStream_t stream);

}  // namespace splitflow::cuda
