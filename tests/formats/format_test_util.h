// tests/formats/format_test_util.h — temp dirs, whole-file byte I/O, an error-message matcher and
// an independent little-endian byte writer for building (damaged) checkpoint files in tests.
#pragma once

#include "core/error.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

namespace splitflow::test {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "splitflow-formats-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// Runs `open` and expects a splitflow::Error whose message contains every one of `parts`.
// Any other exception escapes and fails the test.
template <typename Open>
void expect_error(Open&& open, std::initializer_list<std::string_view> parts) {
  try {
    open();
    ADD_FAILURE() << "expected splitflow::Error mentioning '" << *parts.begin() << "'";
  } catch (const Error& error) {
    const std::string message = error.what();
    for (std::string_view part : parts) EXPECT_NE(message.find(part), std::string::npos) << "message: " << message << "\nmissing: " << part;
  }
}

// Appends little-endian scalars and raw bytes.
struct ByteWriter {
  std::string bytes;

  template <typename T>
  ByteWriter& put(T value) {
    char raw[sizeof(T)];
    std::memcpy(raw, &value, sizeof(T));
    bytes.append(raw, sizeof(T));
    return *this;
  }
  ByteWriter& raw(std::string_view data) {
    bytes.append(data);
    return *this;
  }
  // GGUF string: u64 length + bytes.
  ByteWriter& str(std::string_view text) {
    put<uint64_t>(text.size());
    return raw(text);
  }
  ByteWriter& pad_to(size_t alignment) {
    bytes.resize((bytes.size() + alignment - 1) / alignment * alignment, '\0');
    return *this;
  }
};

// Reads element `index` of type T from raw file bytes at `offset` (reference values straight from disk).
template <typename T>
T value_at(const std::string& bytes, size_t offset, size_t index) {
  T value;
  std::memcpy(&value, bytes.data() + offset + index * sizeof(T), sizeof(T));
  return value;
}

template <typename T>
std::string as_bytes_of(const std::vector<T>& values) {
  return {reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T)};
}

}  // namespace splitflow::test
