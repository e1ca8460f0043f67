// The norms a pre-norm layer does not have: the post-norm residual add (Gemma's sandwich norms),
// the per-head RMSNorm of q and k (QK-norm), and logit soft-capping. fp32, one row per thread.
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/norm_row.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_team.h"
#include "core/error.h"

#include <cmath>
#include <vector>

namespace splitflow::cpu {
namespace {

void check_f32(const DeviceTensor& t, const char* kernel, const char* arg) {
  SF_CHECK(t.dtype == DType::F32, "cpu {}: {} has dtype {}, expected f32", kernel, arg, dtype_name(t.dtype));
}

}  // namespace

void CpuBackend::norm_add(const DeviceTensor& x, const DeviceTensor& weight, const NormParams& params,
                          const DeviceTensor& residual) {
  check_f32(x, "norm_add", "x");
  check_f32(weight, "norm_add", "weight");
  check_f32(residual, "norm_add", "residual");
  SF_CHECK(x.shape.size() == 2 && x.shape == residual.shape && weight.shape == Shape{x.dim(1)},
           "cpu norm_add: x {}, weight {} and residual {} must be [T, H], [H] and [T, H]", shape_str(x.shape),
           shape_str(weight.shape), shape_str(residual.shape));
  const int64_t tokens = x.dim(0), hidden = x.dim(1);
  parallel_ranges(num_threads_, tokens, tokens * hidden >= kMinParallelWork, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> row;
    row.resize(static_cast<size_t>(hidden));
    for (int64_t t = begin; t < end; ++t) {
      normalize_row(x.as<float>() + t * hidden, hidden, weight.as<float>(), params, row.data());
      float* r = residual.as<float>() + t * hidden;
      for (int64_t i = 0; i < hidden; ++i) r[i] += row[i];
    }
  });
}

void CpuBackend::qk_norm(const DeviceTensor& qkv, const DeviceTensor& q_weight, const DeviceTensor& k_weight,
                         const NormParams& norm, const AttentionParams& params) {
  check_f32(qkv, "qk_norm", "qkv");
  check_f32(q_weight, "qk_norm", "q_weight");
  check_f32(k_weight, "qk_norm", "k_weight");
  const int64_t head_dim = params.head_dim, heads = params.num_heads, kv_heads = params.num_kv_heads;
  const int64_t width = (heads + 2 * kv_heads) * head_dim;
  SF_CHECK(qkv.shape.size() == 2 && qkv.dim(1) == width, "cpu qk_norm: qkv has shape {}, expected [T, {}]",
           shape_str(qkv.shape), width);
  SF_CHECK(q_weight.shape == Shape{head_dim} && k_weight.shape == Shape{head_dim},
           "cpu qk_norm: q_weight {} and k_weight {} must be [{}]", shape_str(q_weight.shape),
           shape_str(k_weight.shape), head_dim);
  const int64_t tokens = qkv.dim(0), normed_heads = heads + kv_heads;
  parallel_ranges(num_threads_, tokens, tokens * width >= kMinParallelWork, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t h = 0; h < normed_heads; ++h) {
        float* head = qkv.as<float>() + t * width + h * head_dim;
        normalize_row(head, head_dim, (h < heads ? q_weight : k_weight).as<float>(), norm, head);
      }
  });
}

void CpuBackend::softcap(const DeviceTensor& x, float cap) {
  check_f32(x, "softcap", "x");
  SF_CHECK(cap > 0.0f, "cpu softcap: cap must be > 0, got {}", cap);
  float* v = x.as<float>();
  const int64_t n = x.numel();
  parallel_ranges(num_threads_, n, n >= kMinParallelWork, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) v[i] = cap * std::tanh(v[i] / cap);
  });
}

}  // namespace splitflow::cpu
