#include "chat/tool_calls.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace splitflow {

using nlohmann::ordered_json;

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralTag = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// {"name": string, "arguments" | "parameters": object (or a JSON string of one)} -> a call.
bool to_call(const ordered_json& value, ParsedToolCall& call) {
  if (!value.is_object()) return false;
  const auto name = value.find("name");
  if (name == value.end() || !name->is_string()) return false;
  auto arguments = value.find("arguments");
  if (arguments == value.end()) arguments = value.find("parameters");
  ordered_json args = arguments == value.end() ? ordered_json::object() : *arguments;
  if (args.is_string()) {
    args = ordered_json::parse(args.get<std::string>(), nullptr, /*allow_exceptions=*/false);
  }
  if (!args.is_object()) return false;
  call.name = name->get<std::string>();
  call.arguments = args.dump();
  return true;
}

bool parse_json(std::string_view text, ordered_json& value) {
  value = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  return !value.is_discarded();
}

// Llama 3.1: one or more objects separated by ';'. Mistral: an array of objects.
bool parse_whole_reply(ToolCallFormat format, std::string_view text, std::vector<ParsedToolCall>& calls) {
  text = trim(text);
  if (text.starts_with(kPythonTag)) text = trim(text.substr(kPythonTag.size()));
  if (text.starts_with(kMistralTag)) text = trim(text.substr(kMistralTag.size()));
  std::vector<ParsedToolCall> parsed;
  ordered_json value;
  if (format == ToolCallFormat::Mistral || text.starts_with("[")) {
    if (!parse_json(text, value) || !value.is_array() || value.empty()) return false;
    for (const auto& element : value) {
      ParsedToolCall call;
      if (!to_call(element, call)) return false;
      parsed.push_back(std::move(call));
    }
  } else {
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find(';', start);
      // A ';' inside a string argument would split a call: try the longest parse first.
      std::string_view piece;
      for (;;) {
        piece = text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
        if (parse_json(trim(piece), value) || end == std::string_view::npos) break;
        end = text.find(';', end + 1);
      }
      ParsedToolCall call;
      if (!parse_json(trim(piece), value) || !to_call(value, call)) return false;
      parsed.push_back(std::move(call));
      if (end == std::string_view::npos) break;
      start = end + 1;
    }
  }
  if (parsed.empty()) return false;
  calls.insert(calls.end(), parsed.begin(), parsed.end());
  return true;
}

// The length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_marker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (marker.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

}  // namespace

std::string_view tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::Hermes: return "hermes";
    case ToolCallFormat::Llama3Json: return "llama3_json";
    case ToolCallFormat::Mistral: return "mistral";
  }
  return "hermes";
}

ToolCallFormat detect_tool_call_format(std::string_view source) {
  if (source.find(kMistralTag) != std::string_view::npos) return ToolCallFormat::Mistral;
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::Hermes;
  if (source.find("\"parameters\"") != std::string_view::npos &&
      (source.find(kPythonTag) != std::string_view::npos || source.find("ipython") != std::string_view::npos)) {
    return ToolCallFormat::Llama3Json;
  }
  return ToolCallFormat::Hermes;
}

ParsedReply parse_tool_calls(ToolCallFormat format, std::string_view text) {
  ParsedReply reply;
  ToolCallStreamParser parser(format);
  parser.push(text, reply.content, reply.calls);
  parser.finish(reply.content, reply.calls);
  return reply;
}

void ToolCallStreamParser::push(std::string_view text, std::string& content, std::vector<ParsedToolCall>& calls) {
  held_ += text;
  drain(false, content, calls);
}

void ToolCallStreamParser::finish(std::string& content, std::vector<ParsedToolCall>& calls) {
  drain(true, content, calls);
}

void ToolCallStreamParser::drain(bool final, std::string& content, std::vector<ParsedToolCall>& calls) {
  if (format_ != ToolCallFormat::Hermes) {
    // The whole reply is calls or none: decided by its first non-space characters.
    if (!seen_text_ && !whole_reply_) {
      const std::string_view start = trim(held_);
      if (start.empty()) {
        if (final) content += std::exchange(held_, {});
        return;
      }
      const bool could_be = start.starts_with("{") || start.starts_with("[") ||
                            std::string_view(kPythonTag).starts_with(start.substr(0, kPythonTag.size())) ||
                            std::string_view(kMistralTag).starts_with(start.substr(0, kMistralTag.size()));
      if (could_be) {
        whole_reply_ = true;
      } else {
        seen_text_ = true;
      }
    }
    if (whole_reply_ && !final) return;
    if (whole_reply_ && parse_whole_reply(format_, held_, calls)) {
      made_calls_ = true;
      held_.clear();
      return;
    }
    content += std::exchange(held_, {});
    return;
  }
  for (;;) {
    const size_t open = held_.find(kHermesOpen);
    if (open == std::string::npos) {
      const size_t keep = final ? 0 : partial_marker(held_, kHermesOpen);
      content += held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return;
    }
    const size_t close = held_.find(kHermesClose, open);
    if (close == std::string::npos && !final) {
      content += held_.substr(0, open);
      held_.erase(0, open);
      return;
    }
    // A complete (or, at the end, unterminated) call.
    const size_t body_end = close == std::string::npos ? held_.size() : close;
    const std::string_view body = trim(std::string_view(held_).substr(open + kHermesOpen.size(), body_end - open - kHermesOpen.size()));
    ordered_json value;
    ParsedToolCall call;
    const std::string before = held_.substr(0, open);
    if (parse_json(body, value) && to_call(value, call)) {
      // Whitespace between the text and a call (or between calls) is the calls' own.
      content += made_calls_ ? std::string(trim(before)) : std::string(before.substr(0, before.find_last_not_of(" \n\t\r") + 1));
      calls.push_back(std::move(call));
      made_calls_ = true;
    } else {
      content += held_.substr(0, close == std::string::npos ? held_.size() : close + kHermesClose.size());
    }
    held_.erase(0, close == std::string::npos ? held_.size() : close + kHermesClose.size());
    if (held_.empty()) return;
  }
}

}  // namespace splitflow
