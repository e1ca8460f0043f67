// Tool-call parsing against the exact text the model families are taught by their templates:
// Qwen 2.5 / 3 (../shared/models/qwen3-tokenizer): "<tool_call>\n{\"name\": <function-name>,
// \"arguments\": <args-json-object>}\n</tool_call>"; Llama 3.1 / 3.2: "{\"name\":
// function name, \"parameters\": ...}" (tests/fixtures/chat/templates/llama32_style.jinja); Mistral
// (tests/fixtures/chat/templates/mistral_style.jinja): "[TOOL_CALLS][{...}]".
#include "chat/tool_calls.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace splitflow {
namespace {

TEST(ToolCalls, HermesQwenCalls) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  const ParsedReply reply = parse_tool_calls(ToolCallFormat::Hermes, text);
  ASSERT_EQ(reply.calls.size(), 2u);
  EXPECT_EQ(reply.calls[0].name, "get_weather");
  EXPECT_EQ(reply.calls[0].arguments, R"({"city":"Paris","days":2})");
  EXPECT_EQ(reply.calls[1].name, "get_time");
  EXPECT_EQ(reply.calls[1].arguments, "{}");
  EXPECT_EQ(reply.content, "Let me check.");
}

TEST(ToolCalls, HermesMalformedCallStaysContent) {
  const ParsedReply reply = parse_tool_calls(ToolCallFormat::Hermes, "<tool_call>\n{\"name\": oops}\n</tool_call>");
  EXPECT_TRUE(reply.calls.empty());
  EXPECT_EQ(reply.content, "<tool_call>\n{\"name\": oops}\n</tool_call>");
  EXPECT_TRUE(parse_tool_calls(ToolCallFormat::Hermes, "no calls here").calls.empty());
}

TEST(ToolCalls, HermesStreamingHoldsOnlyWhatCouldBeACall) {
  ToolCallStreamParser parser(ToolCallFormat::Hermes);
  std::string content;
  std::vector<ParsedToolCall> calls;
  parser.push("Sure <tool", content, calls);
  EXPECT_EQ(content, "Sure ");  // "<tool" may start a call
  parser.push("_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}", content, calls);
  EXPECT_TRUE(calls.empty());
  parser.push("\n</tool_call>", content, calls);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].arguments, R"({"a":1})");
  parser.finish(content, calls);
  EXPECT_TRUE(parser.made_calls());
}

TEST(ToolCalls, Llama31Json) {
  const ParsedReply reply = parse_tool_calls(
      ToolCallFormat::Llama3Json, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome; Italy\"}}");
  ASSERT_EQ(reply.calls.size(), 1u);
  EXPECT_EQ(reply.calls[0].name, "get_weather");
  EXPECT_EQ(reply.calls[0].arguments, R"({"city":"Rome; Italy"})");
  EXPECT_EQ(reply.content, "");
  const ParsedReply two = parse_tool_calls(ToolCallFormat::Llama3Json,
                                           "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}");
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.calls[1].name, "b");
  const ParsedReply text = parse_tool_calls(ToolCallFormat::Llama3Json, "The weather is {fine}.");
  EXPECT_TRUE(text.calls.empty());
  EXPECT_EQ(text.content, "The weather is {fine}.");
}

TEST(ToolCalls, Mistral) {
  const ParsedReply reply = parse_tool_calls(
      ToolCallFormat::Mistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]");
  ASSERT_EQ(reply.calls.size(), 1u);
  EXPECT_EQ(reply.calls[0].arguments, R"({"city":"Oslo"})");
  // [TOOL_CALLS] is a control token, dropped from decoded text: the bare array counts.
  const ParsedReply bare = parse_tool_calls(ToolCallFormat::Mistral, "[{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": {}}]");
  EXPECT_EQ(bare.calls.size(), 2u);
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ToolCalls, FormatFromTheTemplate) {
  EXPECT_EQ(detect_tool_call_format(read(std::string(SPLITFLOW_TEST_FIXTURES) + "/chat/templates/mistral_style.jinja")),
            ToolCallFormat::Mistral);
  EXPECT_EQ(detect_tool_call_format(read(std::string(SPLITFLOW_TEST_FIXTURES) + "/chat/templates/llama32_style.jinja")),
            ToolCallFormat::Llama3Json);
  const std::string qwen = read(std::string(SPLITFLOW_DEFAULT_SHARED_DIR) + "/models/qwen3-tokenizer/tokenizer_config.json");
  if (qwen.empty()) GTEST_SKIP() << "no ../shared/models/qwen3-tokenizer";
  EXPECT_EQ(detect_tool_call_format(qwen), ToolCallFormat::Hermes);
}

}  // namespace
}  // namespace splitflow
