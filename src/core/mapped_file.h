// core/mapped_file.h — read-only memory map of a whole file. Checkpoint tensors are views into it,
// so a 15 GB safetensors file costs no copy until a backend converts or uploads the weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace splitflow {

class MappedFile {
 public:
  // Throws splitflow::Error naming the path when it is missing, unreadable or a directory.
  static std::shared_ptr<const MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size) : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

// Asks the kernel to reclaim the whole pages inside [data, data + bytes) (MADV_PAGEOUT): a page of
// a mapped file leaves the resident set, read again from the file if ever touched; an anonymous
// page is kept (or swapped), so this is safe on any memory. For checkpoint bytes the process has
// copied (fused matrices, repacked rows) and will rarely read again. Best effort: kernels before
// 5.4 ignore it.
void release_resident_pages(const void* data, size_t bytes);

// Reads a whole (small) file into a string; errors name the path.
std::string read_text_file(const std::string& path);

}  // namespace splitflow
