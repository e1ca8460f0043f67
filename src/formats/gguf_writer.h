// formats/gguf_writer.h — writes a GGUF v3 file: metadata key/values and tensors (plain, or
// quantized blocks as they are: core/dtype.h's layouts are ggml's for the GGUF types; splitflow's
// own types get the ids of formats/gguf_types.h). `splitflow quantize` writes its output with it.
#pragma once

#include "formats/weight_source.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace splitflow {

// Metadata value types follow the JSON: strings; booleans; negative-capable integers as i32 (i64
// past its range); unsigned as u32 (u64 past it); floats as f32; arrays of one such type (nested
// arrays as arrays). These are the types llama.cpp's writer uses for every key it reads. Tensors
// go in the given order, each at a multiple of `alignment` (general.alignment is written when not
// 32). Written to `path`.tmp and renamed: a failed write leaves no partial file. Errors name the
// key or tensor.
void write_gguf(const std::string& path, const nlohmann::json& metadata, const std::vector<TensorInfo>& tensors,
                uint32_t alignment = 32);

}  // namespace splitflow
