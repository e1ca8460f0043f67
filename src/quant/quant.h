// quant/quant.h — quantized weight formats: what each type is, and pure CPU reference codecs.
//
// Owns: the description of every quantized matrix type (core/dtype.h holds only their storage
// geometry), quantize / dequantize of rows and whole tensors, the validation of packed data
// (NaN/Inf scales, truncated data), and the quantize-at-load transform (`--quantization`).
// Must never: run on a device, know a model or file format, or be called on a hot path by a
// backend (backends have their own fused kernels and test them against these references).
//
// Types (storage layout in core/dtype.h):
//  - GGUF / llama.cpp Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: dequantization
//    bit-identical to the `gguf` Python package (gguf.quants.dequantize); quantization follows
//    llama.cpp's reference quantizers (quantize_row_*_ref), so files it writes read back in llama.cpp.
//  - Inferflow Qk_B32 / Qk_B64 (k = 2, 3, 4, 5, 6, 8): per block min m and scale s = (max - m) /
//    (2^k - 1), both fp16; q = clamp(round((w - m) / s), 0, 2^k - 1); w' = m + q s.
//  - Inferflow Q3H_B64: levels 0..10 (s = (max - m) / 10), codes q[2i] * 11 + q[2i+1] of 7 bits.
//  - FP8 E4M3 weight-only F8_CHANNEL / F8_G128: scale = absmax / 448 per row or per 128 elements,
//    e = f32_to_e4m3(w / scale); w' = e4m3_to_f32(e) * scale.
#pragma once

#include "core/dtype.h"
#include "core/tensor.h"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace splitflow::quant {

enum class Family { Gguf, Inferflow, Fp8 };

struct TypeInfo {
  DType type;
  Family family;
  int64_t block_elems;       // core/dtype.h's dtype_block_elems
  double bits_per_weight;    // storage bits per weight, scales included (for a 4096-wide row)
  std::string_view summary;  // one line for --help and docs
};

// Every quantized type, in core/dtype.h's order.
std::span<const TypeInfo> all_types();
// Throws for a dtype that is not quantized.
const TypeInfo& info(DType type);

// One row of k elements (k a multiple of the block size). dequantize_row writes k floats;
// quantize_row writes dtype_row_bytes(type, k) bytes.
void dequantize_row(DType type, const void* row, float* out, int64_t k);
void quantize_row(DType type, const float* in, void* row, int64_t k);

// A [rows, cols] matrix (f32/f16/bf16, or generated) to `type`, rows in parallel (OpenMP).
// Throws naming the shape when cols is not a multiple of the block.
Tensor quantize(const Tensor& matrix, DType type);
// Any tensor (plain, quantized or Mixed) as f32 of the same logical shape.
Tensor dequantize(const Tensor& tensor);

// Checks a packed tensor's scales: every block's fp16/f32 scale and min must be finite. Throws,
// naming `what` (the tensor), the type, the row and block, on the first that is not.
void validate(const Tensor& tensor, const std::string& what);

}  // namespace splitflow::quant
