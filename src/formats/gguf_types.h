// formats/gguf_types.h — the tensor type ids of GGUF files, shared by the reader and the writer.
// ggml's own ids for the types llama.cpp defines; splitflow's Inferflow, FP8 and int8 weight-only types
// (core/dtype.h), which ggml has no id for, take ids from kSplitflowTypeBase up, so a file holding
// them is a valid GGUF that llama.cpp refuses by type ("invalid ggml type") instead of misreading.
#pragma once

#include "core/dtype.h"

#include <cstdint>
#include <optional>

namespace splitflow {

inline constexpr uint32_t kSplitflowTypeBase = 1024;

// The DType of a GGUF tensor type id, or nullopt when splitflow does not read it.
std::optional<DType> dtype_from_gguf_type(uint32_t type);
// The GGUF type id of a DType; throws for a dtype GGUF cannot hold (Bool, Mixed).
uint32_t gguf_type_of(DType dtype);

}  // namespace splitflow
