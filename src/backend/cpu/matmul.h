// backend/cpu/matmul.h — y = x W^T (+ bias) on the CPU, W read in its stored dtype.
// Few rows of x (decode): a GEMV that streams W once, the weights being the memory traffic.
// Many rows (prefill): a packed, register-blocked GEMM (W panels converted to fp32 while packing;
// 8 x 32 micro-tiles on AVX-512, 6 x 16 on AVX2).
// Quantized W (core/dtype.h): the GEMV decodes each block in registers and multiplies it with x
// (quant_matmul.h); the GEMM's packing decodes a panel's rows (32 or 16 rows x 256 columns) to fp32.
#pragma once

#include "core/dtype.h"

#include <cstdint>

namespace splitflow::cpu {

// What a matmul does besides y = x W^T.
struct MatmulMode {
  bool accumulate = false;      // y += x W^T (a residual add in the same pass over y)
  bool q8_activations = false;  // decode GEMVs over Q4_0 .. Q8_0 quantize x to Q8 blocks (quant_matmul.h)
};

// y[i * ldy + j] (+)= x[i] . w[j] for j < n, no bias: x [m, k] F32, w [n, k] in w_dtype (F32,
// F16, BF16 or quantized, not Mixed: one run of a Mixed matrix goes into its columns).
void matmul_strided(const float* x, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n, float* y,
                    int64_t ldy, MatmulMode mode, int num_threads);

// The two paths with y = x W^T + bias (bias [n] or null), fp32 activations, exposed so tests and
// benchmarks can run each on any m.
void matmul_gemv(const float* x, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n, const float* bias,
                 float* y, int num_threads);
void matmul_gemm(const float* x, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n, const float* bias,
                 float* y, int num_threads);

// Rows of x from which matmul() takes the GEMM path. Below it the GEMV's repeated passes over W
// (one per 4 rows) cost less than packing W (measured on TinyLlama shapes, F16, 2 cores).
constexpr int64_t kGemmMinRows = 10;
// From this many rows, a product over a repacked matrix (interleaved_rows.h) runs the stored-rows
// integer GEMM (q8_gemm.h) on rows restored from the copy rather than the copy's own kernel.
constexpr int64_t kRestoredGemmRows = 256;

}  // namespace splitflow::cpu
