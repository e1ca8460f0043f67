// server/metrics.h — what `/metrics` reports, in the Prometheus text format (version 0.0.4):
// latency histograms (time to first token, inter-token latency, end-to-end, engine step), token
// and request counters, and gauges of the engine's state (queues, KV cache, prefix cache). The
// AsyncEngine feeds it from its loop; the HTTP server renders it. Thread-safe; it never touches
// the engine. Every metric is named splitflow_*; docs/serving.md lists them.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace splitflow {

// One `# HELP`, `# TYPE` and sample line, appended to `out`.
void render_counter(std::string& out, std::string_view name, std::string_view help, int64_t value);
void render_gauge(std::string& out, std::string_view name, std::string_view help, double value);

class Histogram {
 public:
  // upper_bounds: increasing, finite; a +Inf bucket is implied.
  explicit Histogram(std::vector<double> upper_bounds);

  void observe(double value);
  // _bucket{le=...} lines with cumulative counts, then _sum and _count, after # HELP / # TYPE.
  void render(std::string& out, std::string_view name, std::string_view help) const;

  const std::vector<double>& upper_bounds() const { return upper_bounds_; }
  // (upper_bounds + 1) per-bucket counts, not cumulative; the last is the +Inf bucket.
  const std::vector<uint64_t>& bucket_counts() const { return counts_; }
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> upper_bounds_;
  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  double sum_ = 0.0;
};

// The engine's state after a step, as the loop sees it.
struct EngineGauges {
  int32_t requests_pending = 0;    // submitted, not yet handed to the engine
  int32_t requests_in_engine = 0;  // unfinished requests the engine holds
  int32_t sequences_waiting = 0;
  int32_t sequences_running = 0;
  int32_t sequences_swapped = 0;   // preempted with their KV in host memory
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_free = 0;          // unreferenced, cached ones included
  int32_t kv_blocks_cached_free = 0;   // unreferenced but holding a prefix-cache entry
  int64_t prefix_cache_queried_blocks = 0;
  int64_t prefix_cache_hit_blocks = 0;
  int64_t preemptions = 0;  // by recompute and by swap
  int64_t swap_outs = 0;    // preemptions by swap
};

class ServingMetrics {
 public:
  // Over how many seconds the tokens/s gauges are averaged.
  static constexpr double kThroughputWindowS = 10.0;

  ServingMetrics();

  void observe_time_to_first_token(double seconds);
  void observe_inter_token_latency(double seconds);
  void observe_e2e_latency(double seconds);
  // One engine step at now_s (a steady clock in seconds): its duration and tokens.
  void record_step(double now_s, double duration_s, int32_t prefill_tokens, int32_t decode_tokens,
                   int32_t generated_tokens);
  void add_prompt_tokens(int64_t tokens);  // prompts handed to the engine
  void count_finished(std::string_view finish_reason);  // stop, length, abort, error
  void count_rejected(std::string_view reason);          // queue_full, shutting_down
  void set_gauges(const EngineGauges& gauges);

  std::string render(double now_s) const;

 private:
  struct CounterSample {
    double time_s;
    int64_t prompt_tokens;
    int64_t generation_tokens;
  };
  double rate(double now_s, int64_t CounterSample::*field, int64_t current) const;

  mutable std::mutex mutex_;
  Histogram ttft_, itl_, e2e_, step_;
  int64_t prompt_tokens_ = 0;      // of requests handed to the engine
  int64_t generation_tokens_ = 0;  // sampled tokens
  int64_t prefill_tokens_computed_ = 0;  // prompt chunks and recomputation actually run
  int64_t steps_ = 0;
  std::map<std::string, int64_t, std::less<>> finished_;
  std::map<std::string, int64_t, std::less<>> rejected_;
  EngineGauges gauges_;
  std::deque<CounterSample> samples_;  // per step, the last kThroughputWindowS seconds and one before
};

}  // namespace splitflow
