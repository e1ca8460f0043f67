// quant/row_slice.h — a range of columns out of one packed row of any matrix dtype (plain,
// GGUF / Inferflow blocks, or the scale-prefixed FP8 / int8 rows of core/dtype.h): what
// tensor parallelism's row-parallel shards (o_proj, down_proj split along their input) need
// without dequantizing. Pure byte work on the host.
#pragma once

#include "core/dtype.h"

#include <cstdint>
#include <span>

namespace splitflow::quant {

// Bytes of columns [begin, begin + count) of a row of `row_len` elements as a row of their own
// (dtype_row_bytes(dtype, count)). begin and count must be whole blocks (whole scale groups for
// F8_G128 / I8_G*); throws naming the dtype and the block size otherwise.
void slice_row_columns(DType dtype, int64_t row_len, std::span<const uint8_t> row, int64_t begin, int64_t count,
                       std::span<uint8_t> out);

}  // namespace splitflow::quant
