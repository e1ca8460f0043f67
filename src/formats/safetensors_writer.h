// formats/safetensors_writer.h — writes tensors and a string metadata map as one .safetensors file
// (used by tests and by `splitflow convert`). Readers live in weight_source.h.
#pragma once

#include "formats/weight_source.h"

#include <map>
#include <string>
#include <vector>

namespace splitflow {

// Tensors are stored in the given order (dtypes F32, F16, BF16, F64, I8, I16, I32, I64, U8, Bool);
// `metadata` becomes the `__metadata__` map. The header is padded with spaces to a multiple of 8
// bytes so every tensor stays 8-byte aligned. The file is written to `path`.tmp and renamed, so a
// failed write never leaves a partial file at `path`. Errors name the path and the tensor.
void write_safetensors(const std::string& path, const std::vector<TensorInfo>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace splitflow
