// tests/quant/sfq_fixture.h — reads the .sfq fixtures python/gen_quant_fixtures.py writes (named
// arrays of raw little-endian bytes; the format is described at the top of that script).
#pragma once

#include "test_paths.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace splitflow::test {

class SfqFixture {
 public:
  explicit SfqFixture(const std::string& name) : path_(fixture_path("quant/" + name)) {
    const std::string bytes = read_file(path_);
    if (bytes.size() < 8 || bytes.compare(0, 4, "SFQF") != 0) throw std::runtime_error("not an .sfq fixture: " + path_);
    size_t at = 4;
    const auto take = [&](size_t n) {
      if (at + n > bytes.size()) throw std::runtime_error("truncated fixture: " + path_);
      const char* p = bytes.data() + at;
      at += n;
      return p;
    };
    uint32_t count;
    std::memcpy(&count, take(4), 4);
    for (uint32_t i = 0; i < count; ++i) {
      const auto name_len = static_cast<uint8_t>(*take(1));
      std::string array_name(take(name_len), name_len);
      take(1);  // element kind: the test knows what it reads
      uint64_t len;
      std::memcpy(&len, take(8), 8);
      const char* data = take(len);
      arrays_[array_name].assign(data, data + len);
    }
  }

  template <typename T>
  std::vector<T> get(const std::string& name) const {
    const auto it = arrays_.find(name);
    if (it == arrays_.end()) throw std::runtime_error(path_ + " has no array " + name);
    std::vector<T> out(it->second.size() / sizeof(T));
    std::memcpy(out.data(), it->second.data(), out.size() * sizeof(T));
    return out;
  }

 private:
  std::string path_;
  std::map<std::string, std::vector<char>> arrays_;
};

inline uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

}  // namespace splitflow::test
