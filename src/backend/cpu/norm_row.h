// backend/cpu/norm_row.h — one row's RMSNorm / LayerNorm, shared by the CPU backend's norm kernels
// (add_norm, norm_add, qk_norm). fp32 values, statistics in double.
// Must never: allocate.
#pragma once

#include "backend/backend.h"

#include <cmath>
#include <cstdint>

namespace splitflow::cpu {

// y[i] = norm(x)[i] * (weight_offset + w[i]) over n values (RMSNorm, or LayerNorm without its
// bias). y may be x.
inline void normalize_row(const float* x, int64_t n, const float* w, const NormParams& params, float* y) {
  float mean = 0.0f;
  if (params.type == NormType::LayerNorm) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += x[i];
    mean = static_cast<float>(sum / n);
  }
  double squares = 0.0;
  for (int64_t i = 0; i < n; ++i) squares += static_cast<double>(x[i] - mean) * (x[i] - mean);
  const float inv = static_cast<float>(1.0 / std::sqrt(squares / n + params.eps));
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mean) * inv * (params.weight_offset + w[i]);
}

}  // namespace splitflow::cpu
