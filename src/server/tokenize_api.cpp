#include "server/tokenize_api.h"

#include "server/openai_api.h"

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <vector>

namespace splitflow {

using nlohmann::json;

namespace {

const Tokenizer& require_tokenizer(const Tokenizer* tokenizer) {
  if (!tokenizer) throw ApiError(400, "this model has no tokenizer: it takes and gives token ids only");
  return *tokenizer;
}

bool optional_bool(const json& body, const char* field, bool fallback) {
  const auto it = body.find(field);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw ApiError(400, fmt::format("'{}' must be a boolean, not {}", field, it->type_name()), field);
  return it->get<bool>();
}

bool is_valid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
    if (length == 0 || i + length > text.size()) return false;
    for (size_t k = 1; k < length; ++k)
      if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return false;
    i += length;
  }
  return true;
}

}  // namespace

json tokenize_response(const Tokenizer* tokenizer, const json& body) {
  const Tokenizer& vocabulary = require_tokenizer(tokenizer);
  const auto content = body.find("content");
  if (content == body.end()) throw ApiError(400, "'content' is required: the text to tokenize", "content");
  if (!content->is_string())
    throw ApiError(400, fmt::format("'content' must be a string, not {}", content->type_name()), "content");
  const bool add_special = optional_bool(body, "add_special", false);
  const bool with_pieces = optional_bool(body, "with_pieces", false);
  if (!optional_bool(body, "parse_special", true)) {
    throw ApiError(400, "'parse_special' false is not supported: special tokens written in the text are always matched",
                   "parse_special");
  }
  const std::vector<int32_t> ids = vocabulary.encode(content->get_ref<const std::string&>(), add_special);
  json tokens = json::array();
  for (const int32_t id : ids) {
    if (!with_pieces) {
      tokens.push_back(id);
      continue;
    }
    const std::string piece = vocabulary.token_bytes(id);
    json piece_json;
    if (is_valid_utf8(piece)) {
      piece_json = piece;
    } else {
      piece_json = json::array();
      for (const char byte : piece) piece_json.push_back(static_cast<unsigned char>(byte));
    }
    tokens.push_back({{"id", id}, {"piece", std::move(piece_json)}});
  }
  return {{"tokens", std::move(tokens)}};
}

json detokenize_response(const Tokenizer* tokenizer, const json& body) {
  const Tokenizer& vocabulary = require_tokenizer(tokenizer);
  const auto tokens = body.find("tokens");
  if (tokens == body.end()) throw ApiError(400, "'tokens' is required: a list of token ids", "tokens");
  if (!tokens->is_array())
    throw ApiError(400, fmt::format("'tokens' must be a list of token ids, not {}", tokens->type_name()), "tokens");
  std::vector<int32_t> ids;
  ids.reserve(tokens->size());
  for (size_t i = 0; i < tokens->size(); ++i) {
    const json& token = (*tokens)[i];
    const std::string field = fmt::format("tokens[{}]", i);
    if (!token.is_number_integer())
      throw ApiError(400, fmt::format("'{}' must be an integer token id, not {}", field, token.dump()), field);
    const int64_t id = token.get<int64_t>();
    if (id < 0 || id >= vocabulary.vocab_size()) {
      throw ApiError(400, fmt::format("'{}' is {}, outside the vocabulary [0, {})", field, id, vocabulary.vocab_size()),
                     field);
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return {{"content", vocabulary.decode(ids, /*skip_special=*/false)}};
}

}  // namespace splitflow
