// ChatTemplate's API: loading templates from model files, input validation, error locations,
// and the render rules that are ChatTemplate's own (content parts, key order, threads). The render
// limits are tested in template_limits_test.cpp.
// Renders compared here come from the jinja2 fixtures or are small enough to check by hand.
#include "chat/chat_template.h"
#include "core/error.h"

#include "chat/fixture_cases.h"

#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

namespace splitflow {
namespace {

namespace fs = std::filesystem;

// The message of the Error that `fn` throws, or a test failure when it does not throw one.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no splitflow::Error thrown";
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

nlohmann::ordered_json conversation_case(const std::string& template_name, const std::string& case_name) {
  const nlohmann::ordered_json fixture = test::load_chat_fixture("conversations.json");
  for (const auto& t : fixture["templates"]) {
    if (t["name"] != template_name) continue;
    for (const auto& c : t["cases"]) {
      if (c["name"] == case_name) return c;
    }
  }
  ADD_FAILURE() << "no fixture " << template_name << "/" << case_name;
  return {};
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("splitflow_chat_" + std::to_string(std::random_device{}()));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
    return path_ / name;
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

const nlohmann::json kOneUserMessage = nlohmann::json::parse(R"([{"role": "user", "content": "hi"}])");

// ---- loading

TEST(ChatTemplateLoad, ReadsSpecialTokensOfRealConfigs) {
  ChatTemplate deepseek = ChatTemplate::from_file(test::shared_path("models/deepseek_v3-tokenizer/tokenizer_config.json"));
  EXPECT_EQ(deepseek.bos_token(), "<｜begin▁of▁sentence｜>");  // an AddedToken object
  EXPECT_EQ(deepseek.eos_token(), "<｜end▁of▁sentence｜>");
  ChatTemplate qwen = ChatTemplate::from_file(test::shared_path("models/qwen3-tokenizer/tokenizer_config.json"));
  EXPECT_EQ(qwen.bos_token(), "");  // null
  EXPECT_EQ(qwen.eos_token(), "<|im_end|>");
  ChatTemplate llama = ChatTemplate::from_file(test::shared_path("models/llama3_1-tokenizer/tokenizer_config.json"));
  EXPECT_EQ(llama.bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(llama.eos_token(), "<|eot_id|>");
}

TEST(ChatTemplateLoad, ConfigWithoutTemplateIsAnError) {
  std::string path = test::shared_path("models/gpt2-tokenizer/tokenizer_config.json");
  std::string message = error_of([&] { ChatTemplate::from_file(path); });
  EXPECT_TRUE(contains(message, "has no chat_template")) << message;
  EXPECT_TRUE(contains(message, "gpt2-tokenizer")) << message;
}

TEST(ChatTemplateLoad, NamedTemplateListTakesDefault) {
  ChatTemplate chat_template = ChatTemplate::from_file(test::fixture_path("chat/named_templates/tokenizer_config.json"));
  EXPECT_EQ(chat_template.bos_token(), "<s>");
  EXPECT_EQ(chat_template.eos_token(), "</s>");
  EXPECT_EQ(chat_template.source(), test::read_file(test::fixture_path("chat/templates/llama2_style.jinja")));
  auto c = conversation_case("llama2_style", "system_multi_turn");
  EXPECT_EQ(chat_template.render(c["messages"], false), c["expected"].get<std::string>());
}

TEST(ChatTemplateLoad, JinjaFileHasNoSpecialTokens) {
  ChatTemplate chat_template = ChatTemplate::from_file(test::fixture_path("chat/templates/llama2_style.jinja"));
  EXPECT_EQ(chat_template.bos_token(), "");
  EXPECT_EQ(chat_template.render(kOneUserMessage, true), "[INST] hi [/INST]");
}

TEST(ChatTemplateLoad, BadConfigsNameTheProblem) {
  TempDir dir;
  auto no_default = dir.write("a.json", R"({"chat_template": [{"name": "tool_use", "template": "x"}]})");
  EXPECT_TRUE(contains(error_of([&] { ChatTemplate::from_file(no_default); }), "no template named 'default'"));
  auto bad_entry = dir.write("b.json", R"({"chat_template": [{"name": "default"}]})");
  EXPECT_TRUE(contains(error_of([&] { ChatTemplate::from_file(bad_entry); }), "string 'name' and 'template'"));
  auto wrong_type = dir.write("c.json", R"({"chat_template": 3})");
  EXPECT_TRUE(contains(error_of([&] { ChatTemplate::from_file(wrong_type); }), "must be a string or a list"));
  auto not_json = dir.write("d.json", "{nope");
  EXPECT_TRUE(contains(error_of([&] { ChatTemplate::from_file(not_json); }), "is not valid JSON"));
  auto bad_token = dir.write("e.json", R"({"chat_template": "x", "bos_token": 5})");
  EXPECT_TRUE(contains(error_of([&] { ChatTemplate::from_file(bad_token); }), "'bos_token' must be a string"));
  auto not_object = dir.write("f.json", "[1]");
  EXPECT_TRUE(contains(error_of([&] { ChatTemplate::from_file(not_object); }), "must hold a JSON object"));
  auto bad_syntax = dir.write("g.json", R"({"chat_template": "{% if %}"})");
  std::string message = error_of([&] { ChatTemplate::from_file(bad_syntax); });
  EXPECT_TRUE(contains(message, "g.json") && contains(message, "syntax error")) << message;
  EXPECT_TRUE(contains(error_of([&] { ChatTemplate::from_file(dir.path() / "missing.jinja"); }), "cannot open"));
}

TEST(ChatTemplateLoad, FindForModelUsesTransformersOrder) {
  auto qwen = ChatTemplate::find_for_model(test::shared_path("models/qwen3-tokenizer"));
  ASSERT_TRUE(qwen.has_value());
  auto config = nlohmann::json::parse(test::read_file(test::shared_path("models/qwen3-tokenizer/tokenizer_config.json")));
  EXPECT_EQ(qwen->source(), config["chat_template"].get<std::string>());
  // A file path means its directory.
  auto by_file = ChatTemplate::find_for_model(test::shared_path("models/qwen3-tokenizer/tokenizer.json"));
  ASSERT_TRUE(by_file.has_value());
  EXPECT_EQ(by_file->source(), qwen->source());
  EXPECT_FALSE(ChatTemplate::find_for_model(test::shared_path("models/gpt2-tokenizer")).has_value());
  EXPECT_FALSE(ChatTemplate::find_for_model(test::shared_path("models/stories260K")).has_value());

  TempDir dir;
  dir.write("tokenizer_config.json", R"({"chat_template": "from config", "bos_token": {"content": "<B>"}, "eos_token": "<E>"})");
  EXPECT_EQ(ChatTemplate::find_for_model(dir.path())->render(kOneUserMessage, false), "from config");
  dir.write("chat_template.json", R"({"chat_template": "from chat_template.json {{ bos_token }}"})");
  EXPECT_EQ(ChatTemplate::find_for_model(dir.path())->render(kOneUserMessage, false), "from chat_template.json <B>");
  dir.write("chat_template.jinja", "from jinja {{ eos_token }}\n");
  auto found = ChatTemplate::find_for_model(dir.path());
  EXPECT_EQ(found->render(kOneUserMessage, false), "from jinja <E>");
  EXPECT_EQ(found->bos_token(), "<B>");
}

TEST(ChatTemplateLoad, GgufMetadataTemplate) {
  auto found = ChatTemplate::find_for_model(test::fixture_path("chat/gguf/model.gguf"));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->bos_token(), "<s>");
  EXPECT_EQ(found->eos_token(), "</s>");
  auto c = conversation_case("llama2_style", "system_multi_turn");
  EXPECT_EQ(found->render(c["messages"], false), c["expected"].get<std::string>());
  EXPECT_FALSE(ChatTemplate::find_for_model(test::shared_path("models/stories260K-gguf/stories260K.gguf")).has_value());
}

TEST(ChatTemplateLoad, SpecialTokensMapFillsMissingTokens) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"eos_token": "<E>"})");
  dir.write("special_tokens_map.json", R"({"bos_token": {"content": "<B>"}, "eos_token": "<other>"})");
  dir.write("chat_template.jinja", "{{ bos_token }}|{{ eos_token }}");
  EXPECT_EQ(ChatTemplate::find_for_model(dir.path())->render(kOneUserMessage, false), "<B>|<E>");
}

// ---- render inputs

TEST(ChatTemplateRender, RejectsMalformedInput) {
  ChatTemplate chat_template("{{ messages|length }}", "", "");
  EXPECT_TRUE(contains(error_of([&] { chat_template.render(nlohmann::json::object(), false); }), "must be an array"));
  EXPECT_TRUE(contains(error_of([&] { chat_template.render(nlohmann::json::parse("[1]"), false); }),
                       "messages[0]: a message must be a JSON object"));
  auto image = nlohmann::json::parse(
      R"([{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text", "text": "x"},
          {"type": "image_url", "image_url": {"url": "u"}}]}])");
  EXPECT_TRUE(contains(error_of([&] { chat_template.render(image, false); }),
                       "messages[1].content[1]: content part type 'image_url' is not supported"));
  auto untyped = nlohmann::json::parse(R"([{"role": "user", "content": [{"text": "x"}]}])");
  EXPECT_TRUE(contains(error_of([&] { chat_template.render(untyped, false); }), "string 'type'"));
  auto textless = nlohmann::json::parse(R"([{"role": "user", "content": [{"type": "text"}]}])");
  EXPECT_TRUE(contains(error_of([&] { chat_template.render(textless, false); }), "needs a string 'text'"));
  EXPECT_TRUE(contains(error_of([&] { chat_template.render(kOneUserMessage, false, nlohmann::json::array()); }),
                       "must be a JSON object"));
  EXPECT_TRUE(contains(
      error_of([&] { chat_template.render(kOneUserMessage, false, nlohmann::json{{"add_generation_prompt", true}}); }),
      "'add_generation_prompt' cannot be passed"));
}

TEST(ChatTemplateRender, TextPartsJoinUnlessTheTemplateIteratesContent) {
  auto parts = nlohmann::json::parse(R"([{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                      {"type": "text", "text": "b"}]}])");
  EXPECT_EQ(ChatTemplate("{{ messages[0].content }}", "", "").render(parts, false), "a\nb");
  ChatTemplate iterating("{% for p in messages[0]['content'] %}[{{ p.text }}]{% endfor %}", "", "");
  EXPECT_EQ(iterating.render(parts, false), "[a][b]");
}

TEST(ChatTemplateRender, OrderedJsonKeepsKeyOrderForTojson) {
  ChatTemplate chat_template("{{ tools|tojson }}", "", "");
  const char* tools = R"({"tools": [{"type": "function", "function": {"name": "f"}}]})";
  EXPECT_EQ(chat_template.render(nlohmann::ordered_json::array(), false, nlohmann::ordered_json::parse(tools)),
            R"([{"type": "function", "function": {"name": "f"}}])");
  // nlohmann::json sorts object keys.
  EXPECT_EQ(chat_template.render(nlohmann::json::array(), false, nlohmann::json::parse(tools)),
            R"([{"function": {"name": "f"}, "type": "function"}])");
}

TEST(ChatTemplateRender, DefaultVariablesLikeTransformers) {
  ChatTemplate with_tokens("{{ tools is none }} {{ documents is none }} {{ bos_token }} {{ add_generation_prompt }}",
                           "<s>", "</s>");
  EXPECT_EQ(with_tokens.render(kOneUserMessage, true), "True True <s> True");
  ChatTemplate no_tokens("{{ bos_token is defined }} {{ eos_token is defined }}", "", "");
  EXPECT_EQ(no_tokens.render(kOneUserMessage, false), "False False");
  ChatTemplate overridden("{{ bos_token }}", "<s>", "");
  EXPECT_EQ(overridden.render(kOneUserMessage, false, nlohmann::json{{"bos_token", "<x>"}}), "<x>");
}

TEST(ChatTemplateRender, CopiesShareTheParsedTemplate) {
  ChatTemplate original("{{ messages[0].content }}!", "", "");
  ChatTemplate copy = original;
  EXPECT_EQ(copy.render(kOneUserMessage, false), "hi!");
  EXPECT_EQ(copy.source(), original.source());
}

TEST(ChatTemplateRender, ConcurrentRendersAgree) {
  ChatTemplate chat_template = ChatTemplate::from_file(test::fixture_path("chat/templates/tool_macros.jinja"));
  auto c = conversation_case("tool_macros", "tools_and_calls");
  std::string expected = ChatTemplate(chat_template.source(), "<bos>", "<eos>").render(c["messages"], true, c["extra"]);
  EXPECT_EQ(expected, c["expected"].get<std::string>());
  ChatTemplate shared(chat_template.source(), "<bos>", "<eos>");
  std::vector<std::string> results(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 20; ++k) results[i] = shared.render(c["messages"], true, c["extra"]);
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) EXPECT_EQ(result, expected);
}

TEST(ChatTemplateRender, StrftimeNowUsesLocalTime) {
  ChatTemplate chat_template("{{ strftime_now('%Y-%m-%d') }}", "", "");
  auto today = [] {
    std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buffer[32];
    std::strftime(buffer, sizeof(buffer), "%Y-%m-%d", &local);
    return std::string(buffer);
  };
  std::string before = today();
  std::string rendered = chat_template.render(kOneUserMessage, false);
  std::string after = today();
  EXPECT_TRUE(rendered == before || rendered == after) << rendered;
}

// ---- errors

TEST(ChatTemplateErrors, SyntaxErrorsNameLineAndColumn) {
  auto message = [](const std::string& source) { return error_of([&] { ChatTemplate(source, "", ""); }); };
  EXPECT_TRUE(contains(message("ok\n{% if %}{% endif %}"),
                       "syntax error at line 2, column 7: expected an expression, got 'end of statement block'"));
  EXPECT_TRUE(contains(message("{{ 'abc }}"), "line 1, column 4: unexpected char \"'\""));
  EXPECT_TRUE(contains(message("x\n  {{ y | nope }}"), "line 2, column 10: No filter named 'nope'."));
  EXPECT_TRUE(contains(message("{{ y is nope }}"), "line 1, column 6: No test named 'nope'."));
  EXPECT_TRUE(contains(message("a\n\n{% for x in y %}\n"), "line 3, column 17: unexpected end of template"));
  EXPECT_TRUE(contains(message("{% endif %}"), "line 1, column 4: encountered unknown tag 'endif'"));
  EXPECT_TRUE(contains(message("{% include 'x' %}"), "the 'include' tag is not supported"));
  EXPECT_TRUE(contains(message("{% for x in y recursive %}{% endfor %}"), "recursive for loops are not supported"));
  EXPECT_TRUE(contains(message("{{ f(*args) }}"), "*args and **kwargs in calls are not supported"));
  EXPECT_TRUE(contains(message("{% break %}"), "'break' outside of a loop"));
  EXPECT_TRUE(contains(message("{% set 1 = 2 %}"), "can't assign to"));
  EXPECT_TRUE(contains(message("{{ '\\x4' }}"), "truncated \\xXX escape"));
  EXPECT_TRUE(contains(message("{{ 99999999999999999999 }}"), "integer literal too large"));
  EXPECT_TRUE(contains(message("{% raw %}never closed"), "Missing end of raw directive"));
}

TEST(ChatTemplateErrors, RuntimeErrorsNameLineAndColumn) {
  ChatTemplate chat_template("a\n{{ 1 + 'x' }}", "", "");
  std::string message = error_of([&] { chat_template.render(kOneUserMessage, false); });
  EXPECT_TRUE(contains(message, "chat template error at line 2, column 6: unsupported operand type(s) for +")) << message;
  ChatTemplate undefined("{% for m in messages %}\n  {{ m.missing.deeper }}{% endfor %}", "", "");
  message = error_of([&] { undefined.render(kOneUserMessage, false); });
  EXPECT_TRUE(contains(message, "line 2, column 15: 'dict object' has no attribute 'missing'")) << message;
}

TEST(ChatTemplateErrors, RaiseExceptionMessageIsPassedUnchanged) {
  ChatTemplate chat_template("{% if messages|length > 0 %}{{ raise_exception('No ' ~ messages[0].role ~ ' allowed') }}{% endif %}",
                             "", "");
  EXPECT_EQ(error_of([&] { chat_template.render(kOneUserMessage, false); }), "No user allowed");
}

TEST(ChatTemplateErrors, DeepNestingIsRefusedNotCrashed) {
  std::string parens = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_TRUE(contains(error_of([&] { ChatTemplate(parens, "", ""); }), "nested too deeply"));
  std::string nots = "{{ " + [] {
    std::string s;
    for (int i = 0; i < 5000; ++i) s += "not ";
    return s;
  }() + "1 }}";
  EXPECT_TRUE(contains(error_of([&] { ChatTemplate(nots, "", ""); }), "nested too deeply"));
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  for (int i = 0; i < 1000; ++i) ifs += "{% endif %}";
  EXPECT_TRUE(contains(error_of([&] { ChatTemplate(ifs, "", ""); }), "nested too deeply"));
}

// Hostile or malformed input never crashes: every template either renders or throws Error.
TEST(ChatTemplateErrors, RealTemplatesSurviveOddMessagesAndTruncation) {
  std::vector<std::string> sources;
  for (const char* model : {"qwen3", "llama3_1", "deepseek_v3"}) {
    auto config = nlohmann::json::parse(
        test::read_file(test::shared_path(std::string("models/") + model + "-tokenizer/tokenizer_config.json")));
    sources.push_back(config["chat_template"].get<std::string>());
  }
  for (const char* name : {"llama2_style", "tool_macros", "mistral_style", "llama32_style", "chatml_generation"}) {
    sources.push_back(test::read_file(test::fixture_path(std::string("chat/templates/") + name + ".jinja")));
  }
  const char* odd_messages[] = {
      R"([])",
      R"([{}])",
      R"([{"role": 1, "content": 2}])",
      R"([{"role": "user", "content": {"nested": [1, 2]}}])",
      R"([{"role": "assistant", "tool_calls": "not a list"}])",
      R"([{"role": "assistant", "content": null, "tool_calls": [{"function": null}]}])",
      R"([{"role": "tool"}, {"role": "system", "content": ""}, {"role": "user", "content": "\u0000"}])",
  };
  std::mt19937 rng(7);
  for (const auto& source : sources) {
    ChatTemplate chat_template(source, "<s>", "</s>");
    for (const char* messages : odd_messages) {
      for (bool prompt : {false, true}) {
        try {
          chat_template.render(nlohmann::json::parse(messages), prompt,
                               nlohmann::json{{"tools", nlohmann::json::array({1, "x"})}});
        } catch (const Error&) {
        }
      }
    }
    for (int trial = 0; trial < 200; ++trial) {
      size_t cut = std::uniform_int_distribution<size_t>(0, source.size())(rng);
      try {
        ChatTemplate(source.substr(0, cut), "", "").render(kOneUserMessage, true);
      } catch (const Error&) {
      }
    }
  }
}

}  // namespace
}  // namespace splitflow
