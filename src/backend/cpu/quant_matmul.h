// backend/cpu/quant_matmul.h — the CPU kernels over quantized weight matrices (core/dtype.h):
// a fused dequantize-dot GEMV for decode-sized x (each block decoded in registers, or through a
// block-sized stack buffer for the types without a vector decoder, and multiplied with up to 4
// rows of x; threads split the output rows), and row-slice decoding for the GEMM's packing and
// for embedding lookups. Never a full dequantized copy of a matrix.
#pragma once

#include "core/dtype.h"

#include <cstdint>

namespace splitflow::cpu {

// y[i * ldy + j] (+)= x[i] . w[j] for i < m, j < n; w [n, k] packed rows of the quantized `type`.
// q8_activations: where q8_gemv_supported(type) (backend/cpu/q8_activations.h), x is quantized to
// Q8 blocks and the dot products are integer ones, as llama.cpp runs these types; otherwise (or
// false) x stays fp32.
void quant_gemv(const float* x, int64_t m, int64_t k, const void* w, DType type, int64_t n, float* y, int64_t ldy,
                bool accumulate, bool q8_activations, int num_threads);

// out[r * count + p] = w[row_begin + r][p0 + p] as f32 for r < rows, p < count (p0 and count
// multiples of the type's block).
void quant_decode_rows(DType type, const void* w, int64_t k, int64_t row_begin, int64_t rows, int64_t p0, int64_t count,
                       float* out);

}  // namespace splitflow::cpu
