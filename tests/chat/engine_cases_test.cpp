// One Jinja feature per case, against jinja2 as transformers configures it
// (tests/fixtures/chat/engine_cases.json, written by python/make_chat_fixtures.py).
#include "chat/chat_template.h"
#include "core/error.h"

#include "chat/fixture_cases.h"

#include <gtest/gtest.h>

namespace splitflow {
namespace {

std::vector<test::NamedCase> engine_cases() {
  std::vector<test::NamedCase> cases;
  const nlohmann::ordered_json fixture = test::load_chat_fixture("engine_cases.json");
  for (const auto& c : fixture["cases"]) {
    cases.push_back({c["name"].get<std::string>(), c});
  }
  return cases;
}

class EngineCase : public testing::TestWithParam<test::NamedCase> {};

TEST_P(EngineCase, MatchesJinja2) {
  const auto& c = GetParam().data;
  const std::string source = c["template"].get<std::string>();
  if (c.contains("syntax_error_line")) {
    try {
      ChatTemplate parsed(source, "", "");
      FAIL() << "parsed without error; jinja2 says: " << c["jinja2_error"].get<std::string>();
    } catch (const Error& e) {
      std::string message = e.what();
      EXPECT_NE(message.find("syntax error"), std::string::npos) << message;
      if (!c["syntax_error_line"].is_null()) {
        EXPECT_NE(message.find(fmt::format("line {},", c["syntax_error_line"].get<int>())), std::string::npos)
            << message << "\njinja2: " << c["jinja2_error"].get<std::string>();
      }
    }
    return;
  }
  ChatTemplate chat_template(source, "", "");
  nlohmann::ordered_json messages = c.contains("messages") ? c["messages"] : nlohmann::ordered_json::array();
  const auto& variables = c["variables"];
  if (c.contains("expected")) {
    EXPECT_EQ(chat_template.render(messages, false, variables), c["expected"].get<std::string>());
    return;
  }
  try {
    std::string rendered = chat_template.render(messages, false, variables);
    FAIL() << "rendered without error: " << rendered;
  } catch (const Error& e) {
    if (c.contains("raise_exception_message")) {
      EXPECT_EQ(std::string(e.what()), c["raise_exception_message"].get<std::string>());
    } else {
      EXPECT_NE(std::string(e.what()).find(c["error_contains"].get<std::string>()), std::string::npos)
          << e.what() << "\njinja2: " << c["jinja2_error"].get<std::string>();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Jinja2, EngineCase, testing::ValuesIn(engine_cases()), test::case_name);

}  // namespace
}  // namespace splitflow
