#include "quant/row_slice.h"

#include "core/error.h"

#include <cstring>

namespace splitflow::quant {

namespace {

bool scale_prefixed(DType dtype) {
  return dtype == DType::F8_CHANNEL || dtype == DType::F8_G128 || dtype == DType::I8_G32 || dtype == DType::I8_G64 ||
         dtype == DType::I8_G128;
}

size_t padded_scale_bytes(size_t groups) { return (groups * sizeof(float) + 15) / 16 * 16; }

}  // namespace

void slice_row_columns(DType dtype, int64_t row_len, std::span<const uint8_t> row, int64_t begin, int64_t count,
                       std::span<uint8_t> out) {
  SF_CHECK(begin >= 0 && count >= 0 && begin + count <= row_len, "column slice [{}, {}) of a row of {} elements",
           begin, begin + count, row_len);
  SF_CHECK(row.size() == dtype_row_bytes(dtype, row_len) && out.size() == dtype_row_bytes(dtype, count),
           "column slice of a {} row: {} bytes in, {} out", dtype_name(dtype), row.size(), out.size());
  const int64_t block = is_quantized(dtype) ? dtype_block_elems(dtype) : 1;
  SF_CHECK(begin % block == 0, "column slice of a {} row: column {} is not on a {}-element block boundary",
           dtype_name(dtype), begin, block);
  if (!scale_prefixed(dtype)) {  // blocks (or elements) back to back: a byte range
    const size_t offset = dtype_row_bytes(dtype, begin);
    std::memcpy(out.data(), row.data() + offset, out.size());
    return;
  }
  // f32 scales padded to 16 bytes, then one code byte per element.
  const bool per_row = dtype == DType::F8_CHANNEL;
  const size_t groups_in = per_row ? 1 : static_cast<size_t>(row_len / block);
  const size_t groups_out = per_row ? (count > 0 ? 1 : 0) : static_cast<size_t>(count / block);
  const size_t first_group = per_row ? 0 : static_cast<size_t>(begin / block);
  std::memset(out.data(), 0, padded_scale_bytes(groups_out));
  std::memcpy(out.data(), row.data() + first_group * sizeof(float), groups_out * sizeof(float));
  std::memcpy(out.data() + padded_scale_bytes(groups_out), row.data() + padded_scale_bytes(groups_in) + begin,
              static_cast<size_t>(count));
}

}  // namespace splitflow::quant
