#include "splitwise/kv_frames.h"

#include "core/error.h"

#include <fmt/format.h>

#include <cstring>
#include <limits>

namespace splitflow::splitwise {

std::string_view transfer_mode_name(TransferMode mode) {
  return mode == TransferMode::LayerWise ? "layerwise" : "serialized";
}

TransferMode parse_transfer_mode(std::string_view name) {
  if (name == "layerwise" || name == "layer-wise") return TransferMode::LayerWise;
  if (name == "serialized") return TransferMode::Serialized;
  throw Error(fmt::format("unknown KV transfer mode '{}': use layerwise or serialized", name));
}

std::string KvLayout::describe() const {
  return fmt::format("{} layers x {} kv heads x {} ({})", num_layers, num_kv_heads, head_dim, dtype_name(dtype));
}

namespace wire {

using nlohmann::json;

namespace {

// A JSON integer that fits T; anything else (a float, a string, out of range) is refused by name,
// never converted (nlohmann's conversion of an out-of-range float is undefined behaviour).
template <typename T>
T integer(const json& value, const char* what) {
  const bool fits = value.is_number_unsigned()  ? value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                    : value.is_number_integer() ? value.get<int64_t>() >= std::numeric_limits<T>::min() &&
                                                      value.get<int64_t>() <= std::numeric_limits<T>::max()
                                                : false;
  SF_CHECK(fits, "{} must be an integer in [{}, {}], not {}", what, std::numeric_limits<T>::min(),
           std::numeric_limits<T>::max(), value.dump().substr(0, 40));
  return static_cast<T>(value.is_number_unsigned() ? static_cast<int64_t>(value.get<uint64_t>()) : value.get<int64_t>());
}

}  // namespace

std::string frame(FrameType type, std::string_view payload) {
  FrameHeader header;
  header.type = type;
  header.length = payload.size();
  std::string out(sizeof header + payload.size(), '\0');
  std::memcpy(out.data(), &header, sizeof header);
  if (!payload.empty()) std::memcpy(out.data() + sizeof header, payload.data(), payload.size());
  return out;
}

json layout_json(const KvLayout& layout) {
  return {{"num_layers", layout.num_layers}, {"num_kv_heads", layout.num_kv_heads}, {"head_dim", layout.head_dim},
          {"dtype", std::string(dtype_name(layout.dtype))}};
}

KvLayout layout_from_json(const json& value) {
  KvLayout layout;
  layout.num_layers = integer<int32_t>(value.at("num_layers"), "layout.num_layers");
  layout.num_kv_heads = integer<int32_t>(value.at("num_kv_heads"), "layout.num_kv_heads");
  layout.head_dim = integer<int32_t>(value.at("head_dim"), "layout.head_dim");
  layout.dtype = parse_dtype(value.at("dtype").get<std::string>());
  SF_CHECK(layout.num_layers > 0 && layout.num_kv_heads > 0 && layout.head_dim > 0, "invalid KV layout {}",
           value.dump());
  return layout;
}

json stats_json(const TransferStats& stats) {
  return {{"bytes", stats.bytes}, {"first_layer_ms", stats.first_layer_ms}, {"computed_ms", stats.computed_ms},
          {"sent_ms", stats.sent_ms}};
}

TransferStats stats_from_json(const json& value) {
  TransferStats stats;
  stats.bytes = value.contains("bytes") ? integer<int64_t>(value["bytes"], "bytes") : 0;
  stats.first_layer_ms = value.value("first_layer_ms", 0.0);
  stats.computed_ms = value.value("computed_ms", 0.0);
  stats.sent_ms = value.value("sent_ms", 0.0);
  return stats;
}

std::string error_payload(const std::string& message) { return json{{"message", message}}.dump(); }

std::string request_payload(const TransferRequest& request, std::chrono::milliseconds idle_timeout) {
  return json{{"transfer_id", request.transfer_id},
              {"token_ids", request.token_ids},
              {"mode", std::string(transfer_mode_name(request.mode))},
              {"layout", layout_json(request.layout)},
              {"idle_timeout_ms", idle_timeout.count()}}
      .dump();
}

void check_request_header(const FrameHeader& header) {
  SF_CHECK(header.magic == kMagic && header.type == kRequest && header.length <= kMaxJsonFrame,
           "malformed transfer request: expected a Request frame of at most {} bytes (got type {}, {} bytes)",
           kMaxJsonFrame, header.type, header.length);
}

ParsedRequest parse_request(std::string_view payload) {
  ParsedRequest parsed;
  try {
    const json body = json::parse(payload);
    TransferRequest& request = parsed.request;
    request.transfer_id = body.at("transfer_id").get<std::string>();
    const json& token_ids = body.at("token_ids");
    SF_CHECK(token_ids.is_array(), "token_ids must be an array");
    request.token_ids.reserve(token_ids.size());
    for (const json& id : token_ids) request.token_ids.push_back(integer<int32_t>(id, "a token id"));
    request.mode = parse_transfer_mode(body.at("mode").get<std::string>());
    request.layout = layout_from_json(body.at("layout"));
    const int64_t ms = body.contains("idle_timeout_ms") ? integer<int64_t>(body["idle_timeout_ms"], "idle_timeout_ms") : 0;
    if (ms > 0) parsed.receiver_timeout = std::chrono::milliseconds(ms);
    SF_CHECK(!request.token_ids.empty(), "the transfer request names no tokens");
  } catch (const std::exception& e) {
    throw Error(fmt::format("malformed transfer request: {}", e.what()));
  }
  return parsed;
}

RowsReceiver::RowsReceiver(int32_t num_layers, int32_t num_tokens, int64_t row_bytes)
    : next_(static_cast<size_t>(std::max(num_layers, 0)), 0), num_tokens_(num_tokens), row_bytes_(row_bytes) {
  SF_CHECK(num_layers > 0 && num_tokens > 0 && row_bytes > 0, "a KV transfer of {} layers x {} tokens x {} bytes",
           num_layers, num_tokens, row_bytes);
}

RowsReceiver::Next RowsReceiver::on_header(const FrameHeader& header) const {
  if (header.magic == kMagic && header.type == kWait && header.length == 0) return Next::Wait;
  uint64_t limit = 0;
  switch (header.type) {
    case kRows: limit = kRowsHeaderBytes + 2 * static_cast<uint64_t>(num_tokens_) * static_cast<uint64_t>(row_bytes_); break;
    case kDone:
    case kError: limit = kMaxJsonFrame; break;
    default: limit = 0;
  }
  SF_CHECK(header.magic == kMagic && limit != 0 && header.length <= limit, "malformed frame (type {}, {} bytes)",
           header.type, header.length);
  return Next::Payload;
}

int64_t RowsReceiver::on_rows(std::string_view payload, std::vector<std::vector<char>>& k,
                              std::vector<std::vector<char>>& v) {
  SF_CHECK(payload.size() >= kRowsHeaderBytes, "malformed Rows frame: {} bytes, shorter than its header",
           payload.size());
  int32_t fields[4];
  std::memcpy(fields, payload.data(), sizeof fields);
  const int32_t layer = fields[0], first = fields[1], count = fields[2];
  const auto layers = static_cast<int32_t>(next_.size());
  const bool known_layer = layer >= 0 && layer < layers;
  // first == next_[layer] >= 0 and count <= num_tokens - first keep the copy inside the layer's rows.
  SF_CHECK(known_layer && count > 0 && first == next_[static_cast<size_t>(layer)] && first <= num_tokens_ - count &&
               payload.size() == kRowsHeaderBytes + 2 * static_cast<size_t>(count) * static_cast<size_t>(row_bytes_),
           "malformed Rows frame: layer {}, positions [{}, {}), {} bytes (expected layer < {}, first {}, at most {} "
           "tokens, {} bytes a row)",
           layer, first, static_cast<int64_t>(first) + count, payload.size(), layers,
           known_layer ? next_[static_cast<size_t>(layer)] : -1, num_tokens_, row_bytes_);
  const size_t size = static_cast<size_t>(num_tokens_) * static_cast<size_t>(row_bytes_);
  SF_CHECK(k.size() == next_.size() && v.size() == next_.size() && k[static_cast<size_t>(layer)].size() == size &&
               v[static_cast<size_t>(layer)].size() == size,
           "KV staging for layer {} does not hold {} tokens x {} bytes", layer, num_tokens_, row_bytes_);
  const size_t at = static_cast<size_t>(first) * static_cast<size_t>(row_bytes_);
  const size_t bytes = static_cast<size_t>(count) * static_cast<size_t>(row_bytes_);
  std::memcpy(k[static_cast<size_t>(layer)].data() + at, payload.data() + kRowsHeaderBytes, bytes);
  std::memcpy(v[static_cast<size_t>(layer)].data() + at, payload.data() + kRowsHeaderBytes + bytes, bytes);
  next_[static_cast<size_t>(layer)] += count;
  return 2 * static_cast<int64_t>(bytes);
}

TransferStats RowsReceiver::on_done(std::string_view payload) const {
  for (size_t layer = 0; layer < next_.size(); ++layer)
    SF_CHECK(next_[layer] == num_tokens_, "the transfer ended with layer {} at {} of {} rows", layer, next_[layer],
             num_tokens_);
  try {
    return stats_from_json(json::parse(payload));
  } catch (const std::exception& e) {
    throw Error(fmt::format("malformed Done frame: {}", e.what()));
  }
}

std::string RowsReceiver::error_message(std::string_view payload) {
  try {
    const json body = json::parse(payload);
    if (body.is_object() && body.contains("message") && body["message"].is_string())
      return body["message"].get<std::string>();
  } catch (const std::exception&) {
  }
  return std::string(payload);
}

}  // namespace wire
}  // namespace splitflow::splitwise
