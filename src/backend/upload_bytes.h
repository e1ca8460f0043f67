// backend/upload_bytes.h — what a host tensor becomes on the GPU after CudaBackend::upload, known
// without a GPU, so placement decisions (parallel/gpu_layer_fit.h) count the bytes the device will
// hold: float matrices are stored as bf16, float vectors as f32, packed (quantized, Mixed) and
// integer tensors as they are. The CUDA backend's upload follows cuda_upload_dtype.
#pragma once

#include "core/tensor.h"

#include <cstdint>

namespace splitflow {

// The dtype upload() stores `host` in (DType::Mixed and quantized types: unchanged).
DType cuda_upload_dtype(const Tensor& host);
// The device bytes of that.
int64_t cuda_upload_bytes(const Tensor& host);

}  // namespace splitflow
