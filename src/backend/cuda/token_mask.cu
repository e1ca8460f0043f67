// One thread per mask word: it reads its 32 bits once and writes only the logits they clear, so a
// mostly-allowed row (inside a JSON string) costs a read of the mask and few writes.
#include "backend/cuda/token_mask.h"

#include <cmath>

namespace splitflow::cuda {

namespace {

__global__ void apply_token_mask_kernel(float* logits, const uint32_t* mask, int64_t vocab, int64_t words) {
  const int64_t row = blockIdx.y;
  const int64_t word = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (word >= words) return;
  const uint32_t bits = mask[row * words + word];
  if (bits == 0xFFFFFFFFu) return;
  float* out = logits + row * vocab + word * 32;
  const int64_t n = min(int64_t{32}, vocab - word * 32);
  for (int64_t i = 0; i < n; ++i) {
    if (!((bits >> i) & 1u)) out[i] = -INFINITY;
  }
}

}  // namespace

cudaError_t launch_apply_token_mask(float* logits, const uint32_t* mask, int64_t rows, int64_t vocab,
                                    cudaStream_t stream) {
  if (rows == 0 || vocab == 0) return cudaSuccess;
  const int64_t words = (vocab + 31) / 32;
  constexpr int kThreads = 128;
  const dim3 grid(static_cast<unsigned>((words + kThreads - 1) / kThreads), static_cast<unsigned>(rows));
  apply_token_mask_kernel<<<grid, kThreads, 0, stream>>>(logits, mask, vocab, words);
  return cudaGetLastError();
}

}  // namespace splitflow::cuda
