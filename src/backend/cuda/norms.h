// backend/cuda/norms.h — launchers for the norms a pre-norm layer does not have
// (backend/cuda/norms.cu): the post-norm residual add, the per-head RMSNorm of q and k, and logit
// soft-capping. Plain pointers, as backend/cuda/kernels.h; fp32 math on bf16 activations.
#pragma once

#include "backend/cuda/kernels.h"

namespace splitflow::cuda {

// residual += round_bf16(norm(x) * (offset + weight)) per row (the norm's output in bf16, as a
// bf16 model's norm module returns it, then the add). x, residual bf16 [tokens, hidden].
cudaError_t launch_norm_add(const bf16_bits* x, const float* weight, bool layer_norm, float eps, float weight_offset,
                            bf16_bits* residual, int64_t tokens, int64_t hidden, cudaStream_t stream);

// In place: each q head of qkv [tokens, (heads + 2 kv_heads) * head_dim] becomes
// rmsnorm(head) * (offset + q_weight), each k head the same with k_weight. head_dim <= 1024.
cudaError_t launch_qk_norm(bf16_bits* qkv, const float* q_weight, const float* k_weight, float eps,
                           float weight_offset, int64_t tokens, int heads, int kv_heads, int head_dim,
                           cudaStream_t stream);

// x[i] = cap * tanh(x[i] / cap) for i < count, f32.
cudaError_t launch_softcap(float* x, int64_t count, float cap, cudaStream_t stream);

}  // namespace splitflow::cuda
