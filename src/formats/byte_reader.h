// formats/byte_reader.h — bounds-checked little-endian reads over a mapped file, shared by the
// GGUF and llama2.c readers. Every read checks the bytes left before touching memory, so a damaged
// file gives an Error naming the file, the field and the offset, never a read past the end.
#pragma once

#include "core/error.h"
#include "core/mapped_file.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>
#include <type_traits>
#include <vector>

namespace splitflow {

static_assert(std::endian::native == std::endian::little, "the readers assume a little-endian host");

class ByteReader {
 public:
  explicit ByteReader(const MappedFile& file) : file_(file) {}

  size_t offset() const { return offset_; }
  size_t remaining() const { return file_.size() - offset_; }
  const std::string& path() const { return file_.path(); }

  // Fails unless `count` more bytes exist; `what` names the field for the message.
  void require(uint64_t count, std::string_view what) const {
    if (count > remaining())
      fail("'{}': truncated or corrupt: {} needs {} bytes at offset {}, but only {} remain", path(), what,
           count, offset_, remaining());
  }

  // Returns the next `count` bytes and moves past them.
  const uint8_t* bytes(uint64_t count, std::string_view what) {
    require(count, what);
    const uint8_t* start = file_.data() + offset_;
    offset_ += count;
    return start;
  }

  template <typename T>
  T read(std::string_view what) {
    static_assert(std::is_trivially_copyable_v<T>);
    T value;
    std::memcpy(&value, bytes(sizeof(T), what), sizeof(T));
    return value;
  }

  // GGUF string: u64 byte length, then the bytes (no terminator).
  std::string_view string(std::string_view what) {
    const auto length = read<uint64_t>(what);
    return {reinterpret_cast<const char*>(bytes(length, what)), static_cast<size_t>(length)};
  }

 private:
  const MappedFile& file_;
  size_t offset_ = 0;
};

// a * b, failing with `what` instead of wrapping around.
inline uint64_t checked_mul(uint64_t a, uint64_t b, std::string_view what) {
  uint64_t product;
  if (__builtin_mul_overflow(a, b, &product)) fail("{} overflows 64 bits ({} x {})", what, a, b);
  return product;
}
// Elements of a tensor of `shape`, failing with `what` unless every product of its extents, in any
// order, fits int64_t: shape_numel multiplies outermost first, so a zero extent must not hide an
// overflow of the extents before it (the product of the non-zero extents bounds them all).
inline uint64_t checked_numel(const std::vector<int64_t>& shape, std::string_view what) {
  uint64_t nonzero_product = 1;
  bool has_zero = false;
  for (const int64_t extent : shape) {
    if (extent < 0) fail("{}: extent {} is negative", what, extent);
    if (extent == 0) {
      has_zero = true;
      continue;
    }
    nonzero_product = checked_mul(nonzero_product, uint64_t(extent), what);
    if (nonzero_product > uint64_t(std::numeric_limits<int64_t>::max()))
      fail("{}: {} elements overflow a signed 64-bit count", what, nonzero_product);
  }
  return has_zero ? 0 : nonzero_product;
}
inline uint64_t checked_add(uint64_t a, uint64_t b, std::string_view what) {
  uint64_t sum;
  if (__builtin_add_overflow(a, b, &sum)) fail("{} overflows 64 bits ({} + {})", what, a, b);
  return sum;
}

}  // namespace splitflow
