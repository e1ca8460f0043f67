// quant/quant.h — quantized weight formats: what each type is, and pure CPU reference codecs.
//
// Owns: the description of every quantized matrix type (core/dtype.h holds only their storage
// geometry), quantize / dequantize of rows and whole tensors, the validation of packed data
// (NaN/Inf scales, truncated data), the quantize-at-load transform (`--quantization`), and the
// packing of FP8 checkpoints' e4m3 weights + scales into F8_CHANNEL / F8_G128.
// Must never: run on a device (except quant/block_quantizers.h, the per-block quantizers, which
// backend/cuda compiles for --quantization in device memory: the same code, the same bytes), know
// a model or file format, or be called on a hot path by a backend (backends have their own fused
// kernels and test them against these references).
//
// Types (storage layout in core/dtype.h):
//  - GGUF / llama.cpp Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: dequantization
//    bit-identical to the `gguf` Python package (gguf.quants.dequantize); quantization follows
//    llama.cpp's reference quantizers (quantize_row_*_ref, no importance matrix) byte for byte.
//  - Inferflow Qk_B32 / Qk_B64 (k = 2, 3, 4, 5, 6, 8): per block min m and scale s = (max - m) /
//    (2^k - 1) with m = min w, both fp16; q = clamp(round((w - m) / s), 0, 2^k - 1); w' = m + q s.
//  - Inferflow Q3H_B64: levels 0..10 (s = (max - m) / 10), codes q[2i] * 11 + q[2i+1] of 7 bits.
//    Stored min and scale are the nearest fp16 values; codes are computed against them (fp64,
//    ties round up). A block whose scale is 0 (max == min) has all-zero codes. Details and the
//    bit stream: quant/inferflow_blocks.cpp.
//  - FP8 E4M3 weight-only F8_CHANNEL / F8_G128: scale = absmax / 448 per row or per 128 elements,
//    e = f32_to_e4m3(w / scale); w' = e4m3_to_f32(e) * scale. An all-zero group stores scale 0.
//  - int8 groups I8_G32 / I8_G64 / I8_G128 (llama2.c's version-2 export, kept packed by its
//    reader): scale = absmax / 127 per group (f32), q = round(w / scale) ties to even (torch.round,
//    as llama2.c's export.py); w' = q * scale. An all-zero group stores scale 0.
// Exactness for kernels: in every decoder the product of scales and codes is exact in float32
// (an fp16 scale times integers whose product is below 2^13, or one e4m3 or int8 x f32 product), so an
// element is that product with at most one rounded add (GGUF's min/offset, Inferflow's m): a kernel
// may use FMA or any association of the product and still match these references bit for bit.
// The quantizers' operation order does matter (quant/ is built with -ffp-contract=off).
#pragma once

#include "core/dtype.h"
#include "core/tensor.h"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace splitflow::quant {

enum class Family { Gguf, Inferflow, Fp8, Int8 };

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
// An FP8 checkpoint's weight as llm-compressor / compressed-tensors (and HF "fp8") store it:
// `weight` f8_e4m3 [n, k] and `weight_scale` (f32/bf16/f16) per tensor ([] or [1]), per channel
// ([n, 1] or [n]), per group of 128 along k ([n, k/128]) or per 128x128 block ([ceil(n/128),
// ceil(k/128)], DeepSeek's weight_scale_inv). Returns F8_CHANNEL [n, k] (per tensor / channel: the
// tensor scale repeated per row) or F8_G128 (group / block); the e4m3 bytes are copied unchanged,
// so dequantize() gives exactly e4m3 * scale. Throws, naming `name`, for other scale shapes or a
// k the packed type cannot hold (a multiple of 16, or of 128 for group / block scales).
Tensor pack_fp8_checkpoint_weight(const Tensor& weight, const Tensor& weight_scale, const std::string& name);

// Throws, naming `what`, the type and shape, when `available_bytes` is less than the tensor's
// packed size (a truncated block or row).
void check_packed_bytes(const Tensor& tensor, size_t available_bytes, const std::string& what);

}  // namespace splitflow::quant
