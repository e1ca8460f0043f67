// convert/quantize_checkpoint.h — file-to-file quantization behind `splitflow quantize`.
//
// Owns: choosing each tensor's output type, and writing the result as a GGUF (formats/gguf_writer)
// with the input's metadata and tokenizer carried over. Must never: run a model, or hold a codec
// (quant/ owns those).
//
// Input: a GGUF. Every 2-D weight (matrices and the embedding; norms and biases are 1-D and kept)
// is dequantized to f32 and quantized to the target, as `llama-quantize --pure` does; a matrix
// whose rows the target's blocks do not divide falls back to a type whose blocks do (llama.cpp's
// fallbacks: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; Q2_K / Q3_K -> Q4_0 where llama.cpp picks
// IQ4_NL, which splitflow does not run), and, failing that, stays as it is.
// Output: llama.cpp's types give a GGUF llama.cpp and the `gguf` package read; splitflow's own
// (Inferflow, FP8) give a GGUF with the type ids of formats/gguf_types.h, which splitflow loads
// and llama.cpp refuses by type.
#pragma once

#include "core/dtype.h"

#include <functional>
#include <optional>
#include <string>

namespace splitflow {

struct QuantizeReport {
  int quantized = 0;      // tensors written in the target type
  int fallback = 0;       // tensors written in a fallback type
  int kept = 0;           // tensors copied as they were
  size_t input_bytes = 0;
  size_t output_bytes = 0;
};

// The type a [rows, row_len] weight is written in for `target` (the target itself, a fallback,
// or nullopt: keep the tensor as it is).
std::optional<DType> quantized_type_for(DType target, int64_t row_len);

// Throws, naming the file, tensor or type, on an input that is not a GGUF or a target that is not a
// quantized or float (f32, f16, bf16) type. progress (may be empty) sees each tensor's name.
QuantizeReport quantize_checkpoint(const std::string& input, DType target, const std::string& output,
                                   const std::function<void(const std::string&, DType)>& progress = {});

}  // namespace splitflow
