// tests/model/model_test_util.h — scratch directories and an error-message matcher for the model tests.
#pragma once

#include "core/error.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace splitflow::test {

class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "splitflow-model-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  // Writes `text` to `name` inside the directory and returns its path.
  std::string file(const std::string& name, const std::string& text) const {
    const std::string path = (path_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::string path(const std::string& name = "") const { return name.empty() ? path_.string() : (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Runs `fn` and expects a splitflow::Error whose message contains every one of `needles`.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "no error (expected '" << needles.front() << "')";
  } catch (const Error& error) {
    for (const std::string& needle : needles)
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << "'" << needle << "' not in: " << error.what();
  }
}

}  // namespace splitflow::test
