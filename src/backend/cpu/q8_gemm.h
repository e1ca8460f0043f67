// backend/cpu/q8_gemm.h — the prefill GEMM over quantized weights with Q8 activations (llama.cpp
// runs its quantized prefill the same way): x is quantized per 32-element block to int8 exactly as
// the decode GEMV does (q8_activations.h), and y = x' W^T is summed in int32 by AVX-512 VNNI, 64
// multiply-adds per instruction against the fp32 GEMM's 16, each weight group's sum then scaled
// once by its weight scale and x's block scale.
// Layout: x' is transposed once per call into tiles of 16 rows, four consecutive codes of a row in
// one int32 lane (the lanes of an accumulator are 16 rows); each row of w is decoded once per work
// item to unsigned codes plus per-group scales (and minima), and four codes at a time are broadcast
// against the 16 rows. Groups are 32 elements (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 blocks; Q4_K's
// sub-blocks) or 16 (Q6_K's sub-blocks).
// Accuracy: the result is x' . w to fp32 rounding of the group sums, as for q8_gemv.
// Must never: run without AVX-512 VNNI (q8_gemm_supported() is false there and matmul keeps the
// fp32 GEMM), allocate per call beyond its thread-local buffers (grown, never shrunk).
#pragma once

#include "core/dtype.h"

#include <cstdint>
#include <functional>

namespace splitflow::cpu {

// Whether q8_gemm runs `type` here (the types of q8_gemv_supported).
bool q8_gemm_supported(DType type);

// y[i * ldy + j] (+)= x'[i] . w[j] for i < m, j < n, x' being x quantized per 32-element block;
// w [n, k] packed rows of `type`, k a multiple of its block (32 or 256).
// stored_row(j), when given, supplies row j of w as stored instead of w + j * row bytes (w is then
// unused): the CPU backend restores rows from a repacked copy whose original is gone. It may
// return the calling thread's scratch, read before its next call on that thread.
void q8_gemm(const float* x, int64_t m, int64_t k, const void* w, DType type, int64_t n, float* y, int64_t ldy,
             bool accumulate, int num_threads, const std::function<const uint8_t*(int64_t row)>& stored_row = nullptr);

}  // namespace splitflow::cpu
