#include "server/embeddings_api.h"

#include <fmt/format.h>

#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

namespace splitflow {

using nlohmann::json;

namespace {

bool is_token_id(const json& value) { return value.is_number_integer() || value.is_number_unsigned(); }

std::vector<int32_t> token_ids(const json& list, const std::string& field) {
  std::vector<int32_t> ids;
  ids.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const json& value = list[i];
    if (!is_token_id(value))
      throw ApiError(400, fmt::format("'{}[{}]' must be a token id (an integer), got {}", field, i, value.dump()), field);
    const int64_t id = value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(INT64_MAX) ? -1 : value.get<int64_t>();
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      throw ApiError(400, fmt::format("'{}[{}]': token id {} is out of range", field, i, value.dump()), field);
    ids.push_back(static_cast<int32_t>(id));
  }
  if (ids.empty()) throw ApiError(400, fmt::format("'{}' must not be an empty list of token ids", field), field);
  return ids;
}

std::string base64(const void* data, size_t bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* in = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve((bytes + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes; i += 3) {
    const uint32_t v = (uint32_t{in[i]} << 16) | (uint32_t{in[i + 1]} << 8) | in[i + 2];
    for (int shift = 18; shift >= 0; shift -= 6) out += kAlphabet[(v >> shift) & 63];
  }
  if (i < bytes) {
    const uint32_t v = (uint32_t{in[i]} << 16) | (i + 1 < bytes ? uint32_t{in[i + 1]} << 8 : 0);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

}  // namespace

EmbeddingRequest parse_embedding_request(const json& body) {
  EmbeddingRequest request;
  if (const auto model = body.find("model"); model != body.end() && !model->is_null()) {
    if (!model->is_string()) throw ApiError(400, "'model' must be a string", "model");
    request.model = model->get<std::string>();
  }
  const auto input = body.find("input");
  if (input == body.end() || input->is_null()) throw ApiError(400, "'input' is required", "input");
  if (input->is_string()) {
    request.inputs.emplace_back(input->get<std::string>());
  } else if (input->is_array()) {
    if (input->empty()) throw ApiError(400, "'input' must not be an empty list", "input");
    if (input->size() > kMaxEmbeddingInputs)
      throw ApiError(400, fmt::format("'input' holds {} inputs; at most {} per request", input->size(), kMaxEmbeddingInputs),
                     "input");
    if (is_token_id(input->front())) {
      request.inputs.emplace_back(token_ids(*input, "input"));
    } else {
      for (size_t i = 0; i < input->size(); ++i) {
        const json& item = (*input)[i];
        const std::string field = fmt::format("input[{}]", i);
        if (item.is_string()) request.inputs.emplace_back(item.get<std::string>());
        else if (item.is_array()) request.inputs.emplace_back(token_ids(item, field));
        else throw ApiError(400, fmt::format("'{}' must be a string or a list of token ids, got {}", field, item.type_name()), field);
      }
    }
  } else {
    throw ApiError(400, "'input' must be a string, a list of strings, a list of token ids or a list of such lists",
                   "input");
  }
  for (size_t i = 0; i < request.inputs.size(); ++i) {
    const auto* text = std::get_if<std::string>(&request.inputs[i]);
    if (text != nullptr && text->empty())
      throw ApiError(400, request.inputs.size() == 1 ? "'input' must not be an empty string"
                                                     : fmt::format("'input[{}]' must not be an empty string", i),
                     "input");
  }
  if (const auto format = body.find("encoding_format"); format != body.end() && !format->is_null()) {
    if (!format->is_string() || (*format != "float" && *format != "base64"))
      throw ApiError(400, fmt::format("'encoding_format' must be 'float' or 'base64', got {}", format->dump()),
                     "encoding_format");
    request.encoding = *format == "base64" ? EmbeddingEncoding::Base64 : EmbeddingEncoding::Float;
  }
  if (const auto dimensions = body.find("dimensions"); dimensions != body.end() && !dimensions->is_null()) {
    if (!is_token_id(*dimensions) || dimensions->get<int64_t>() < 1 || dimensions->get<int64_t>() > (1 << 20))
      throw ApiError(400, fmt::format("'dimensions' must be a positive integer, got {}", dimensions->dump()), "dimensions");
    request.dimensions = static_cast<int32_t>(dimensions->get<int64_t>());
  }
  if (const auto user = body.find("user"); user != body.end() && !user->is_null() && !user->is_string())
    throw ApiError(400, "'user' must be a string", "user");
  return request;
}

std::string base64_embedding(const std::vector<float>& embedding) {
  static_assert(std::endian::native == std::endian::little, "base64 embeddings are little-endian float32");
  return base64(embedding.data(), embedding.size() * sizeof(float));
}

std::string embeddings_body(const std::vector<std::vector<float>>& embeddings, EmbeddingEncoding encoding,
                            const std::string& model, int64_t prompt_tokens) {
  std::string out;
  size_t values = 0;
  for (const auto& embedding : embeddings) values += embedding.size();
  out.reserve(128 + 64 * embeddings.size() + (encoding == EmbeddingEncoding::Float ? 16 : 6) * values);
  out += R"({"object":"list","data":[)";
  char number[32];
  for (size_t i = 0; i < embeddings.size(); ++i) {
    if (i > 0) out += ',';
    out += R"({"object":"embedding","index":)";
    out += std::to_string(i);
    out += R"(,"embedding":)";
    if (encoding == EmbeddingEncoding::Base64) {
      out += '"';
      out += base64_embedding(embeddings[i]);  // [A-Za-z0-9+/=]: nothing to escape
      out += '"';
    } else {
      out += '[';
      for (size_t d = 0; d < embeddings[i].size(); ++d) {
        if (d > 0) out += ',';
        const float value = embeddings[i][d];
        if (!std::isfinite(value)) {
          out += "null";
          continue;
        }
        if (value == 0.0f) {  // "-0" reads back as the integer 0: keep the sign (and a float)
          out += std::signbit(value) ? "-0.0" : "0.0";
          continue;
        }
        const std::to_chars_result written = std::to_chars(number, number + sizeof number, value);
        out.append(number, written.ptr);
      }
      out += ']';
    }
    out += '}';
  }
  out += R"(],"model":)";
  out += json(model).dump(-1, ' ', false, json::error_handler_t::replace);
  out += R"(,"usage":{"prompt_tokens":)";
  out += std::to_string(prompt_tokens);
  out += R"(,"total_tokens":)";
  out += std::to_string(prompt_tokens);
  out += "}}";
  return out;
}

}  // namespace splitflow
