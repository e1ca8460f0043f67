// Stored-entry zip reader for PyTorch checkpoints. Layout (PKWARE APPNOTE 6.3): local headers with
// the entry bytes, then the central directory, then (zip64) the end-of-central-directory record and
// its locator, then the classic end record. torch.save always writes the zip64 records and puts the
// sizes only in the central directory (flag bit 3), so the central directory is what is trusted;
// a local header gives only where the bytes begin.
#include "formats/torch_zip.h"

#include "core/error.h"

#include <cstring>
#include <limits>

namespace splitflow {
namespace {

constexpr uint32_t kLocalHeaderSignature = 0x04034b50;
constexpr uint32_t kCentralHeaderSignature = 0x02014b50;
constexpr uint32_t kEndSignature = 0x06054b50;
constexpr uint32_t kZip64EndSignature = 0x06064b50;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint64_t kLocalHeaderBytes = 30, kCentralHeaderBytes = 46, kEndBytes = 22, kZip64EndBytes = 56,
                   kZip64LocatorBytes = 20;

// Little-endian fields at absolute offsets, each checked against the file size first.
class FieldReader {
 public:
  explicit FieldReader(const MappedFile& file) : file_(file) {}

  template <typename T>
  T at(uint64_t offset, std::string_view what) const {
    if (offset > file_.size() || sizeof(T) > file_.size() - offset)
      fail("'{}': truncated or corrupt zip: {} at offset {} lies past the end of the {}-byte file", file_.path(), what,
           offset, file_.size());
    T value;
    std::memcpy(&value, file_.data() + offset, sizeof(T));
    return value;
  }
  void require(uint64_t offset, uint64_t count, std::string_view what) const {
    if (offset > file_.size() || count > file_.size() - offset)
      fail("'{}': truncated or corrupt zip: {} ({} bytes at offset {}) lies past the end of the {}-byte file",
           file_.path(), what, count, offset, file_.size());
  }
  std::string_view text(uint64_t offset, uint64_t count, std::string_view what) const {
    require(offset, count, what);
    return {reinterpret_cast<const char*>(file_.data() + offset), static_cast<size_t>(count)};
  }

 private:
  const MappedFile& file_;
};

struct CentralDirectory {
  uint64_t offset, bytes, entries;
};

// The end record is the last 22 bytes plus a comment of up to 65535 bytes; the last candidate
// whose comment length reaches exactly the end of the file is it.
uint64_t find_end_record(const MappedFile& file, const FieldReader& read) {
  const uint64_t size = file.size();
  SF_CHECK(size >= kEndBytes, "'{}': {} bytes is too small for a zip file (its end record alone takes 22)", file.path(),
           size);
  const uint64_t lowest = size - kEndBytes > 65535 ? size - kEndBytes - 65535 : 0;
  for (uint64_t position = size - kEndBytes + 1; position-- > lowest;) {
    if (read.at<uint32_t>(position, "end record signature") != kEndSignature) continue;
    if (position + kEndBytes + read.at<uint16_t>(position + 20, "end record comment length") == size) return position;
  }
  fail("'{}': not a zip file, or truncated: no end-of-central-directory record in its last {} bytes", file.path(),
       size - lowest);
}

CentralDirectory read_central_directory_location(const MappedFile& file, const FieldReader& read) {
  const uint64_t end = find_end_record(file, read);
  SF_CHECK(read.at<uint16_t>(end + 4, "end record disk") == 0 && read.at<uint16_t>(end + 6, "end record disk") == 0,
           "'{}': multi-volume zip archives are not supported", file.path());
  CentralDirectory directory{read.at<uint32_t>(end + 16, "central directory offset"),
                             read.at<uint32_t>(end + 12, "central directory size"),
                             read.at<uint16_t>(end + 10, "entry count")};
  if (end >= kZip64LocatorBytes &&
      read.at<uint32_t>(end - kZip64LocatorBytes, "zip64 locator signature") == kZip64LocatorSignature) {
    const uint64_t zip64_end = read.at<uint64_t>(end - kZip64LocatorBytes + 8, "zip64 end record offset");
    SF_CHECK(zip64_end <= end - kZip64LocatorBytes && end - kZip64LocatorBytes - zip64_end >= kZip64EndBytes,
             "'{}': corrupt zip: the zip64 end record offset {} does not lie before its locator at {}", file.path(),
             zip64_end, end - kZip64LocatorBytes);
    SF_CHECK(read.at<uint32_t>(zip64_end, "zip64 end record signature") == kZip64EndSignature,
             "'{}': corrupt zip: no zip64 end record at offset {}", file.path(), zip64_end);
    SF_CHECK(read.at<uint32_t>(zip64_end + 16, "zip64 disk") == 0 && read.at<uint32_t>(zip64_end + 20, "zip64 disk") == 0,
             "'{}': multi-volume zip archives are not supported", file.path());
    directory = {read.at<uint64_t>(zip64_end + 48, "zip64 central directory offset"),
                 read.at<uint64_t>(zip64_end + 40, "zip64 central directory size"),
                 read.at<uint64_t>(zip64_end + 32, "zip64 entry count")};
    SF_CHECK(directory.offset <= zip64_end && directory.bytes <= zip64_end - directory.offset,
             "'{}': corrupt zip: central directory [{}, +{}) overlaps the end records at {}", file.path(),
             directory.offset, directory.bytes, zip64_end);
  } else {
    SF_CHECK(directory.offset <= end && directory.bytes <= end - directory.offset,
             "'{}': corrupt zip: central directory [{}, +{}) overlaps the end record at {}", file.path(),
             directory.offset, directory.bytes, end);
  }
  SF_CHECK(directory.entries <= directory.bytes / kCentralHeaderBytes,
           "'{}': corrupt zip: {} entries cannot fit a {}-byte central directory", file.path(), directory.entries,
           directory.bytes);
  return directory;
}

// Replaces the 32-bit fields saturated at 0xFFFFFFFF with the zip64 extra field's 64-bit values,
// which appear in the order uncompressed size, compressed size, local header offset.
void apply_zip64_extra(const MappedFile& file, const FieldReader& read, uint64_t extra, uint64_t extra_bytes,
                       const std::string& name, uint64_t& uncompressed, uint64_t& compressed, uint64_t& local_offset) {
  constexpr uint64_t kSaturated = 0xFFFFFFFF;
  if (uncompressed != kSaturated && compressed != kSaturated && local_offset != kSaturated) return;
  for (uint64_t position = extra; position + 4 <= extra + extra_bytes;) {
    const auto id = read.at<uint16_t>(position, "extra field id");
    const uint64_t bytes = read.at<uint16_t>(position + 2, "extra field size");
    SF_CHECK(position + 4 + bytes <= extra + extra_bytes, "'{}': corrupt zip: entry '{}': extra field overruns its header",
             file.path(), name);
    if (id == kZip64ExtraId) {
      uint64_t field = position + 4;
      for (uint64_t* value : {&uncompressed, &compressed, &local_offset}) {
        if (*value != kSaturated) continue;
        SF_CHECK(field + 8 <= position + 4 + bytes, "'{}': corrupt zip: entry '{}': zip64 extra field is too short",
                 file.path(), name);
        *value = read.at<uint64_t>(field, "zip64 extra value");
        field += 8;
      }
      return;
    }
    position += 4 + bytes;
  }
  fail("'{}': corrupt zip: entry '{}' has saturated 32-bit sizes but no zip64 extra field", file.path(), name);
}

}  // namespace

bool looks_like_zip(const MappedFile& file) {
  uint32_t signature = 0;
  if (file.size() >= 4) std::memcpy(&signature, file.data(), 4);
  return signature == kLocalHeaderSignature;
}

StoredZip::StoredZip(const MappedFile& file) : file_(file) {
  const FieldReader read(file);
  const CentralDirectory directory = read_central_directory_location(file, read);
  uint64_t position = directory.offset;
  const uint64_t directory_end = directory.offset + directory.bytes;
  for (uint64_t index = 0; index < directory.entries; ++index) {
    SF_CHECK(directory_end - position >= kCentralHeaderBytes,
             "'{}': corrupt zip: central directory entry {} runs past the directory's end", file.path(), index);
    SF_CHECK(read.at<uint32_t>(position, "central header signature") == kCentralHeaderSignature,
             "'{}': corrupt zip: no central directory header at offset {} (entry {})", file.path(), position, index);
    const auto flags = read.at<uint16_t>(position + 8, "entry flags");
    const auto method = read.at<uint16_t>(position + 10, "entry method");
    uint64_t compressed = read.at<uint32_t>(position + 20, "entry compressed size");
    uint64_t uncompressed = read.at<uint32_t>(position + 24, "entry size");
    const uint64_t name_bytes = read.at<uint16_t>(position + 28, "entry name length");
    const uint64_t extra_bytes = read.at<uint16_t>(position + 30, "entry extra length");
    const uint64_t comment_bytes = read.at<uint16_t>(position + 32, "entry comment length");
    uint64_t local_offset = read.at<uint32_t>(position + 42, "entry local header offset");
    const uint64_t header_bytes = kCentralHeaderBytes + name_bytes + extra_bytes + comment_bytes;
    SF_CHECK(header_bytes <= directory_end - position,
             "'{}': corrupt zip: central directory entry {} runs past the directory's end", file.path(), index);
    std::string name(read.text(position + kCentralHeaderBytes, name_bytes, "entry name"));
    apply_zip64_extra(file, read, position + kCentralHeaderBytes + name_bytes, extra_bytes, name, uncompressed,
                      compressed, local_offset);

    SF_CHECK((flags & 1) == 0, "'{}': zip entry '{}' is encrypted; PyTorch checkpoints never are", file.path(), name);
    SF_CHECK(method == 0,
             "'{}': zip entry '{}' is compressed (method {}); splitflow reads only stored entries, which is how "
             "torch.save writes them (re-save the checkpoint with torch.save)",
             file.path(), name, method);
    SF_CHECK(compressed == uncompressed, "'{}': corrupt zip: stored entry '{}' has compressed size {} != size {}",
             file.path(), name, compressed, uncompressed);
    SF_CHECK(index_by_name_.emplace(name, entries_.size()).second, "'{}': corrupt zip: entry '{}' appears twice",
             file.path(), name);

    SF_CHECK(read.at<uint32_t>(local_offset, "local header signature") == kLocalHeaderSignature,
             "'{}': corrupt zip: entry '{}': no local header at offset {}", file.path(), name, local_offset);
    const uint64_t local_name_bytes = read.at<uint16_t>(local_offset + 26, "local name length");
    const uint64_t local_extra_bytes = read.at<uint16_t>(local_offset + 28, "local extra length");
    SF_CHECK(read.text(local_offset + kLocalHeaderBytes, local_name_bytes, "local entry name") == name,
             "'{}': corrupt zip: entry '{}': the local header names another entry", file.path(), name);
    const uint64_t data_offset = local_offset + kLocalHeaderBytes + local_name_bytes + local_extra_bytes;
    SF_CHECK(data_offset <= directory.offset && uncompressed <= directory.offset - data_offset,
             "'{}': corrupt zip: entry '{}' ({} bytes at offset {}) runs into the central directory at {}", file.path(),
             name, uncompressed, data_offset, directory.offset);
    entries_.push_back({std::move(name), data_offset, uncompressed});
    position += header_bytes;
  }
}

const ZipEntry* StoredZip::find(std::string_view name) const {
  const auto it = index_by_name_.find(std::string(name));
  return it == index_by_name_.end() ? nullptr : &entries_[it->second];
}

}  // namespace splitflow
