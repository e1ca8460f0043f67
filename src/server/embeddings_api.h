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

// One embedding as base64 of its little-endian float32 bytes (what OpenAI's clients decode with
// numpy.frombuffer).
std::string base64_embedding(const std::vector<float>& embedding);

// The response body, serialized: {"object": "list", "data": [{"object": "embedding", "index",
// "embedding"}], "model", "usage"}. Float embeddings are arrays of each float32's shortest
// round-trip decimal (std::to_chars: parsed back and rounded to float32, the same value; a
// non-finite one is null), written straight into the text: a model's 384 values are formatted
// 70 000 times a second on one GPU, and a JSON tree of doubles cost 104 ns and 21 bytes a value.
std::string embeddings_body(const std::vector<std::vector<float>>& embeddings, EmbeddingEncoding encoding,
                            const std::string& model, int64_t prompt_tokens);

}  // namespace splitflow
