// backend/cuda/activation.cuh — the MLP activations in fp32, shared by the activation kernel
// (kernels.cu) and the GEMV that applies them in its epilogue (gemv.cu). act codes: 0 SiLU,
// 1 GELU (erf form), 2 GELU (tanh form), 3 ReLU.
#pragma once

namespace splitflow::cuda {

__device__ __forceinline__ float activate(float x, int act) {
  switch (act) {
    case 0: return x / (1.0f + expf(-x));
    case 1: return 0.5f * x * erfcf(-x * 0.70710678118654752f);
    case 2: {
      const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
      return x / (1.0f + expf(-2.0f * inner));
    }
    default: return x > 0.0f ? x : 0.0f;
  }
}

}  // namespace splitflow::cuda
