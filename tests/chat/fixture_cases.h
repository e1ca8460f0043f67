// tests/chat/fixture_cases.h — loads the jinja2-rendered expectations that
// python/make_chat_fixtures.py wrote to tests/fixtures/chat/.
#pragma once

#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace splitflow::test {

// Key order matters (tojson prints it), so fixtures are read as ordered_json.
inline nlohmann::ordered_json load_chat_fixture(const std::string& name) {
  return nlohmann::ordered_json::parse(read_file(fixture_path("chat/" + name)));
}

struct NamedCase {
  std::string name;
  nlohmann::ordered_json data;
};

inline void PrintTo(const NamedCase& c, std::ostream* os) { *os << c.name; }

inline std::string case_name(const testing::TestParamInfo<NamedCase>& info) { return info.param.name; }

}  // namespace splitflow::test
