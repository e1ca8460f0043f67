// tests/test_paths.h — where tests find fixtures, ../shared and the splitflow binary.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace splitflow::test {

// ../shared (models, tokenizer vectors, data); SPLITFLOW_SHARED_DIR overrides the build default.
inline std::string shared_dir() {
  if (const char* env = std::getenv("SPLITFLOW_SHARED_DIR")) return env;
  return SPLITFLOW_DEFAULT_SHARED_DIR;
}
inline std::string shared_path(const std::string& relative) { return shared_dir() + "/" + relative; }
// tests/fixtures; SPLITFLOW_TEST_FIXTURES_DIR overrides the build's path (a test binary built on
// another machine and run from another checkout: scripts/carry_prebuilt.sh).
inline std::string fixture_path(const std::string& relative) {
  if (const char* env = std::getenv("SPLITFLOW_TEST_FIXTURES_DIR")) return std::string(env) + "/" + relative;
  return std::string(SPLITFLOW_TEST_FIXTURES) + "/" + relative;
}
inline std::string splitflow_binary() { return SPLITFLOW_BINARY; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace splitflow::test
