#include "backend/upload_bytes.h"

namespace splitflow {

DType cuda_upload_dtype(const Tensor& host) {
  const bool is_float = host.dtype == DType::F32 || host.dtype == DType::F16 || host.dtype == DType::BF16;
  if (!is_float) return host.dtype;
  return host.shape.size() >= 2 ? DType::BF16 : DType::F32;
}

int64_t cuda_upload_bytes(const Tensor& host) {
  const DType stored = cuda_upload_dtype(host);
  if (stored == host.dtype) return static_cast<int64_t>(host.nbytes());
  return host.numel() * static_cast<int64_t>(dtype_size(stored));
}

}  // namespace splitflow
