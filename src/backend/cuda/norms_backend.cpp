// CudaBackend's norm_add, qk_norm and softcap (kernels: backend/cuda/norms.cu).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/norms.h"
#include "core/error.h"

namespace splitflow::cuda {
namespace {

void check(const DeviceTensor& t, DType dtype, const Shape& shape, const char* kernel, const char* arg) {
  SF_CHECK(t.dtype == dtype && t.shape == shape, "cuda {}: {} is {} {}, expected {} {}", kernel, arg,
           dtype_name(t.dtype), shape_str(t.shape), dtype_name(dtype), shape_str(shape));
}
void check_launch(cudaError_t err, const char* what) {
  SF_CHECK(err == cudaSuccess, "cuda {}: {}", what, cudaGetErrorString(err));
}
bf16_bits* bf16_ptr(const DeviceTensor& t) { return static_cast<bf16_bits*>(t.data); }

}  // namespace

void CudaBackend::norm_add(const DeviceTensor& x, const DeviceTensor& weight, const NormParams& params,
                           const DeviceTensor& residual) {
  SF_CHECK(x.shape.size() == 2, "cuda norm_add: x has shape {}, expected [tokens, hidden]", shape_str(x.shape));
  check(x, DType::BF16, x.shape, "norm_add", "x");
  check(residual, DType::BF16, x.shape, "norm_add", "residual");
  check(weight, DType::F32, {x.dim(1)}, "norm_add", "weight");
  check_launch(launch_norm_add(bf16_ptr(x), weight.as<float>(), params.type == NormType::LayerNorm, params.eps,
                               params.weight_offset, bf16_ptr(residual), x.dim(0), x.dim(1), stream_),
               "norm_add");
}

void CudaBackend::qk_norm(const DeviceTensor& qkv, const DeviceTensor& q_weight, const DeviceTensor& k_weight,
                          const NormParams& norm, const AttentionParams& params) {
  const int64_t width = int64_t{params.num_heads + 2 * params.num_kv_heads} * params.head_dim;
  SF_CHECK(qkv.shape.size() == 2 && qkv.dim(1) == width, "cuda qk_norm: qkv has shape {}, expected [tokens, {}]",
           shape_str(qkv.shape), width);
  SF_CHECK(norm.type == NormType::RMSNorm, "cuda qk_norm: the per-head norm is an RMSNorm");
  check(qkv, DType::BF16, qkv.shape, "qk_norm", "qkv");
  check(q_weight, DType::F32, {params.head_dim}, "qk_norm", "q_weight");
  check(k_weight, DType::F32, {params.head_dim}, "qk_norm", "k_weight");
  check_launch(launch_qk_norm(bf16_ptr(qkv), q_weight.as<float>(), k_weight.as<float>(), norm.eps, norm.weight_offset,
                              qkv.dim(0), params.num_heads, params.num_kv_heads, params.head_dim, stream_),
               "qk_norm");
}

void CudaBackend::softcap(const DeviceTensor& x, float cap) {
  check(x, DType::F32, x.shape, "softcap", "x");
  SF_CHECK(cap > 0.0f, "cuda softcap: cap must be > 0, got {}", cap);
  check_launch(launch_softcap(x.as<float>(), x.numel(), cap, stream_), "softcap");
}

}  // namespace splitflow::cuda
