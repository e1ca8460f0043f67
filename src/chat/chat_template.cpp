#include "chat/chat_template.h"

#include "chat/jinja_interpreter.h"
#include "chat/jinja_parser.h"
#include "core/error.h"
#include "formats/weight_source.h"

#include <fstream>
#include <sstream>

namespace splitflow {
namespace {

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  SF_CHECK(in, "chat template: cannot open {}", path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  try {
    return nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail("chat template: {} is not valid JSON: {}", path.string(), e.what());
  }
}

// A special token in tokenizer_config.json: a string, an AddedToken object {"content": ...}, or null.
std::string token_text(const nlohmann::json& config, const char* key, const std::filesystem::path& path) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  fail("chat template: {}: '{}' must be a string or an object with a string 'content'", path.string(), key);
}

// The template in a tokenizer_config.json / chat_template.json: a string, or a list of
// {"name", "template"} from which transformers takes "default". Empty when absent.
std::string template_from_config(const nlohmann::json& config, const std::filesystem::path& path) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& entry : *it) {
      SF_CHECK(entry.is_object() && entry.contains("name") && entry.contains("template") && entry["name"].is_string() &&
                   entry["template"].is_string(),
               "chat template: {}: every entry of the 'chat_template' list needs string 'name' and 'template'",
               path.string());
      if (entry["name"] == "default") return entry["template"].get<std::string>();
    }
    fail("chat template: {}: the 'chat_template' list has no template named 'default'", path.string());
  }
  fail("chat template: {}: 'chat_template' must be a string or a list of {{name, template}}", path.string());
}

struct SpecialTokens {
  std::string bos;
  std::string eos;
};

// tokenizer_config.json's bos/eos, else special_tokens_map.json's (older checkpoints keep them there).
SpecialTokens special_tokens(const std::filesystem::path& dir) {
  SpecialTokens tokens;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    std::filesystem::path path = dir / name;
    if (!std::filesystem::is_regular_file(path)) continue;
    nlohmann::json config = read_json_file(path);
    SF_CHECK(config.is_object(), "chat template: {} must hold a JSON object", path.string());
    if (tokens.bos.empty()) tokens.bos = token_text(config, "bos_token", path);
    if (tokens.eos.empty()) tokens.eos = token_text(config, "eos_token", path);
  }
  return tokens;
}

template <typename Json>
jinja::Value content_as_text(const Json& content, size_t message_index) {
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    SF_CHECK(part.is_object() && part.contains("type") && part["type"].is_string(),
             "messages[{}].content[{}]: a content part must be an object with a string 'type'", message_index, i);
    std::string type = part["type"].template get<std::string>();
    SF_CHECK(type == "text", "messages[{}].content[{}]: content part type '{}' is not supported (text only)",
             message_index, i, type);
    SF_CHECK(part.contains("text") && part["text"].is_string(),
             "messages[{}].content[{}]: a text part needs a string 'text'", message_index, i);
    if (i) text += "\n";
    text += part["text"].template get<std::string>();
  }
  return jinja::Value(std::move(text));
}

// transformers' _alias_reasoning_fields: {"thinking": r, **message, "reasoning_content": r}.
jinja::Dict alias_reasoning(jinja::Dict message) {
  const jinja::Value* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    const jinja::Value* value = message.find_key(key);
    if (value && !value->is_none()) {
      reasoning = value;
      break;
    }
  }
  if (!reasoning) return message;
  jinja::Value text = *reasoning;
  jinja::Dict aliased;
  aliased.set(jinja::Value("thinking"), text);
  for (auto& [key, value] : message.entries) aliased.set(key, value);
  aliased.set(jinja::Value("reasoning_content"), text);
  return aliased;
}

template <typename Json>
std::string render_messages(const jinja::Program& program, const TemplateLimits& limits, const std::string& bos,
                            const std::string& eos, const Json& messages, bool add_generation_prompt,
                            const Json& extra) {
  SF_CHECK(messages.is_array(), "chat template: 'messages' must be an array of message objects");
  SF_CHECK(extra.is_object(), "chat template: the extra template variables must be a JSON object");
  std::vector<jinja::Value> converted;
  converted.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& message = messages[i];
    SF_CHECK(message.is_object(), "messages[{}]: a message must be a JSON object", i);
    jinja::Dict dict;
    for (auto it = message.begin(); it != message.end(); ++it) {
      if (it.value().is_null()) continue;  // apply_chat_template drops None-valued keys
      if (it.key() == "content" && it.value().is_array() && !program.iterates_message_content) {
        dict.entries.emplace_back(jinja::Value("content"), content_as_text(it.value(), i));
      } else {
        dict.entries.emplace_back(jinja::Value(it.key()), jinja::Value::from_json(it.value()));
      }
    }
    converted.push_back(jinja::Value::dict(alias_reasoning(std::move(dict))));
  }
  std::vector<std::pair<std::string, jinja::Value>> variables;
  variables.emplace_back("messages", jinja::Value::list(std::move(converted)));
  variables.emplace_back("tools", jinja::Value(nullptr));
  variables.emplace_back("documents", jinja::Value(nullptr));
  variables.emplace_back("add_generation_prompt", jinja::Value(add_generation_prompt));
  if (!bos.empty()) variables.emplace_back("bos_token", jinja::Value(bos));
  if (!eos.empty()) variables.emplace_back("eos_token", jinja::Value(eos));
  for (auto it = extra.begin(); it != extra.end(); ++it) {
    SF_CHECK(it.key() != "messages" && it.key() != "add_generation_prompt",
             "chat template: '{}' cannot be passed as an extra template variable", it.key());
    variables.emplace_back(it.key(), jinja::Value::from_json(it.value()));
  }
  return jinja::render(program, variables, limits);
}

// The text of token `key` (an id) in GGUF metadata, "" when absent or out of range.
std::string gguf_token(const nlohmann::json& metadata, const char* key) {
  auto id = metadata.find(key);
  auto tokens = metadata.find("tokenizer.ggml.tokens");
  if (id == metadata.end() || !id->is_number_integer() || tokens == metadata.end() || !tokens->is_array()) return "";
  auto index = id->get<int64_t>();
  if (index < 0 || index >= static_cast<int64_t>(tokens->size()) || !(*tokens)[index].is_string()) return "";
  return (*tokens)[index].get<std::string>();
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, std::string bos_token, std::string eos_token)
    : source_(std::move(source)), bos_token_(std::move(bos_token)), eos_token_(std::move(eos_token)) {
  auto program = std::make_shared<jinja::Program>(jinja::parse(source_));
  jinja::check_filters_and_tests(*program);
  program_ = std::move(program);
}

ChatTemplate ChatTemplate::from_file(const std::filesystem::path& path) {
  if (path.extension() != ".json") return ChatTemplate(read_text_file(path), "", "");
  nlohmann::json config = read_json_file(path);
  SF_CHECK(config.is_object(), "chat template: {} must hold a JSON object", path.string());
  std::string source = template_from_config(config, path);
  SF_CHECK(!source.empty(), "chat template: {} has no chat_template", path.string());
  try {
    return ChatTemplate(std::move(source), token_text(config, "bos_token", path), token_text(config, "eos_token", path));
  } catch (const Error& e) {
    fail("{}: {}", path.string(), e.what());
  }
}

std::optional<ChatTemplate> ChatTemplate::find_for_model(const std::filesystem::path& model_dir) {
  if (model_dir.extension() == ".gguf" && std::filesystem::is_regular_file(model_dir)) {
    // llama.cpp's convention: the template and the special token ids live in the GGUF metadata.
    std::unique_ptr<WeightSource> gguf = open_gguf(model_dir.string());
    const nlohmann::json& metadata = gguf->metadata();
    auto source = metadata.find("tokenizer.chat_template");
    if (source == metadata.end() || !source->is_string()) return std::nullopt;
    try {
      return ChatTemplate(source->get<std::string>(), gguf_token(metadata, "tokenizer.ggml.bos_token_id"),
                          gguf_token(metadata, "tokenizer.ggml.eos_token_id"));
    } catch (const Error& e) {
      fail("{}: tokenizer.chat_template: {}", model_dir.string(), e.what());
    }
  }
  std::filesystem::path dir = std::filesystem::is_directory(model_dir) ? model_dir : model_dir.parent_path();
  if (dir.empty()) dir = ".";
  // transformers' order: chat_template.jinja, then chat_template.json, then tokenizer_config.json.
  std::filesystem::path source_path;
  std::string source;
  if (std::filesystem::is_regular_file(dir / "chat_template.jinja")) {
    source_path = dir / "chat_template.jinja";
    source = read_text_file(source_path);
  } else {
    for (const char* name : {"chat_template.json", "tokenizer_config.json"}) {
      std::filesystem::path path = dir / name;
      if (!std::filesystem::is_regular_file(path)) continue;
      nlohmann::json config = read_json_file(path);
      SF_CHECK(config.is_object(), "chat template: {} must hold a JSON object", path.string());
      source = template_from_config(config, path);
      if (!source.empty()) {
        source_path = path;
        break;
      }
    }
  }
  if (source.empty()) return std::nullopt;
  SpecialTokens tokens = special_tokens(dir);
  try {
    return ChatTemplate(std::move(source), std::move(tokens.bos), std::move(tokens.eos));
  } catch (const Error& e) {
    fail("{}: {}", source_path.string(), e.what());
  }
}

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra) const {
  return render_messages(*program_, limits_, bos_token_, eos_token_, messages, add_generation_prompt, extra);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra) const {
  return render_messages(*program_, limits_, bos_token_, eos_token_, messages, add_generation_prompt, extra);
}

ChatTemplate ChatTemplate::with_limits(const TemplateLimits& limits) const {
  ChatTemplate limited = *this;
  limited.limits_ = limits;
  return limited;
}

}  // namespace splitflow
