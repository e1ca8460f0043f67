// Whole conversations through real chat templates (those in ../shared/models/*-tokenizer, read with
// ChatTemplate::from_file) and the templates written for these tests, against transformers'
// apply_chat_template (tests/fixtures/chat/conversations.json, from python/make_chat_fixtures.py).
#include "chat/chat_template.h"
#include "core/error.h"

#include "chat/fixture_cases.h"

#include <gtest/gtest.h>

namespace splitflow {
namespace {

struct ConversationCase {
  std::string name;
  std::string source;  // "shared:<path>" or "fixtures:<path>"
  std::string bos_token;
  std::string eos_token;
  nlohmann::ordered_json data;
};

void PrintTo(const ConversationCase& c, std::ostream* os) { *os << c.name; }

std::vector<ConversationCase> conversation_cases() {
  std::vector<ConversationCase> cases;
  const nlohmann::ordered_json fixture = test::load_chat_fixture("conversations.json");
  for (const auto& t : fixture["templates"]) {
    for (const auto& c : t["cases"]) {
      cases.push_back({t["name"].get<std::string>() + "_" + c["name"].get<std::string>(), t["source"].get<std::string>(),
                       t.value("bos_token", ""), t.value("eos_token", ""), c});
    }
  }
  return cases;
}

ChatTemplate load(const ConversationCase& c) {
  std::string path = c.source.substr(c.source.find(':') + 1);
  if (c.source.rfind("shared:", 0) == 0) return ChatTemplate::from_file(test::shared_path(path));
  return ChatTemplate(test::read_file(test::fixture_path("chat/" + path)), c.bos_token, c.eos_token);
}

class ConversationCaseTest : public testing::TestWithParam<ConversationCase> {};

TEST_P(ConversationCaseTest, MatchesTransformers) {
  const ConversationCase& param = GetParam();
  const auto& c = param.data;
  ChatTemplate chat_template = load(param);
  bool add_generation_prompt = c["add_generation_prompt"].get<bool>();
  if (c.contains("expected")) {
    EXPECT_EQ(chat_template.render(c["messages"], add_generation_prompt, c["extra"]), c["expected"].get<std::string>());
    return;
  }
  try {
    std::string rendered = chat_template.render(c["messages"], add_generation_prompt, c["extra"]);
    FAIL() << "rendered without error: " << rendered;
  } catch (const Error& e) {
    if (c.contains("raise_exception_message")) {
      EXPECT_EQ(std::string(e.what()), c["raise_exception_message"].get<std::string>());
    } else {
      EXPECT_NE(std::string(e.what()).find(c["error_contains"].get<std::string>()), std::string::npos)
          << e.what() << "\ntransformers: " << c["jinja2_error"].get<std::string>();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transformers, ConversationCaseTest, testing::ValuesIn(conversation_cases()),
                         [](const testing::TestParamInfo<ConversationCase>& info) { return info.param.name; });

}  // namespace
}  // namespace splitflow
