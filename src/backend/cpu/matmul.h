// backend/cpu/matmul.h — y = x W^T (+ bias) on the CPU, W read in its stored dtype.
// Few rows of x (decode): a GEMV that streams W once, the weights being the memory traffic.
// Many rows (prefill): a packed, register-blocked GEMM (W panels converted to fp32 while packing).
// Quantized W (core/dtype.h): the GEMV decodes each block in registers and multiplies it with x
// (quant_matmul.h); the GEMM's packing decodes a panel's rows (16 rows x 256 columns) to fp32.
#pragma once

#include "core/dtype.h"

#include <cstdint>

namespace splitflow::cpu {

// x [m, k] F32, w [n, k] in w_dtype (F32, F16, BF16 or quantized, not Mixed), bias [n] or null,
// y [m, n] F32.
void matmul(const float* x, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n, const float* bias,
            float* y, int num_threads);

// y[i * ldy + j] = x[i] . w[j] for j < n, no bias: one run of a Mixed matrix into its columns.
void matmul_strided(const float* x, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n, float* y,
                    int64_t ldy, int num_threads);

// The two paths, exposed so tests and benchmarks can run each on any m.
void matmul_gemv(const float* x, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n, const float* bias,
                 float* y, int num_threads);
void matmul_gemm(const float* x, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n, const float* bias,
                 float* y, int num_threads);

// Rows of x from which matmul() takes the GEMM path. Below it the GEMV's repeated passes over W
// (one per 4 rows) cost less than packing W (measured on TinyLlama shapes, F16, 2 cores).
constexpr int64_t kGemmMinRows = 10;

}  // namespace splitflow::cpu
