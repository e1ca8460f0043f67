// The Splitwise KV transfer's frames (splitwise/kv_frames.h), built here byte by byte from the
// format tcp_kv_transport.h documents: a whole transfer lands in staging exactly as sent, and every
// hostile frame (out of order, out of range, short, long, unknown, early Done) is refused by name
// before a byte is copied.
#include "splitwise/kv_frames.h"

#include <gtest/gtest.h>

#include <cstring>

using namespace splitflow::splitwise;
using namespace splitflow::splitwise::wire;

namespace {

constexpr int32_t kLayers = 2, kTokens = 3, kRowBytes = 4;

FrameHeader header_of(uint8_t type, uint64_t length, uint32_t magic = 0x564B4653) {
  FrameHeader header;
  header.magic = magic;
  header.type = type;
  header.length = length;
  return header;
}

// A Rows payload: {layer, first, count, 0}, then count K rows, then count V rows.
std::string rows_payload(int32_t layer, int32_t first, int32_t count, const std::vector<char>& k,
                         const std::vector<char>& v) {
  std::string payload(16, '\0');
  const int32_t fields[4] = {layer, first, count, 0};
  std::memcpy(payload.data(), fields, 16);
  payload.append(k.data() + first * kRowBytes, static_cast<size_t>(count) * kRowBytes);
  payload.append(v.data() + first * kRowBytes, static_cast<size_t>(count) * kRowBytes);
  return payload;
}

std::vector<char> pattern(int seed) {
  std::vector<char> bytes(kTokens * kRowBytes);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(seed * 31 + static_cast<int>(i) * 7);
  return bytes;
}

struct Staging {
  std::vector<std::vector<char>> k{kLayers, std::vector<char>(kTokens * kRowBytes)};
  std::vector<std::vector<char>> v = k;
};

template <typename F>
void expect_refused(F&& f, const std::string& words) {
  try {
    f();
    FAIL() << "accepted; expected an error naming '" << words << "'";
  } catch (const splitflow::Error& error) {
    EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
  }
}

}  // namespace

TEST(KvFrames, AWholeTransferLandsAsSent) {
  RowsReceiver receiver(kLayers, kTokens, kRowBytes);
  Staging staging;
  const std::vector<char> k0 = pattern(1), v0 = pattern(2), k1 = pattern(3), v1 = pattern(4);
  EXPECT_EQ(receiver.on_header(header_of(kWait, 0)), RowsReceiver::Next::Wait);
  const std::string first = rows_payload(0, 0, 3, k0, v0);
  ASSERT_EQ(receiver.on_header(header_of(kRows, first.size())), RowsReceiver::Next::Payload);
  EXPECT_EQ(receiver.on_rows(first, staging.k, staging.v), 2 * 3 * kRowBytes);
  // Layer 1 in two pieces, positions in order.
  EXPECT_EQ(receiver.on_rows(rows_payload(1, 0, 1, k1, v1), staging.k, staging.v), 2 * kRowBytes);
  EXPECT_EQ(receiver.on_rows(rows_payload(1, 1, 2, k1, v1), staging.k, staging.v), 2 * 2 * kRowBytes);
  EXPECT_EQ(staging.k[0], k0);
  EXPECT_EQ(staging.v[0], v0);
  EXPECT_EQ(staging.k[1], k1);
  EXPECT_EQ(staging.v[1], v1);
  const TransferStats stats = receiver.on_done(R"({"bytes": 96, "first_layer_ms": 1.5, "computed_ms": 2, "sent_ms": 2.5})");
  EXPECT_EQ(stats.bytes, 96);
  EXPECT_DOUBLE_EQ(stats.first_layer_ms, 1.5);
  EXPECT_DOUBLE_EQ(stats.sent_ms, 2.5);
}

TEST(KvFrames, HostileRowsAreRefusedBeforeAByteIsCopied) {
  const std::vector<char> k = pattern(5), v = pattern(6);
  RowsReceiver receiver(kLayers, kTokens, kRowBytes);
  Staging staging;
  const Staging untouched = staging;
  expect_refused([&] { receiver.on_rows(rows_payload(0, 1, 1, k, v), staging.k, staging.v); }, "positions [1, 2)");
  expect_refused([&] { receiver.on_rows(rows_payload(2, 0, 1, k, v), staging.k, staging.v); }, "layer 2");
  expect_refused([&] { receiver.on_rows(rows_payload(-1, 0, 1, k, v), staging.k, staging.v); }, "layer -1");
  expect_refused([&] { receiver.on_rows(rows_payload(0, 0, 0, k, v), staging.k, staging.v); }, "positions [0, 0)");
  std::string past_end = rows_payload(0, 0, 3, k, v);
  const int32_t four = 4;
  std::memcpy(past_end.data() + 8, &four, 4);  // claims 4 rows of a 3-token transfer
  expect_refused([&] { receiver.on_rows(past_end, staging.k, staging.v); }, "at most 3 tokens");
  std::string short_rows = rows_payload(0, 0, 2, k, v);
  short_rows.pop_back();
  expect_refused([&] { receiver.on_rows(short_rows, staging.k, staging.v); }, "bytes");
  expect_refused([&] { receiver.on_rows(std::string(15, '\0'), staging.k, staging.v); }, "shorter than its header");
  EXPECT_EQ(staging.k, untouched.k);
  EXPECT_EQ(staging.v, untouched.v);
  // A repeated frame is out of order too.
  receiver.on_rows(rows_payload(0, 0, 2, k, v), staging.k, staging.v);
  expect_refused([&] { receiver.on_rows(rows_payload(0, 0, 2, k, v), staging.k, staging.v); }, "expected layer < 2, first 2");
}

TEST(KvFrames, HeadersAndEndingsAreChecked) {
  RowsReceiver receiver(kLayers, kTokens, kRowBytes);
  expect_refused([&] { receiver.on_header(header_of(kRows, 16, 0x12345678)); }, "malformed frame");
  expect_refused([&] { receiver.on_header(header_of(kRows, 16 + 2 * 3 * kRowBytes + 1)); }, "malformed frame");
  expect_refused([&] { receiver.on_header(header_of(kRequest, 10)); }, "type 1");  // not for the token side
  expect_refused([&] { receiver.on_header(header_of(9, 0)); }, "type 9");
  expect_refused([&] { receiver.on_header(header_of(kDone, kMaxJsonFrame + 1)); }, "malformed frame");
  expect_refused([&] { receiver.on_done("{}"); }, "layer 0 at 0 of 3 rows");
  {
    RowsReceiver one(1, 1, 1);
    std::vector<std::vector<char>> k{std::vector<char>(1)}, v = k;
    std::string rows(16, '\0');
    const int32_t fields[4] = {0, 0, 1, 0};
    std::memcpy(rows.data(), fields, 16);
    one.on_rows(rows + "kv", k, v);
    expect_refused([&] { one.on_done(R"({"bytes": 1e300})"); }, "bytes must be an integer");
  }
  EXPECT_EQ(RowsReceiver::error_message(R"({"message": "prefill failed"})"), "prefill failed");
  EXPECT_EQ(RowsReceiver::error_message("not json"), "not json");
  EXPECT_THROW(RowsReceiver(0, 3, 4), splitflow::Error);
}

TEST(KvFrames, RequestsRoundTripAndBadOnesAreNamed) {
  TransferRequest request;
  request.transfer_id = "req-7";
  request.token_ids = {1, 2, 3};
  request.mode = TransferMode::Serialized;
  request.layout = {2, 1, 2, splitflow::DType::F32};
  const ParsedRequest parsed = parse_request(request_payload(request, std::chrono::milliseconds(1500)));
  EXPECT_EQ(parsed.request.transfer_id, "req-7");
  EXPECT_EQ(parsed.request.token_ids, request.token_ids);
  EXPECT_EQ(parsed.request.mode, TransferMode::Serialized);
  EXPECT_EQ(parsed.request.layout, request.layout);
  EXPECT_EQ(parsed.receiver_timeout.count(), 1500);
  const std::string layout = R"("layout": {"num_layers": 2, "num_kv_heads": 1, "head_dim": 2, "dtype": "f32"})";
  expect_refused([&] { parse_request(R"({"transfer_id": "a", "token_ids": [], "mode": "layerwise", )" + layout + "}"); },
                 "names no tokens");
  expect_refused([&] { parse_request(R"({"transfer_id": "a", "token_ids": [1], "mode": "sideways", )" + layout + "}"); },
                 "unknown KV transfer mode 'sideways'");
  expect_refused([&] { parse_request(R"({"transfer_id": "a", "token_ids": [1], "mode": "layerwise"})"); }, "layout");
  expect_refused(
      [&] {
        parse_request(R"({"transfer_id": "a", "token_ids": [1], "mode": "layerwise", "layout": {"num_layers": 0,
                         "num_kv_heads": 1, "head_dim": 2, "dtype": "f32"}})");
      },
      "invalid KV layout");
  expect_refused([&] { parse_request("{not json"); }, "malformed transfer request");
  // Numbers that are not int32 are refused, never converted (fuzz/crashes/kv_frames: 29e92 as a token id).
  expect_refused([&] { parse_request(R"({"transfer_id": "a", "token_ids": [1, 29e92], "mode": "layerwise", )" + layout + "}"); },
                 "a token id must be an integer");
  expect_refused([&] { parse_request(R"({"transfer_id": "a", "token_ids": [4294967296], "mode": "layerwise", )" + layout + "}"); },
                 "a token id must be an integer");
  expect_refused(
      [&] {
        parse_request(R"({"transfer_id": "a", "token_ids": [1], "mode": "layerwise", "layout": {"num_layers": 2.5,
                         "num_kv_heads": 1, "head_dim": 2, "dtype": "f32"}})");
      },
      "layout.num_layers must be an integer");
  expect_refused(
      [&] {
        parse_request(R"({"transfer_id": "a", "token_ids": [1], "mode": "layerwise", )" + layout +
                      R"(, "idle_timeout_ms": 1e300})");
      },
      "idle_timeout_ms must be an integer");
  expect_refused([&] { check_request_header(header_of(kRows, 10)); }, "expected a Request frame");
  expect_refused([&] { check_request_header(header_of(kRequest, kMaxJsonFrame + 1)); }, "expected a Request frame");
}
