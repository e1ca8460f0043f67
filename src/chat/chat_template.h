// chat/chat_template.h — renders a model's Jinja chat template (the `chat_template` of a HF
// tokenizer_config.json) into the prompt text, byte-identical to transformers'
// apply_chat_template (jinja2 with trim_blocks, lstrip_blocks, a sandboxed environment,
// raise_exception, strftime_now and transformers' tojson).
// Module files: jinja_lexer.* (source -> tokens, whitespace control), jinja_ast.h + jinja_parser.*
// (tokens -> AST), jinja_value.* (the interpreter's value type), jinja_builtins.* (operators,
// filters, tests, methods, globals, tojson), jinja_interpreter.* (AST -> text, scopes),
// template_limits.h + jinja_budget.* (what a render may spend), chat_template.cpp (this API).
// docs/chat-templates.md lists the supported Jinja subset and the limits.
// The module never tokenizes; it produces text only, and never renders without its limits. A
// ChatTemplate is immutable after construction: render() may run on several threads at once.
#pragma once

#include "chat/template_limits.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

namespace splitflow {

namespace jinja {
struct Program;
}

class ChatTemplate {
 public:
  // Parses the template once; throws splitflow::Error naming the line/column of a syntax error.
  ChatTemplate(std::string source, std::string bos_token, std::string eos_token);
  // Reads chat_template (a string, or a list of {name, template} from which "default" is taken)
  // and bos/eos tokens (a string or an {"content": ...} object) from a tokenizer_config.json; also
  // a standalone .jinja file (bos/eos then empty) or a chat_template.json ({"chat_template": ...}).
  // Throws if the file has no chat template.
  static ChatTemplate from_file(const std::filesystem::path& path);
  // The model directory's template (chat_template.jinja, chat_template.json or
  // tokenizer_config.json in it; bos/eos always from tokenizer_config.json when present), or nullopt
  // when the model has none. A .gguf file gives its `tokenizer.chat_template` metadata (bos/eos
  // from the token ids); another file path is looked at in its parent directory.
  static std::optional<ChatTemplate> find_for_model(const std::filesystem::path& model_dir);

  // messages: the OpenAI "messages" array (role, content as a string or a list of
  // {type:"text", text} parts, optional name/tool_calls/...). extra: more template variables
  // (tools, documents, enable_thinking, ...). Throws splitflow::Error carrying the template's
  // raise_exception message, or naming the line of a runtime error; TemplateLimitError (an Error)
  // naming the limit when the render reaches one of limits().
  // As transformers' apply_chat_template does, keys whose value is null are dropped from each
  // message (so `content: null` is undefined to the template, not none).
  // Content parts: when the template never loops over a message's content, a list of text parts
  // is joined with "\n" into one string (vLLM's rule for string-content templates); other part
  // types are refused. Messages carrying reasoning_content / thinking / reasoning get both
  // `thinking` and `reasoning_content`, as transformers does.
  std::string render(const nlohmann::json& messages, bool add_generation_prompt,
                     const nlohmann::json& extra = nlohmann::json::object()) const;
  // The same with JSON objects in their original key order (nlohmann::json sorts keys), which is
  // what `tojson` prints: parse requests with nlohmann::ordered_json to get HF's exact output.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  const TemplateLimits& limits() const { return limits_; }
  // This template rendering under other limits (the defaults otherwise); shares the parsed template.
  ChatTemplate with_limits(const TemplateLimits& limits) const;

 private:
  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
  TemplateLimits limits_;
  std::shared_ptr<const jinja::Program> program_;  // shared: copies of a template share the AST
};

}  // namespace splitflow
