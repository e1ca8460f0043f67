// fuzz/fuzz_chat_template.cpp — the input as a chat template: parsed, then rendered with a fixed
// conversation (system, user, assistant, user) with the generation prompt, and a tool round trip
// with tools given.
#include "chat/chat_template.h"
#include "fuzz_support.h"

namespace {

// What most templates expect: an optional system message, then user and assistant in turn.
const nlohmann::ordered_json& plain_messages() {
  static const auto value = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi <b>there</b> \u00e9\u4e2d"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": [{"type": "text", "text": "and"}, {"type": "text", "text": "more?"}]}
  ])");
  return value;
}

// A tool round trip: a call without content, its result, a follow-up.
const nlohmann::ordered_json& tool_messages() {
  static const auto value = nlohmann::ordered_json::parse(R"([
    {"role": "user", "content": "Add 1 and 2.5"},
    {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "id": "call_1",
      "function": {"name": "add", "arguments": {"a": 1, "b": 2.5}}}]},
    {"role": "tool", "content": "3.5", "tool_call_id": "call_1"},
    {"role": "user", "content": "thanks"}
  ])");
  return value;
}

const nlohmann::ordered_json& extra() {
  static const auto value = nlohmann::ordered_json::parse(R"({
    "tools": [{"type": "function", "function": {"name": "add", "description": "Adds.",
      "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}],
    "enable_thinking": false
  })");
  return value;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace splitflow;
  fuzz::expect_error_or_success([&] {
    const ChatTemplate chat_template(std::string(reinterpret_cast<const char*>(data), size), "<s>", "</s>");
    fuzz::expect_error_or_success([&] { (void)chat_template.render(plain_messages(), true); });
    fuzz::expect_error_or_success([&] { (void)chat_template.render(tool_messages(), false, extra()); });
  });
  return 0;
}
