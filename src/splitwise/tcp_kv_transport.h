// splitwise/tcp_kv_transport.h — KvTransport over TCP between processes (Boost.Asio, one I/O
// thread). The prompt side listens (--kv-port); the token side connects once per transfer, so a
// transfer's lifetime is its connection's: a sender that dies is seen at once (EOF or reset), a
// receiver that goes away stops the sender's export, and a connection with no progress for
// idle_timeout is closed by either side, which frees what it held (the receiver's reservation is
// aborted by its caller, the sender's staged rows are dropped).
//
// Frames (little-endian, as both ends are x86-64 or aarch64 hosts): a 16-byte header
// {u32 magic "SFKV", u8 type, 3 bytes zero, u64 payload bytes}, then the payload.
//   Request (token -> prompt): JSON {transfer_id, token_ids, mode, layout, idle_timeout_ms}
//   Rows    (prompt -> token): {i32 layer, i32 first_position, i32 num_tokens, i32 0},
//                              K rows [num_tokens, row_bytes], V rows [num_tokens, row_bytes]
//   Done    (prompt -> token): JSON TransferStats
//   Error   (either way):      JSON {message}
//   Ack     (token -> prompt): empty, once every row arrived
//   Wait    (prompt -> token): empty, every third of the receiver's idle_timeout_ms while the prefill waits or computes
//                              and nothing else is written (a busy sender is not a stalled one;
//                              10 idle timeouts without a row still fail the transfer)
// Each layer's rows arrive in position order without gaps; the receiver checks every length,
// layer and position against the request before copying a byte, and refuses anything else.
#pragma once

#include "splitwise/kv_transfer.h"
#include "splitwise/transfer_metrics.h"

#include <chrono>
#include <memory>
#include <string>

namespace splitflow::splitwise {

struct TcpKvConfig {
  std::string host = "127.0.0.1";  // where the prompt side listens
  int port = -1;                   // 0: any free port; -1: no listener (a token-only instance)
  // A transfer that makes no progress this long fails, on either side.
  std::chrono::milliseconds idle_timeout{30'000};
  // Fault injection for tests: every Rows frame waits this long before it is written.
  std::chrono::milliseconds debug_rows_delay{0};
};

class TcpKvTransport : public KvTransport {
 public:
  // handler: called for each transfer request this instance serves (null: requests are refused).
  TcpKvTransport(TcpKvConfig config, TransferMetrics& metrics, TransferHandler handler = nullptr);
  ~TcpKvTransport() override;  // stop()
  TcpKvTransport(const TcpKvTransport&) = delete;
  TcpKvTransport& operator=(const TcpKvTransport&) = delete;

  // Binds the listener (config.port >= 0) and starts the I/O thread; returns the port (0 without one).
  int start();
  // Closes the listener and every connection; callbacks of unfinished fetches never run.
  void stop();

  std::function<void()> fetch(const std::string& address, TransferRequest request, const KvCache& cache,
                              KvTarget target, FetchCallbacks callbacks) override;
  std::string address() const override;

  struct Impl;  // tcp_kv_transport.cpp's (its connections reach it)

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace splitflow::splitwise
