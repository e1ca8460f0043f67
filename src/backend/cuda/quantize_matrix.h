// backend/cuda/quantize_matrix.h — launchers of --quantization in device memory
// (backend/cuda/quantize_matrix.cu; driven by quantize_matrix.cpp, quantize_matrix_on_cuda in
// backend/backend.h). Plain pointers and sizes only, as kernels.h.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace splitflow::cuda {

// out[i] = element first + i of a matrix chunk as f32, i < count: from `src` stored as `dtype`
// (f32, f16 or bf16), or, src null, generated_normal_value(key, stddev, first + i) rounded to `dtype`
// as core/tensor.cpp's materialize() rounds it (core/tensor.h's GeneratedNormal).
cudaError_t launch_matrix_to_f32(const void* src, DType dtype, uint64_t key, float stddev, int64_t first, float* out,
                                 int64_t count, cudaStream_t stream);
// Quantizes `rows` rows of `cols` f32 values (x, row-major) into `type`'s packed rows (out,
// dtype_row_bytes(type, cols) each, zeroed by the caller) with quant/block_quantizers.h, one thread
// per block (per scale group for FP8 and int8). *bad_block (initially -1 as unsigned: all ones)
// gets the lowest block whose fp16 min or scale is not finite (Inferflow types), for the caller to
// report. Any quantized type; cols a multiple of its block.
cudaError_t launch_quantize_rows(DType type, const float* x, int64_t rows, int64_t cols, uint8_t* out,
                                 unsigned long long* bad_block, cudaStream_t stream);

}  // namespace splitflow::cuda
