#include "server/openai_api.h"

#include "core/error.h"
#include "tokenizer/unicode.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>
#include <type_traits>

namespace splitflow {

using nlohmann::json;

namespace {

// A present, non-null field, or null.
const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void wrong_type(const std::string& name, const char* expected, const json& value) {
  throw ApiError(400, fmt::format("'{}' must be {}, not {}", name, expected, value.type_name()), name);
}

[[noreturn]] void bad_value(const std::string& name, const std::string& message) {
  throw ApiError(400, fmt::format("'{}' {}", name, message), name);
}

std::optional<bool> get_bool(const json& body, const char* name) {
  const json* value = field(body, name);
  if (!value) return std::nullopt;
  if (!value->is_boolean()) wrong_type(name, "a boolean", *value);
  return value->get<bool>();
}

std::optional<std::string> get_string(const json& body, const char* name) {
  const json* value = field(body, name);
  if (!value) return std::nullopt;
  if (!value->is_string()) wrong_type(name, "a string", *value);
  return value->get<std::string>();
}

[[noreturn]] void out_of_range(const std::string& name, const auto& value, const auto& low, const auto& high,
                               bool open_low) {
  bad_value(name, fmt::format("must be in {}{}, {}], got {}", open_low ? "(" : "[", low, high, value));
}

// A request number checked against its field's type and [low, high] (low excluded when open_low):
// the one place numbers are read, so that no field lets an overflowing, non-finite or fractional
// value through to a cast. Number is int64_t for an integer field, double for a real one. An
// integer too long for 64 bits reaches here as a double (nlohmann::json's fallback) and is
// reported out of range rather than "not an integer".
template <typename Number>
Number checked_number(const json& value, const std::string& name, Number low, Number high, bool open_low = false) {
  constexpr bool kInteger = std::is_integral_v<Number>;
  if (!value.is_number()) wrong_type(name, kInteger ? "an integer" : "a number", value);
  if constexpr (kInteger) {
    // nlohmann::json stores non-negative integers as uint64_t: those past int64_t are out of range.
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      out_of_range(name, value.get<uint64_t>(), low, high, open_low);
    }
    if (value.is_number_integer()) {
      const int64_t v = value.get<int64_t>();
      if (v < low || v > high) out_of_range(name, v, low, high, open_low);
      return static_cast<Number>(v);
    }
    const double d = value.get<double>();
    const bool integral = std::isfinite(d) && d == std::trunc(d);
    const bool beyond_int64 = std::abs(d) >= 0x1p63;
    if (integral && (beyond_int64 || d < static_cast<double>(low) || d > static_cast<double>(high))) {
      out_of_range(name, d, low, high, open_low);
    }
    wrong_type(name, "an integer", value);
  } else {
    const double d = value.get<double>();
    // NaN fails both comparisons, so it is out of range too.
    const bool in_range = std::isfinite(d) && (open_low ? d > low : d >= low) && d <= high;
    if (!in_range) out_of_range(name, d, low, high, open_low);
    return d;
  }
}

// checked_number of a present, non-null field.
template <typename Number>
std::optional<Number> get_number(const json& body, const char* name, Number low, Number high, bool open_low = false) {
  const json* value = field(body, name);
  if (!value) return std::nullopt;
  return checked_number<Number>(*value, name, low, high, open_low);
}

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

std::vector<int32_t> token_id_array(const json& value, const std::string& name) {
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const json& id = value[i];
    const std::string item = fmt::format("{}[{}]", name, i);
    if (!id.is_number()) wrong_type(item, "an integer token id", id);
    ids.push_back(static_cast<int32_t>(checked_number<int64_t>(id, item, 0, kInt32Max)));
  }
  return ids;
}

void set_constraint(GenerationRequest& request, grammar::ConstraintKind kind, std::string text, const std::string& param) {
  if (request.constraint) {
    bad_value(param, fmt::format("cannot be combined with '{}': ask for one structured output", request.constraint->param));
  }
  request.constraint = ConstraintRequest{kind, std::move(text), param};
}

// response_format and the extension fields of vLLM and llama.cpp.
void parse_constraint(const json& body, GenerationRequest& request) {
  if (const json* format = field(body, "response_format")) {
    if (!format->is_object()) wrong_type("response_format", "an object", *format);
    const auto type = get_string(*format, "type");
    if (!type) bad_value("response_format", "needs a 'type' ('text', 'json_object' or 'json_schema')");
    if (*type == "json_object") {
      set_constraint(request, grammar::ConstraintKind::JsonObject, "", "response_format");
    } else if (*type == "json_schema") {
      const json* spec = field(*format, "json_schema");
      if (!spec) bad_value("response_format.json_schema", "is required with type 'json_schema'");
      if (!spec->is_object()) wrong_type("response_format.json_schema", "an object", *spec);
      const json* schema = field(*spec, "schema");
      if (!schema) bad_value("response_format.json_schema.schema", "is required");
      if (!schema->is_object() && !schema->is_boolean()) wrong_type("response_format.json_schema.schema", "an object", *schema);
      if (const json* strict = field(*spec, "strict"); strict && !strict->is_boolean()) {
        wrong_type("response_format.json_schema.strict", "a boolean", *strict);
      }
      set_constraint(request, grammar::ConstraintKind::JsonSchema, schema->dump(), "response_format.json_schema.schema");
    } else if (*type != "text") {
      bad_value("response_format.type", fmt::format("'{}' is not one of 'text', 'json_object', 'json_schema'", *type));
    }
  }
  for (const char* name : {"guided_json", "json_schema"}) {
    if (const json* schema = field(body, name)) {
      if (schema->is_string()) {
        const json parsed = json::parse(schema->get<std::string>(), nullptr, /*allow_exceptions=*/false);
        if (parsed.is_discarded()) bad_value(name, "is not a JSON schema (not valid JSON)");
        set_constraint(request, grammar::ConstraintKind::JsonSchema, parsed.dump(), name);
      } else {
        if (!schema->is_object()) wrong_type(name, "an object", *schema);
        set_constraint(request, grammar::ConstraintKind::JsonSchema, schema->dump(), name);
      }
    }
  }
  for (const char* name : {"regex", "guided_regex"}) {
    if (auto pattern = get_string(body, name)) set_constraint(request, grammar::ConstraintKind::Regex, *pattern, name);
  }
  for (const char* name : {"grammar", "guided_grammar"}) {
    if (auto text = get_string(body, name)) set_constraint(request, grammar::ConstraintKind::Gbnf, *text, name);
  }
}

void parse_common(const json& body, GenerationRequest& request, const char* max_tokens_name) {
  if (auto model = get_string(body, "model")) request.model = *model;
  SamplingParams& p = request.params;
  if (auto v = get_number(body, "temperature", 0.0, 2.0)) p.temperature = static_cast<float>(*v);
  if (auto v = get_number(body, "top_p", 0.0, 1.0, /*open_low=*/true)) p.top_p = static_cast<float>(*v);
  if (auto v = get_number(body, "min_p", 0.0, 1.0)) p.min_p = static_cast<float>(*v);
  if (auto v = get_number(body, "presence_penalty", -2.0, 2.0)) p.presence_penalty = static_cast<float>(*v);
  if (auto v = get_number(body, "frequency_penalty", -2.0, 2.0)) p.frequency_penalty = static_cast<float>(*v);
  if (auto v = get_number(body, "repetition_penalty", 0.0, 100.0, /*open_low=*/true)) {
    p.repetition_penalty = static_cast<float>(*v);
  }
  if (auto v = get_number<int64_t>(body, "top_k", -1, kInt32Max)) p.top_k = *v == -1 ? 0 : static_cast<int32_t>(*v);
  if (auto v = get_number<int64_t>(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    p.seed = static_cast<uint64_t>(*v);
  }
  if (auto v = get_bool(body, "ignore_eos")) p.ignore_eos = *v;
  // max_completion_tokens (chat) supersedes the deprecated max_tokens.
  for (const char* name : {"max_tokens", max_tokens_name}) {
    if (auto v = get_number<int64_t>(body, name, 1, kInt32Max)) {
      p.max_tokens = static_cast<int32_t>(*v);
      request.max_tokens_given = true;
    }
  }
  if (auto v = get_number<int64_t>(body, "n", 1, kMaxChoices)) request.n = static_cast<int32_t>(*v);
  if (auto v = get_number<int64_t>(body, "best_of", 1, kInt32Max); v && *v != request.n) {
    bad_value("best_of", "other than n is not supported");
  }

  if (const json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      p.stop = {stop->get<std::string>()};
    } else if (stop->is_array()) {
      if (stop->size() > kMaxStopStrings) bad_value("stop", fmt::format("has {} strings; at most {}", stop->size(), kMaxStopStrings));
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) wrong_type(fmt::format("stop[{}]", i), "a string", (*stop)[i]);
        p.stop.push_back((*stop)[i].get<std::string>());
      }
    } else {
      wrong_type("stop", "a string or an array of strings", *stop);
    }
    for (size_t i = 0; i < p.stop.size(); ++i) {
      if (p.stop[i].empty()) bad_value(stop->is_string() ? "stop" : fmt::format("stop[{}]", i), "is an empty string");
    }
  }
  if (const json* ids = field(body, "stop_token_ids")) {
    if (!ids->is_array()) wrong_type("stop_token_ids", "an array of token ids", *ids);
    p.stop_token_ids = token_id_array(*ids, "stop_token_ids");
  }

  if (auto v = get_bool(body, "stream")) request.stream = *v;
  if (const json* options = field(body, "stream_options")) {
    if (!options->is_object()) wrong_type("stream_options", "an object", *options);
    if (!request.stream) bad_value("stream_options", "is only allowed when 'stream' is true");
    if (auto v = get_bool(*options, "include_usage")) request.include_usage = *v;
  }

  if (const json* bias = field(body, "logit_bias")) {
    if (!bias->is_object()) wrong_type("logit_bias", "an object", *bias);
    // Values are checked first, as OpenAI does (-100 .. 100), so a bad one is named even here.
    for (const auto& [token, token_bias] : bias->items()) checked_number(token_bias, "logit_bias." + token, -100.0, 100.0);
    if (!bias->empty()) bad_value("logit_bias", "is not supported");
  }
  parse_constraint(body, request);
}

// "prompt": a string or token ids (one prompt), or a list of strings or of token-id lists (one
// prompt each, all of one kind). Element errors name the element: prompt[i], prompt[i][j].
std::vector<Prompt> parse_prompts(const json& prompt) {
  if (prompt.is_string()) return {prompt.get<std::string>()};
  if (!prompt.is_array()) wrong_type("prompt", "a string, an array of token ids, or an array of prompts", prompt);
  if (prompt.empty()) bad_value("prompt", "is empty");
  if (!prompt[0].is_string() && !prompt[0].is_array()) return {token_id_array(prompt, "prompt")};
  if (prompt.size() > kMaxPrompts) {
    bad_value("prompt", fmt::format("holds {} prompts; at most {} per request", prompt.size(), kMaxPrompts));
  }
  const bool texts = prompt[0].is_string();
  const char* kind = texts ? "a string, as prompt[0] is (a request's prompts are all texts or all token ids)"
                           : "an array of token ids, as prompt[0] is (a request's prompts are all texts or all token ids)";
  std::vector<Prompt> prompts;
  prompts.reserve(prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) {
    const json& element = prompt[i];
    const std::string name = fmt::format("prompt[{}]", i);
    if (texts) {
      if (!element.is_string()) wrong_type(name, kind, element);
      // A lone text prompt may be empty (the BOS token alone); in a list an empty one is a mistake.
      if (prompt.size() > 1 && element.get_ref<const std::string&>().empty()) bad_value(name, "is an empty string");
      prompts.emplace_back(element.get<std::string>());
    } else {
      if (!element.is_array()) wrong_type(name, kind, element);
      if (element.empty()) bad_value(name, "is empty");
      prompts.emplace_back(token_id_array(element, name));
    }
  }
  return prompts;
}

void validate(const SamplingParams& params) {
  try {
    params.validate();
  } catch (const Error& e) {
    throw ApiError(400, e.what());
  }
}

}  // namespace

json error_body(const ApiError& error) {
  return {{"error",
           {{"message", error.what()},
            {"type", error.type},
            {"param", error.param.empty() ? json(nullptr) : json(error.param)},
            {"code", error.code.empty() ? json(nullptr) : json(error.code)}}}};
}

namespace {

// Where the JSON parser is: a field name as the parsers name fields ("logit_bias.5", "stop[1]",
// "messages[0].content"), so that a number the parser itself refuses is reported at its field.
class JsonPath {
 public:
  void on_event(json::parse_event_t event, const json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: frames_.push_back({false, "", 0}); break;
      case json::parse_event_t::array_start: frames_.push_back({true, "", 0}); break;
      case json::parse_event_t::key: frames_.back().key = parsed.get<std::string>(); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames_.pop_back();
        next_element();
        break;
      case json::parse_event_t::value: next_element(); break;
    }
  }

  std::string str() const {
    std::string path;
    for (const Frame& frame : frames_) {
      if (frame.array) {
        path += fmt::format("[{}]", frame.index);
      } else {
        path += (path.empty() ? "" : ".") + frame.key;
      }
    }
    return path;
  }

 private:
  struct Frame {
    bool array;
    std::string key;  // objects: the key being parsed
    size_t index;     // arrays: the element being parsed
  };
  void next_element() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
  }
  std::vector<Frame> frames_;
};

}  // namespace

json parse_json_body(const std::string& body) {
  // Nothing in a request nests deeply; a cap keeps recursive consumers (the chat template's value
  // conversion) off deep stacks.
  static constexpr int kMaxDepth = 64;
  JsonPath path;
  const json::parser_callback_t track = [&path](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxDepth) throw ApiError(400, fmt::format("the request body nests more than {} levels", kMaxDepth));
    path.on_event(event, parsed);
    return true;
  };
  json value;
  try {
    value = json::parse(body, track);
  } catch (const json::parse_error& e) {
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
  } catch (const json::out_of_range& e) {
    // A number beyond a double (1e999, -1e999): no field could take it. The parser's message
    // without its "[json.exception.out_of_range.406] " prefix is "number overflow parsing '1e999'".
    const std::string_view what = e.what();
    const std::string reason(what.substr(what.find("] ") == std::string_view::npos ? 0 : what.find("] ") + 2));
    const std::string name = path.str();
    if (name.empty()) throw ApiError(400, fmt::format("the request body is out of range: {}", reason));
    throw ApiError(400, fmt::format("'{}' is out of range: {}", name, reason), name);
  }
  if (!value.is_object()) {
    throw ApiError(400, fmt::format("the request body must be a JSON object, not {}", value.type_name()));
  }
  return value;
}

CompletionRequest parse_completion_request(const json& body) {
  CompletionRequest request;
  parse_common(body, request, "max_tokens");
  const json* prompt = field(body, "prompt");
  if (!prompt) throw ApiError(400, "'prompt' is required", "prompt");
  request.prompts = parse_prompts(*prompt);
  if (auto v = get_bool(body, "echo")) request.echo = *v;
  if (auto v = get_number<int64_t>(body, "logprobs", 0, SamplingParams::kMaxTopLogprobs)) {
    request.logprobs = static_cast<int32_t>(*v);
    request.params.logprobs = true;
    request.params.top_logprobs = *request.logprobs;
  }
  if (request.echo && request.logprobs) bad_value("echo", "together with 'logprobs' is not supported (no prompt logprobs)");
  if (auto suffix = get_string(body, "suffix"); suffix && !suffix->empty()) bad_value("suffix", "is not supported");
  validate(request.params);
  return request;
}

namespace {

void parse_tools(const json& body, ChatRequest& request) {
  if (const json* tools = field(body, "tools")) {
    if (!tools->is_array()) wrong_type("tools", "an array", *tools);
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& tool = (*tools)[i];
      const std::string name = fmt::format("tools[{}]", i);
      if (!tool.is_object()) wrong_type(name, "an object", tool);
      if (auto type = get_string(tool, "type"); type != "function") bad_value(name + ".type", "must be 'function'");
      const json* function = field(tool, "function");
      if (!function || !function->is_object()) bad_value(name + ".function", "must be an object with a 'name'");
      const json* function_name = field(*function, "name");
      if (!function_name || !function_name->is_string() || function_name->get_ref<const std::string&>().empty()) {
        bad_value(name + ".function.name", "must be a non-empty string");
      }
      if (const json* parameters = field(*function, "parameters"); parameters && !parameters->is_object()) {
        wrong_type(name + ".function.parameters", "an object (a JSON schema)", *parameters);
      }
    }
    request.tools = *tools;
  }
  request.tool_choice = request.tools.empty() ? ToolChoice::None : ToolChoice::Auto;
  if (const json* choice = field(body, "tool_choice")) {
    if (choice->is_string()) {
      const std::string value = choice->get<std::string>();
      if (value == "auto") {
        request.tool_choice = ToolChoice::Auto;
      } else if (value == "none") {
        request.tool_choice = ToolChoice::None;
      } else if (value == "required") {
        request.tool_choice = ToolChoice::Required;
      } else {
        bad_value("tool_choice", fmt::format("'{}' is not one of 'auto', 'none', 'required' or a function", value));
      }
    } else if (choice->is_object()) {
      const json* function = field(*choice, "function");
      const json* name = function && function->is_object() ? field(*function, "name") : nullptr;
      if (get_string(*choice, "type") != "function" || !name || !name->is_string()) {
        bad_value("tool_choice", "must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
      request.tool_choice = ToolChoice::Named;
      request.tool_name = name->get<std::string>();
    } else {
      wrong_type("tool_choice", "a string or an object", *choice);
    }
    if (request.tool_choice != ToolChoice::None && request.tool_choice != ToolChoice::Auto && request.tools.empty()) {
      bad_value("tool_choice", "needs 'tools'");
    }
    if (request.tool_choice == ToolChoice::Named) {
      const bool known = std::any_of(request.tools.begin(), request.tools.end(), [&](const json& tool) {
        return tool["function"]["name"] == request.tool_name;
      });
      if (!known) bad_value("tool_choice", fmt::format("names '{}', which is not one of 'tools'", request.tool_name));
    }
  }
  if (auto v = get_bool(body, "parallel_tool_calls")) request.parallel_tool_calls = *v;
  const bool forced = request.tool_choice == ToolChoice::Required || request.tool_choice == ToolChoice::Named;
  if (forced && request.constraint) {
    bad_value(request.constraint->param, "cannot be combined with a required tool call ('tool_choice')");
  }
}

}  // namespace

ChatRequest parse_chat_request(const json& body) {
  ChatRequest request;
  parse_common(body, request, "max_completion_tokens");
  const json* messages = field(body, "messages");
  if (!messages) throw ApiError(400, "'messages' is required", "messages");
  if (!messages->is_array()) wrong_type("messages", "an array", *messages);
  if (messages->empty()) bad_value("messages", "is empty");
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& message = (*messages)[i];
    const std::string name = fmt::format("messages[{}]", i);
    if (!message.is_object()) wrong_type(name, "an object", message);
    const auto role = message.find("role");
    if (role == message.end()) bad_value(name, "has no 'role'");
    if (!role->is_string()) wrong_type(name + ".role", "a string", *role);
    const auto content = message.find("content");
    if (content != message.end() && !content->is_string() && !content->is_array() && !content->is_null()) {
      wrong_type(name + ".content", "a string or an array of content parts", *content);
    }
  }
  if (auto v = get_bool(body, "logprobs")) request.logprobs = *v;
  if (auto v = get_number<int64_t>(body, "top_logprobs", 0, SamplingParams::kMaxTopLogprobs)) {
    request.top_logprobs = static_cast<int32_t>(*v);
    if (!request.logprobs) bad_value("top_logprobs", "needs 'logprobs': true");
  }
  request.params.logprobs = request.logprobs;
  request.params.top_logprobs = request.top_logprobs;
  parse_tools(body, request);
  if (const json* kwargs = field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) wrong_type("chat_template_kwargs", "an object", *kwargs);
  }
  validate(request.params);
  return request;
}

std::string token_text(const Tokenizer* tokenizer, int32_t token_id) {
  if (!tokenizer) return fmt::format("token_id:{}", token_id);
  return unicode::make_valid_utf8(tokenizer->token_bytes(token_id));
}

std::vector<uint8_t> token_bytes(const Tokenizer* tokenizer, int32_t token_id) {
  const std::string bytes = tokenizer ? tokenizer->token_bytes(token_id) : token_text(nullptr, token_id);
  return {bytes.begin(), bytes.end()};
}

namespace {
// JSON has no -inf; OpenAI reports -9999 for a token the model gives no mass.
double logprob_value(float logprob) { return std::isfinite(logprob) ? logprob : -9999.0; }
}  // namespace

json completion_logprobs(const Tokenizer* tokenizer, const std::vector<TokenOutput>& tokens, size_t& text_offset) {
  json texts = json::array(), logprobs = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenOutput& token : tokens) {
    const std::string text = token_text(tokenizer, token.token_id);
    texts.push_back(text);
    logprobs.push_back(logprob_value(token.logprob));
    json top = json::object();
    for (const TokenLogprob& candidate : token.top_logprobs) {
      top.emplace(token_text(tokenizer, candidate.token_id), logprob_value(candidate.logprob));
    }
    top.emplace(text, logprob_value(token.logprob));  // the sampled token is always listed
    tops.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += text.size();
  }
  return {{"tokens", texts}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json chat_logprobs(const Tokenizer* tokenizer, const std::vector<TokenOutput>& tokens) {
  json content = json::array();
  for (const TokenOutput& token : tokens) {
    json top = json::array();
    for (const TokenLogprob& candidate : token.top_logprobs) {
      top.push_back({{"token", token_text(tokenizer, candidate.token_id)},
                     {"logprob", logprob_value(candidate.logprob)},
                     {"bytes", token_bytes(tokenizer, candidate.token_id)}});
    }
    content.push_back({{"token", token_text(tokenizer, token.token_id)},
                       {"logprob", logprob_value(token.logprob)},
                       {"bytes", token_bytes(tokenizer, token.token_id)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

std::string dump_json(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace splitflow
