// chat/tool_calls.h — the tool calls of a model's reply, in the formats the common chat
// templates teach (the format is found in the template's source):
//   Hermes / Qwen 2.5+:  <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> (repeated)
//   Llama 3.1 / 3.2:     {"name": ..., "parameters": {...}} (the whole reply, after an optional
//                        <|python_tag|>; several separated by ';')
//   Mistral:             [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] ([TOOL_CALLS] is a
//                        control token, absent from decoded text, so a bare array counts too)
// Text, not tokens: the module never tokenizes. A reply that does not parse as calls is content.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace splitflow {

enum class ToolCallFormat : uint8_t { Hermes, Llama3Json, Mistral };

std::string_view tool_call_format_name(ToolCallFormat format);
// From a chat template's source: Mistral ([TOOL_CALLS]), Hermes (<tool_call>), Llama 3.1
// ("parameters" and <|python_tag|> or ipython); Hermes when none is recognised.
ToolCallFormat detect_tool_call_format(std::string_view chat_template_source);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON object as text (compact)
};

struct ParsedReply {
  std::string content;                 // the text outside the calls (trimmed of the calls' whitespace)
  std::vector<ParsedToolCall> calls;  // in order
};

ParsedReply parse_tool_calls(ToolCallFormat format, std::string_view text);

// Streams a reply: text that cannot be part of a call is released as content at once; the rest is
// held until it is a complete call (released as such) or cannot be one (released as content).
class ToolCallStreamParser {
 public:
  explicit ToolCallStreamParser(ToolCallFormat format) : format_(format) {}
  // New text of the reply; appends releasable content and completed calls.
  void push(std::string_view text, std::string& content, std::vector<ParsedToolCall>& calls);
  // The reply ended: everything held is resolved.
  void finish(std::string& content, std::vector<ParsedToolCall>& calls);
  bool made_calls() const { return made_calls_; }

 private:
  void drain(bool final, std::string& content, std::vector<ParsedToolCall>& calls);

  ToolCallFormat format_;
  std::string held_;  // text not yet released
  bool seen_text_ = false;   // some non-whitespace content was released (Llama/Mistral: not a call reply)
  bool whole_reply_ = false;  // Llama/Mistral: the reply looks like calls; held to the end
  bool made_calls_ = false;
};

}  // namespace splitflow
