// server/embeddings_api.h — the wire format of POST /v1/embeddings (OpenAI's): the request body
// parsed and checked (every wrong type or value an ApiError 400 naming the field) and the
// response body. Pure JSON <-> structs: no sockets, no engine.
#pragma once

#include "server/openai_api.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace splitflow {

enum class EmbeddingEncoding : uint8_t { Float, Base64 };

struct EmbeddingRequest {
  std::string model;  // empty when not given
  // `input`: a string, a list of strings, a list of token ids (one input) or a list of such lists.
  std::vector<Prompt> inputs;
  EmbeddingEncoding encoding = EmbeddingEncoding::Float;
  std::optional<int32_t> dimensions;
};

inline constexpr size_t kMaxEmbeddingInputs = 2048;  // OpenAI's limit per request

EmbeddingRequest parse_embedding_request(const nlohmann::json& body);

// One embedding as the response carries it: a JSON array of numbers, or base64 of its
// little-endian float32 bytes (what OpenAI's clients decode with numpy.frombuffer).
nlohmann::json encode_embedding(const std::vector<float>& embedding, EmbeddingEncoding encoding);

// {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}.
nlohmann::json embeddings_body(const std::vector<std::vector<float>>& embeddings, EmbeddingEncoding encoding,
                               const std::string& model, int64_t prompt_tokens);

}  // namespace splitflow
