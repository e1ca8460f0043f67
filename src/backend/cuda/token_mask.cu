// One thread per logit: a warp's 32 lanes read the same mask word (one broadcast load) and write
// -inf to the consecutive logits its clear bits name, so stores coalesce; a mostly-allowed row
// (inside a JSON string) costs the mask's read and few writes.
#include "backend/cuda/token_mask.h"

#include <cmath>

namespace splitflow::cuda {

namespace {

__global__ void apply_token_mask_kernel(float* logits, const uint32_t* mask, int64_t vocab, int64_t words) {
  const int64_t row = blockIdx.y;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (token >= vocab) return;
  const uint32_t bits = mask[row * words + token / 32];
  if (!((bits >> (token % 32)) & 1u)) logits[row * vocab + token] = -INFINITY;
}

}  // namespace

cudaError_t launch_apply_token_mask(float* logits, const uint32_t* mask, int64_t rows, int64_t vocab,
                                    cudaStream_t stream) {
  if (rows == 0 || vocab == 0) return cudaSuccess;
  const int64_t words = (vocab + 31) / 32;
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>((vocab + kThreads - 1) / kThreads), static_cast<unsigned>(rows));
  apply_token_mask_kernel<<<grid, kThreads, 0, stream>>>(logits, mask, vocab, words);
  return cudaGetLastError();
}

}  // namespace splitflow::cuda
