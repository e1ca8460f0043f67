// splitwise/kv_frames.h — the KV transfer's wire format (tcp_kv_transport.h lists the frames) as
// pure functions: building frames, reading a transfer request, and checking each frame the token
// side receives against what it asked for before a byte is copied. Owns no socket and no timer:
// tcp_kv_transport.cpp drives these, and fuzz/fuzz_kv_frames.cpp feeds them hostile bytes. Every
// refusal throws Error naming the field that is wrong.
#pragma once

#include "splitwise/kv_transfer.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace splitflow::splitwise::wire {

constexpr uint32_t kMagic = 0x564B4653;  // "SFKV"
enum FrameType : uint8_t { kRequest = 1, kRows = 2, kDone = 3, kError = 4, kAck = 5, kWait = 6 };
constexpr uint64_t kMaxJsonFrame = uint64_t{64} << 20;
constexpr size_t kRowsHeaderBytes = 16;  // {i32 layer, i32 first_position, i32 num_tokens, i32 0}

struct FrameHeader {
  uint32_t magic = kMagic;
  uint8_t type = 0;
  uint8_t pad[3] = {0, 0, 0};
  uint64_t length = 0;  // payload bytes
};
static_assert(sizeof(FrameHeader) == 16);

// Header and payload as one buffer.
std::string frame(FrameType type, std::string_view payload);

nlohmann::json layout_json(const KvLayout& layout);
KvLayout layout_from_json(const nlohmann::json& value);
nlohmann::json stats_json(const TransferStats& stats);
TransferStats stats_from_json(const nlohmann::json& value);
std::string error_payload(const std::string& message);

// The Request frame's JSON; idle_timeout: the receiver's patience, which sets the sender's heartbeat.
std::string request_payload(const TransferRequest& request, std::chrono::milliseconds idle_timeout);
struct ParsedRequest {
  TransferRequest request;
  std::chrono::milliseconds receiver_timeout{0};  // 0: the request gave none
};
// Checks the header (a Request of at most kMaxJsonFrame bytes), then the JSON: transfer_id,
// non-empty token_ids, mode, a valid layout.
void check_request_header(const FrameHeader& header);
ParsedRequest parse_request(std::string_view payload);

// The token side's check of one transfer's incoming frames: every Rows frame must continue its
// layer's rows in position order, inside the request's tokens, with exactly its rows' bytes.
class RowsReceiver {
 public:
  RowsReceiver(int32_t num_layers, int32_t num_tokens, int64_t row_bytes);

  enum class Next { Wait, Payload };
  // After a header: Wait (a heartbeat, no payload) or Payload (read header.length bytes, then call
  // on_rows / on_done / error_message by header.type). Throws on any other header: wrong magic, an
  // unknown or unexpected type, a payload longer than the frame can be.
  Next on_header(const FrameHeader& header) const;
  // A Rows payload, checked, then copied into k[layer] and v[layer] (each num_tokens x row_bytes,
  // as the caller allocated them). Returns the bytes copied (K and V).
  int64_t on_rows(std::string_view payload, std::vector<std::vector<char>>& k, std::vector<std::vector<char>>& v);
  // A Done payload: every layer must have all its rows; then the sender's stats.
  TransferStats on_done(std::string_view payload) const;
  // An Error payload's message (the payload itself when it is not {"message": ...}).
  static std::string error_message(std::string_view payload);

  int32_t num_tokens() const { return num_tokens_; }
  int64_t row_bytes() const { return row_bytes_; }

 private:
  std::vector<int32_t> next_;  // (layers) the position each layer's next rows must start at
  int32_t num_tokens_;
  int64_t row_bytes_;
};

}  // namespace splitflow::splitwise::wire
