// server/openai_api.h — the OpenAI wire format: request bodies of /v1/completions and
// /v1/chat/completions parsed and checked into SamplingParams (every wrong type or bad value is
// an ApiError naming the field), the error body, and the logprobs objects of responses. Pure
// JSON <-> structs: no sockets, no engine.
#pragma once

#include "chat/tool_calls.h"
#include "engine/engine.h"
#include "engine/sampling_params.h"
#include "grammar/constraint_cache.h"
#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace splitflow {

// An error the client caused (or overload): status and the fields of OpenAI's error object.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string type = "invalid_request_error",
           std::string code = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type;
  std::string param;  // the request field at fault; empty: null
  std::string code;   // empty: null
};

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_body(const ApiError& error);

// The body as a JSON object; ApiError 400 for invalid JSON or another top-level type.
nlohmann::json parse_json_body(const std::string& body);

// A structured-output constraint asked for: response_format json_object / json_schema, or the
// extensions "regex" / "grammar" (GBNF) (vLLM's guided_json / guided_regex / guided_grammar and
// llama.cpp's "json_schema" are accepted as the same). At most one per request.
struct ConstraintRequest {
  grammar::ConstraintKind kind = grammar::ConstraintKind::JsonObject;
  std::string text;   // the schema (JSON), pattern or grammar
  std::string param;  // the request field it came from, for errors
};

// Fields both endpoints share.
struct GenerationRequest {
  std::string model;            // empty when not given
  SamplingParams params;        // validated
  bool max_tokens_given = false;
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;   // stream_options.include_usage
  std::optional<ConstraintRequest> constraint;
};

// A prompt as text or as token ids.
using Prompt = std::variant<std::string, std::vector<int32_t>>;

struct CompletionRequest : GenerationRequest {
  // One or more prompts (a list of texts or of token-id lists, as lm-evaluation-harness batches
  // them); prompt p's choice i answers as choice index p * n + i.
  std::vector<Prompt> prompts;
  bool echo = false;
  std::optional<int32_t> logprobs;  // top logprobs per token (0: the sampled token's only)
};

// messages (a non-empty array of objects with a string "role") and chat_template_kwargs (an
// object) are checked; the template renders them from the body itself.
enum class ToolChoice : uint8_t { Auto, None, Required, Named };

struct ChatRequest : GenerationRequest {
  bool logprobs = false;
  int32_t top_logprobs = 0;
  // tools: each {"type": "function", "function": {"name", "description"?, "parameters"?}}, checked.
  nlohmann::json tools = nlohmann::json::array();
  ToolChoice tool_choice = ToolChoice::Auto;  // OpenAI's default with tools ("none" without)
  std::string tool_name;                      // ToolChoice::Named: the function
  bool parallel_tool_calls = true;
};

// Limits of the parsers, beyond SamplingParams::validate().
inline constexpr int32_t kMaxChoices = 16;     // n
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxPrompts = 64;      // prompts in one /v1/completions request

// Known fields must have their documented type (null counts as absent); unknown fields are
// ignored. Fields whose meaning the server cannot honour (logit_bias, suffix, best_of != n, two
// structured outputs at once) are refused rather than ignored; a schema the grammar module cannot
// enforce is refused when it is compiled (server/structured_output.h).
CompletionRequest parse_completion_request(const nlohmann::json& body);
ChatRequest parse_chat_request(const nlohmann::json& body);

// How a token appears in logprobs: its bytes made valid UTF-8 (U+FFFD for a partial character),
// "token_id:<id>" without a tokenizer.
std::string token_text(const Tokenizer* tokenizer, int32_t token_id);
std::vector<uint8_t> token_bytes(const Tokenizer* tokenizer, int32_t token_id);

// /v1/completions "logprobs" for these tokens: tokens, token_logprobs, top_logprobs (objects
// token -> logprob) and text_offset, counted from text_offset (advanced past the tokens).
nlohmann::json completion_logprobs(const Tokenizer* tokenizer, const std::vector<TokenOutput>& tokens,
                                   size_t& text_offset);
// /v1/chat/completions "logprobs": {"content": [{token, logprob, bytes, top_logprobs}]}.
nlohmann::json chat_logprobs(const Tokenizer* tokenizer, const std::vector<TokenOutput>& tokens);

// Serializes without throwing on invalid UTF-8 (replaced by U+FFFD).
std::string dump_json(const nlohmann::json& value);

}  // namespace splitflow
