// comm/elementwise.h — the unfused steps that the fused allreduce kernels replace: residual add and
// RMSNorm on the device. CommGroup falls back to them where a fused kernel does not apply, and the
// benchmark times "allreduce, add, norm" as three launches with them.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstddef>

namespace splitflow::comm {

// out = a + b elementwise (fp32 arithmetic, one rounding); F32, F16 or BF16; out may alias a or b.
void add(const void* a, const void* b, void* out, size_t count, DType dtype, cudaStream_t stream);

// out[row] = in[row] * rsqrt(mean(in[row]^2) + eps) * weight; in, out [rows, hidden] of dtype,
// weight [hidden] f32.
void rms_norm(const void* in, const float* weight, void* out, size_t rows, size_t hidden, float eps, DType dtype,
              cudaStream_t stream);

}  // namespace splitflow::comm
