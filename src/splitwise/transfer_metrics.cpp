#include "splitwise/transfer_metrics.h"

namespace splitflow::splitwise {

namespace {
std::vector<double> ms_buckets() { return {0.1, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000}; }
}  // namespace

TransferMetrics::TransferMetrics() : visible_ms_(ms_buckets()), compute_ms_(ms_buckets()), fetch_ms_(ms_buckets()) {}

void TransferMetrics::sent(const TransferStats& stats) {
  std::lock_guard lock(mutex_);
  ++sent_;
  bytes_sent_ += stats.bytes;
  visible_ms_.observe(stats.visible_ms());
  compute_ms_.observe(stats.computed_ms);
  last_visible_ms_ = stats.visible_ms();
  last_computed_ms_ = stats.computed_ms;
  last_sent_ms_ = stats.sent_ms;
}

void TransferMetrics::send_failed() {
  std::lock_guard lock(mutex_);
  ++send_failed_;
}

void TransferMetrics::received(const TransferStats& stats, double fetch_ms, int64_t bytes) {
  std::lock_guard lock(mutex_);
  ++received_;
  bytes_received_ += bytes;
  fetch_ms_.observe(fetch_ms);
  last_fetch_ms_ = fetch_ms;
  (void)stats;
}

void TransferMetrics::receive_failed(bool timed_out) {
  std::lock_guard lock(mutex_);
  ++receive_failed_;
  if (timed_out) ++receive_timeouts_;
}

void TransferMetrics::add_staged(int64_t bytes) {
  std::lock_guard lock(mutex_);
  staged_bytes_ += bytes;
}

void TransferMetrics::render(std::string& out) const {
  std::lock_guard lock(mutex_);
  render_counter(out, "splitflow_kv_transfers_sent_total", "KV transfers this prompt instance completed", sent_);
  render_counter(out, "splitflow_kv_transfers_send_failed_total",
                 "KV transfers this prompt instance could not complete (receiver gone, timeout, prefill error)",
                 send_failed_);
  render_counter(out, "splitflow_kv_transfer_sent_bytes_total", "K and V bytes sent", bytes_sent_);
  render_counter(out, "splitflow_kv_transfers_received_total", "KV transfers this token instance completed", received_);
  render_counter(out, "splitflow_kv_transfers_receive_failed_total",
                 "KV transfers this token instance gave up (sender gone, error, malformed, stalled)", receive_failed_);
  render_counter(out, "splitflow_kv_transfer_receive_timeouts_total", "of those, stalled past --kv-transfer-timeout",
                 receive_timeouts_);
  render_counter(out, "splitflow_kv_transfer_received_bytes_total", "K and V bytes received", bytes_received_);
  render_gauge(out, "splitflow_kv_transfer_staged_bytes", "host bytes held by transfers in flight now",
               static_cast<double>(staged_bytes_));
  visible_ms_.render(out, "splitflow_kv_transfer_visible_ms",
                     "prompt side: ms from the prompt's last layer computed to its last row written");
  compute_ms_.render(out, "splitflow_kv_transfer_prompt_compute_ms",
                     "prompt side: ms from the transfer request to the prompt's last layer computed");
  fetch_ms_.render(out, "splitflow_kv_transfer_fetch_ms", "token side: ms from asking for the KV to the last row received");
}

nlohmann::json TransferMetrics::to_json() const {
  std::lock_guard lock(mutex_);
  return {{"sent", sent_},
          {"send_failed", send_failed_},
          {"sent_bytes", bytes_sent_},
          {"received", received_},
          {"receive_failed", receive_failed_},
          {"receive_timeouts", receive_timeouts_},
          {"received_bytes", bytes_received_},
          {"staged_bytes", staged_bytes_},
          {"last_prompt_compute_ms", last_computed_ms_},
          {"last_sent_ms", last_sent_ms_},
          {"last_visible_ms", last_visible_ms_},
          {"last_fetch_ms", last_fetch_ms_},
          {"mean_visible_ms", visible_ms_.count() ? visible_ms_.sum() / visible_ms_.count() : 0.0},
          {"mean_prompt_compute_ms", compute_ms_.count() ? compute_ms_.sum() / compute_ms_.count() : 0.0},
          {"mean_fetch_ms", fetch_ms_.count() ? fetch_ms_.sum() / fetch_ms_.count() : 0.0}};
}

}  // namespace splitflow::splitwise
