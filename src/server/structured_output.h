// server/structured_output.h — the server's side of structured outputs and tool calls: a
// request's constraint compiled through the ConstraintCache (errors become 400s naming the
// field), the grammar that forces a tool call (tool_choice "required" or a named function) in
// the model's own format, and the messages prepared for a chat template that takes tools.
#pragma once

#include "chat/tool_calls.h"
#include "grammar/constraint_cache.h"
#include "server/openai_api.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace splitflow {

// Compiles request.constraint into request.params.constraint; ApiError 400 naming the field.
// body: the request body, from which a JSON schema is read again keeping its key order (the
// order its object properties are written in).
void compile_constraint(grammar::ConstraintCache& cache, GenerationRequest& request, const std::string& body);

// GBNF for one call (parallel: one or more) of `tools` (only `only_name` when not empty) as
// `format` writes calls, each call's arguments constrained by its function's parameter schema.
// Throws grammar::GrammarError naming an unsupported schema feature.
std::string tool_call_gbnf(ToolCallFormat format, const nlohmann::ordered_json& tools, const std::string& only_name,
                           bool parallel);

// For required / named tool choices, sets request.params.constraint to the tool-call grammar.
// tools: the request's `tools` in the client's key order.
void compile_tool_choice(grammar::ConstraintCache& cache, ToolCallFormat format, ChatRequest& request,
                         const nlohmann::ordered_json& tools);

// The messages as chat templates expect them: an assistant message's tool_calls[].function
// .arguments given as a JSON string (OpenAI's wire format) becomes the object it encodes
// (transformers' convention, which templates print with tojson), and its null content "".
nlohmann::ordered_json template_messages(const nlohmann::ordered_json& messages);

// OpenAI's tool_calls entries for parsed calls: {"id", "type": "function", "function": {"name",
// "arguments"}}; ids are "call_" + 24 random alphanumerics, or for Mistral 9 alphanumerics (its
// templates refuse other ids when the call comes back in the conversation).
nlohmann::json tool_calls_json(const std::vector<ParsedToolCall>& calls, size_t first_index, bool with_index,
                               ToolCallFormat format);

}  // namespace splitflow
