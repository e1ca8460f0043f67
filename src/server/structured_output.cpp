#include "server/structured_output.h"

#include "grammar/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

namespace splitflow {

using nlohmann::json;
using nlohmann::ordered_json;

void compile_constraint(grammar::ConstraintCache& cache, GenerationRequest& request, const std::string& body) {
  if (!request.constraint) return;
  if (request.constraint->kind == grammar::ConstraintKind::JsonSchema) {
    // parse_json_body sorted the keys; properties are written in the client's order.
    const ordered_json ordered = ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
    // The field's path: "response_format.json_schema.schema", or a top-level extension field.
    const ordered_json* schema = &ordered;
    const std::string& param = request.constraint->param;
    for (size_t start = 0; schema && start <= param.size();) {
      const size_t end = std::min(param.find('.', start), param.size());
      const std::string key = param.substr(start, end - start);
      schema = schema->is_object() && schema->contains(key) ? &(*schema)[key] : nullptr;
      start = end + 1;
    }
    if (schema && schema->is_string()) {
      const ordered_json parsed = ordered_json::parse(schema->get<std::string>(), nullptr, false);
      if (!parsed.is_discarded()) request.constraint->text = parsed.dump();
    } else if (schema && !schema->is_discarded()) {
      request.constraint->text = schema->dump();
    }
  }
  try {
    request.params.constraint = cache.get(request.constraint->kind, request.constraint->text);
  } catch (const grammar::GrammarError& e) {
    throw ApiError(400, fmt::format("'{}': {}", request.constraint->param, e.what()), request.constraint->param);
  } catch (const json::exception& e) {
    throw ApiError(400, fmt::format("'{}': {}", request.constraint->param, e.what()), request.constraint->param);
  }
}

std::string tool_call_gbnf(ToolCallFormat format, const ordered_json& tools, const std::string& only_name, bool parallel) {
  grammar::JsonSchemaGbnf schemas;
  std::string calls;
  const char* arguments_key = format == ToolCallFormat::Llama3Json ? "parameters" : "arguments";
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& function = tools[i]["function"];
    const std::string name = function["name"].get<std::string>();
    if (!only_name.empty() && name != only_name) continue;
    const ordered_json parameters = function.contains("parameters") && function["parameters"].is_object()
                                        ? function["parameters"]
                                        : ordered_json{{"type", "object"}};
    std::string arguments;
    try {
      arguments = schemas.add(parameters, fmt::format("t{}-", i));
    } catch (const grammar::GrammarError& e) {
      throw grammar::GrammarError(fmt::format("tools[{}].function.parameters: {}", i, e.what()));
    }
    // {"name": "NAME", "arguments": {...}} with the name as a GBNF literal of its JSON string.
    std::string literal;
    for (const char c : json(name).dump()) {
      if (c == '"' || c == '\\') literal += '\\';
      literal += c;
    }
    calls += fmt::format("{}\"{{\" ws \"\\\"name\\\"\" ws \":\" ws \"{}\" ws \",\" ws \"\\\"{}\\\"\" ws \":\" ws {} ws \"}}\"",
                         calls.empty() ? "" : " | ", literal, arguments_key, arguments);
  }
  std::string root;
  switch (format) {
    case ToolCallFormat::Hermes:
      root = parallel ? R"(root ::= call-block ( "\n" call-block )*)" : "root ::= call-block";
      root += "\ncall-block ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"";
      break;
    case ToolCallFormat::Llama3Json: root = parallel ? R"(root ::= call ( ";" ws call )*)" : "root ::= call"; break;
    case ToolCallFormat::Mistral:
      root = parallel ? R"(root ::= "[" ws call ws ( "," ws call ws )* "]")" : R"(root ::= "[" ws call ws "]")";
      break;
  }
  schemas.add(ordered_json{{"type", "null"}}, "unused-");  // makes sure ws is defined
  return fmt::format("{}\ncall ::= {}\n{}", root, calls, schemas.rules());
}

void compile_tool_choice(grammar::ConstraintCache& cache, ToolCallFormat format, ChatRequest& request,
                         const ordered_json& tools) {
  if (request.tool_choice != ToolChoice::Required && request.tool_choice != ToolChoice::Named) return;
  const std::string only = request.tool_choice == ToolChoice::Named ? request.tool_name : "";
  const std::string key = fmt::format("{}|{}|{}|{}", tool_call_format_name(format), only, request.parallel_tool_calls,
                                      tools.dump());
  try {
    request.params.constraint =
        cache.get_gbnf(key, tool_call_gbnf(format, tools, only, request.parallel_tool_calls));
  } catch (const grammar::GrammarError& e) {
    throw ApiError(400, e.what(), "tools");
  }
}

ordered_json template_messages(const ordered_json& messages) {
  ordered_json out = messages;
  for (auto& message : out) {
    if (!message.is_object()) continue;
    const auto calls = message.find("tool_calls");
    if (calls == message.end() || !calls->is_array()) continue;
    // OpenAI clients send content null beside tool calls; templates read message.content.
    if (!message.contains("content") || message["content"].is_null()) message["content"] = "";
    for (auto& call : *calls) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
      auto& function = call["function"];
      const auto arguments = function.find("arguments");
      if (arguments == function.end() || !arguments->is_string()) continue;
      ordered_json parsed = ordered_json::parse(arguments->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_discarded() && parsed.is_object()) *arguments = std::move(parsed);
    }
  }
  return out;
}

json tool_calls_json(const std::vector<ParsedToolCall>& calls, size_t first_index, bool with_index,
                    ToolCallFormat format) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const bool mistral = format == ToolCallFormat::Mistral;
    std::string id = mistral ? "" : "call_";
    for (int k = 0; k < (mistral ? 9 : 24); ++k) id += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
    json call = {{"id", id}, {"type", "function"}, {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) call["index"] = first_index + i;
    out.push_back(std::move(call));
  }
  return out;
}

}  // namespace splitflow
