#include "server/openai_api.h"

#include "core/error.h"
#include "tokenizer/unicode.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

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

std::optional<double> get_number(const json& body, const char* name) {
  const json* value = field(body, name);
  if (!value) return std::nullopt;
  if (!value->is_number()) wrong_type(name, "a number", *value);
  return value->get<double>();
}

std::optional<int64_t> get_integer(const json& body, const char* name) {
  const json* value = field(body, name);
  if (!value) return std::nullopt;
  if (!value->is_number_integer()) wrong_type(name, "an integer", *value);
  if (value->is_number_unsigned() && value->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    bad_value(name, "is too large");
  }
  return value->get<int64_t>();
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

// A number within [low, high] (bounds included unless open_low).
std::optional<float> get_in_range(const json& body, const char* name, double low, double high, bool open_low = false) {
  const std::optional<double> value = get_number(body, name);
  if (!value) return std::nullopt;
  const bool ok = (open_low ? *value > low : *value >= low) && *value <= high;
  if (!ok) bad_value(name, fmt::format("must be in {}{}, {}], got {}", open_low ? "(" : "[", low, high, *value));
  return static_cast<float>(*value);
}

int32_t to_int32(const char* name, int64_t value, int64_t low, int64_t high) {
  if (value < low || value > high) bad_value(name, fmt::format("must be in [{}, {}], got {}", low, high, value));
  return static_cast<int32_t>(value);
}

std::vector<int32_t> token_id_array(const json& value, const std::string& name) {
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const json& id = value[i];
    const std::string item = fmt::format("{}[{}]", name, i);
    if (!id.is_number_integer()) wrong_type(item, "an integer token id", id);
    const int64_t v = id.get<int64_t>();
    if (v < 0 || v > std::numeric_limits<int32_t>::max()) bad_value(item, fmt::format("is not a token id: {}", v));
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

void parse_common(const json& body, GenerationRequest& request, const char* max_tokens_name) {
  if (auto model = get_string(body, "model")) request.model = *model;
  SamplingParams& p = request.params;
  if (auto v = get_in_range(body, "temperature", 0.0, 2.0)) p.temperature = *v;
  if (auto v = get_in_range(body, "top_p", 0.0, 1.0, /*open_low=*/true)) p.top_p = *v;
  if (auto v = get_in_range(body, "min_p", 0.0, 1.0)) p.min_p = *v;
  if (auto v = get_in_range(body, "presence_penalty", -2.0, 2.0)) p.presence_penalty = *v;
  if (auto v = get_in_range(body, "frequency_penalty", -2.0, 2.0)) p.frequency_penalty = *v;
  if (auto v = get_in_range(body, "repetition_penalty", 0.0, 100.0, /*open_low=*/true)) p.repetition_penalty = *v;
  if (auto v = get_integer(body, "top_k")) p.top_k = *v == -1 ? 0 : to_int32("top_k", *v, 0, std::numeric_limits<int32_t>::max());
  if (auto v = get_integer(body, "seed")) p.seed = static_cast<uint64_t>(*v);
  if (auto v = get_bool(body, "ignore_eos")) p.ignore_eos = *v;
  // max_completion_tokens (chat) supersedes the deprecated max_tokens.
  for (const char* name : {"max_tokens", max_tokens_name}) {
    if (auto v = get_integer(body, name)) {
      p.max_tokens = to_int32(name, *v, 1, std::numeric_limits<int32_t>::max());
      request.max_tokens_given = true;
    }
  }
  if (auto v = get_integer(body, "n")) request.n = to_int32("n", *v, 1, kMaxChoices);
  if (auto v = get_integer(body, "best_of"); v && *v != request.n) {
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
    if (!bias->empty()) bad_value("logit_bias", "is not supported");
  }
  if (const json* format = field(body, "response_format")) {
    if (!format->is_object()) wrong_type("response_format", "an object", *format);
    if (auto type = get_string(*format, "type"); type && *type != "text") {
      bad_value("response_format", fmt::format("type '{}' is not supported (only 'text')", *type));
    }
  }
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

json parse_json_body(const std::string& body) {
  // Nothing in a request nests deeply; a cap keeps recursive consumers (the chat template's value
  // conversion) off deep stacks.
  static constexpr int kMaxDepth = 64;
  const json::parser_callback_t depth_check = [](int depth, json::parse_event_t, json&) {
    if (depth > kMaxDepth) throw ApiError(400, fmt::format("the request body nests more than {} levels", kMaxDepth));
    return true;
  };
  json value;
  try {
    value = json::parse(body, depth_check);
  } catch (const json::parse_error& e) {
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
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
  if (auto v = get_integer(body, "logprobs")) {
    request.logprobs = to_int32("logprobs", *v, 0, SamplingParams::kMaxTopLogprobs);
    request.params.logprobs = true;
    request.params.top_logprobs = *request.logprobs;
  }
  if (request.echo && request.logprobs) bad_value("echo", "together with 'logprobs' is not supported (no prompt logprobs)");
  if (auto suffix = get_string(body, "suffix"); suffix && !suffix->empty()) bad_value("suffix", "is not supported");
  validate(request.params);
  return request;
}

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
  if (auto v = get_integer(body, "top_logprobs")) {
    request.top_logprobs = to_int32("top_logprobs", *v, 0, SamplingParams::kMaxTopLogprobs);
    if (!request.logprobs) bad_value("top_logprobs", "needs 'logprobs': true");
  }
  request.params.logprobs = request.logprobs;
  request.params.top_logprobs = request.top_logprobs;
  if (const json* tools = field(body, "tools")) {
    if (!tools->is_array()) wrong_type("tools", "an array", *tools);
    if (!tools->empty()) bad_value("tools", "are not supported (no tool-call parsing)");
  }
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
