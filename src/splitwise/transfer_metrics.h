// splitwise/transfer_metrics.h — what an instance's KV transfers did, for /metrics (Prometheus
// text) and /splitwise/info (JSON): transfers sent and received (completed, failed, by reason of
// failure), bytes, host bytes staged now, and the timings of completed transfers (prompt side:
// first layer ready, prompt computed, last row written, the visible part; token side: the whole
// fetch). Thread-safe (a mutex): the transport's thread and the engine's thread both record.
#pragma once

#include "server/metrics.h"
#include "splitwise/kv_transfer.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <mutex>
#include <string>

namespace splitflow::splitwise {

class TransferMetrics {
 public:
  TransferMetrics();

  void sent(const TransferStats& stats);
  void send_failed();
  void received(const TransferStats& stats, double fetch_ms, int64_t bytes);
  void receive_failed(bool timed_out);
  void add_staged(int64_t bytes);  // negative to release

  void render(std::string& out) const;
  nlohmann::json to_json() const;

 private:
  mutable std::mutex mutex_;
  int64_t sent_ = 0, send_failed_ = 0, bytes_sent_ = 0;
  int64_t received_ = 0, receive_failed_ = 0, receive_timeouts_ = 0, bytes_received_ = 0;
  int64_t staged_bytes_ = 0;
  Histogram visible_ms_, compute_ms_, fetch_ms_;
  double last_visible_ms_ = 0, last_computed_ms_ = 0, last_sent_ms_ = 0, last_fetch_ms_ = 0;
};

}  // namespace splitflow::splitwise
