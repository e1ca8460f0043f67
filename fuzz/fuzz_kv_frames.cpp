// fuzz/fuzz_kv_frames.cpp — the Splitwise KV transfer's wire format (splitwise/kv_frames.h) as the
// token side and the prompt side read it from a socket. The first three bytes pick the transfer's
// shape (1-4 layers, 1-16 tokens, 1-16 bytes a row, small so whole valid transfers are reachable);
// the rest is a stream of frames, each a 16-byte header and the payload its length names. A Request
// frame goes through the prompt side's checks and must survive a round trip; the others go through
// the token side's RowsReceiver, whose row copies land in staging of exactly the transfer's size (so
// AddressSanitizer sees any write past it). A splitflow::Error ends the transfer, as it closes the
// connection in tcp_kv_transport.cpp.
#include "fuzz_support.h"
#include "splitwise/kv_frames.h"

#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace splitflow::splitwise;
  using namespace splitflow::splitwise::wire;
  if (size < 3) return 0;
  const int32_t layers = data[0] % 4 + 1, tokens = data[1] % 16 + 1, row_bytes = data[2] % 16 + 1;
  std::string_view rest(reinterpret_cast<const char*>(data) + 3, size - 3);
  splitflow::fuzz::expect_error_or_success([&] {
    RowsReceiver receiver(layers, tokens, row_bytes);
    std::vector<std::vector<char>> k(layers, std::vector<char>(static_cast<size_t>(tokens * row_bytes)));
    std::vector<std::vector<char>> v = k;
    while (rest.size() >= sizeof(FrameHeader)) {
      FrameHeader header;
      std::memcpy(&header, rest.data(), sizeof header);
      rest.remove_prefix(sizeof header);
      if (header.type == kRequest) {
        check_request_header(header);
        if (header.length > rest.size()) return;  // the connection ends mid-payload
        const ParsedRequest parsed = parse_request(rest.substr(0, header.length));
        rest.remove_prefix(header.length);
        const ParsedRequest again = parse_request(request_payload(parsed.request, parsed.receiver_timeout));
        if (again.request.transfer_id != parsed.request.transfer_id ||
            again.request.token_ids != parsed.request.token_ids || again.request.mode != parsed.request.mode ||
            !(again.request.layout == parsed.request.layout))
          std::abort();  // what the token side writes is not what the prompt side read
        continue;
      }
      if (receiver.on_header(header) == RowsReceiver::Next::Wait) continue;
      if (header.length > rest.size()) return;
      const std::string_view payload = rest.substr(0, header.length);
      rest.remove_prefix(header.length);
      if (header.type == kRows) {
        if (receiver.on_rows(payload, k, v) <= 0) std::abort();  // an accepted frame copies rows
      } else if (header.type == kError) {
        (void)RowsReceiver::error_message(payload);
        return;
      } else {
        (void)receiver.on_done(payload);
        return;
      }
    }
  });
  return 0;
}
