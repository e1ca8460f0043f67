// backend/cpu/q8_activations.h — the decode GEMV over GGUF's 32-element block types (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0) and the K-quants (Q2_K .. Q6_K), with integer dot products as llama.cpp runs
// them on the CPU (it quantizes x per 256 for K-quants; here always per 32, at least as accurate):
// each 32-element block of x is quantized to
// int8 with one fp32 scale (d = max |x| / 127, q = round-to-nearest-even(x / d), Q8_0 activations),
// and a block's dot product is an exact int32 sum of code x q products (AVX-512 VNNI), scaled
// once by d_w * d_x. Weight codes are fed as unsigned bytes: Q4 nibbles as they are, Q5 with the
// fifth bit, Q8_0 biased by 128; the constant part (-8, -16 or -128 times sum(q) per block) is
// folded into the int32 accumulator from x's side, and Q4_1/Q5_1's minimum m adds m * d_x * sum(q).
// K-quants scale each int32 lane (4 elements) by its sub-block's d * sc and d_x; Q6_K's codes are
// q + 32 (correction -32), Q3_K's q + 4; the minima of Q2_K / Q4_K / Q5_K add -dmin * m * d_x *
// sum(q), once per super-block. (The CPU backend's decode reads repacked copies of all ten,
// interleaved_rows.h; this kernel runs the rows as stored: their tails, and direct callers.)
// Accuracy: the result is exactly x' . w for x' = q * d (up to fp32 rounding of the block sums), so
// the error against x . w is at most sum_b d_b / 2 * sum_{p in b} |w_p| (docs/cpu.md measures
// it on perplexity).
// Must never: allocate per call beyond its thread-local x buffer (grown, never shrunk), or run
// without AVX-512 VNNI (q8_gemv_supported() is false there; the float path runs instead).
#pragma once

#include "core/dtype.h"

#include <cstdint>

namespace splitflow::cpu {

// Whether q8_gemv runs `type` here (one of the ten above, and the target has AVX-512 VNNI).
bool q8_gemv_supported(DType type);

// y[i * ldy + j] (+)= x'[i] . w[j] for i < m, j < n, x' being x[i] quantized per 32-element block
// as above; w [n, k] packed rows of `type`, k a multiple of its block (32 or 256).
void q8_gemv(const float* x, int64_t m, int64_t k, const void* w, DType type, int64_t n, float* y, int64_t ldy,
             bool accumulate, int num_threads);

// x quantized as q8_gemv does (exposed for tests): q[p] and d[p / 32].
void quantize_q8_blocks(const float* x, int64_t k, int8_t* q, float* d);

}  // namespace splitflow::cpu
