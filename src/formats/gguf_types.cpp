#include "formats/gguf_types.h"

#include "core/error.h"

#include <array>
#include <utility>

namespace splitflow {
namespace {

// (ggml id, dtype) for ggml.h's enum ggml_type.
constexpr std::array<std::pair<uint32_t, DType>, 18> kGgmlTypes = {{
    {0, DType::F32},   {1, DType::F16},   {2, DType::Q4_0},  {3, DType::Q4_1},  {6, DType::Q5_0},
    {7, DType::Q5_1},  {8, DType::Q8_0},  {10, DType::Q2_K}, {11, DType::Q3_K}, {12, DType::Q4_K},
    {13, DType::Q5_K}, {14, DType::Q6_K}, {24, DType::I8},   {25, DType::I16},  {26, DType::I32},
    {27, DType::I64},  {28, DType::F64},  {30, DType::BF16},
}};

// Q2_B32 .. I8_G128 take ids kSplitflowTypeBase + (dtype - Q2_B32): new types are appended after
// the last (before Mixed), so the ids of the earlier ones never change.
bool is_splitflow_type(DType dtype) { return dtype >= DType::Q2_B32 && dtype <= DType::I8_G128; }

}  // namespace

std::optional<DType> dtype_from_gguf_type(uint32_t type) {
  for (const auto& [id, dtype] : kGgmlTypes)
    if (id == type) return dtype;
  if (type >= kSplitflowTypeBase) {
    const uint32_t value = type - kSplitflowTypeBase + static_cast<uint32_t>(DType::Q2_B32);
    if (value <= static_cast<uint32_t>(DType::I8_G128)) return static_cast<DType>(value);
  }
  return std::nullopt;
}

uint32_t gguf_type_of(DType dtype) {
  for (const auto& [id, known] : kGgmlTypes)
    if (known == dtype) return id;
  if (is_splitflow_type(dtype))
    return kSplitflowTypeBase + static_cast<uint32_t>(dtype) - static_cast<uint32_t>(DType::Q2_B32);
  fail("a GGUF file cannot hold a {} tensor", dtype_name(dtype));
}

}  // namespace splitflow
