// formats/torch_zip.h — the zip container of a PyTorch >= 1.6 checkpoint, read from a mapped file:
// the central directory (zip64 included) and the byte range of each *stored* entry. torch.save
// writes every entry stored (uncompressed) and 64-byte aligned, so tensors can be views into the
// mapping.
//
// Owns: locating the central directory, checking every entry's header, name, size and offset
// against the file size. Must never: decompress (a compressed or encrypted entry is an Error naming
// it), interpret entry contents, or hand out a byte range it has not checked.
#pragma once

#include "core/mapped_file.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace splitflow {

struct ZipEntry {
  std::string name;
  uint64_t data_offset = 0;  // of the first content byte, in the file
  uint64_t size = 0;         // content bytes (stored: compressed size == uncompressed size)
};

class StoredZip {
 public:
  // Reads the central directory of `file`; fails naming the file and the problem when it is not a
  // zip, is damaged, or holds an entry that is not stored.
  explicit StoredZip(const MappedFile& file);

  const std::vector<ZipEntry>& entries() const { return entries_; }
  // Null when absent.
  const ZipEntry* find(std::string_view name) const;
  // The entry's bytes (already checked to lie inside the file).
  const uint8_t* data(const ZipEntry& entry) const { return file_.data() + entry.data_offset; }

 private:
  const MappedFile& file_;
  std::vector<ZipEntry> entries_;
  std::unordered_map<std::string, size_t> index_by_name_;
};

// True when the file starts with a zip local file header ("PK\3\4").
bool looks_like_zip(const MappedFile& file);

}  // namespace splitflow
