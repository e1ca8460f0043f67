#include "server/metrics.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace splitflow {

namespace {

// Seconds; fine at the low end for small models on the CPU, up to minutes for long requests.
std::vector<double> latency_buckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
          0.75, 1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0};
}

void render_labelled_counter(std::string& out, std::string_view name, std::string_view help, std::string_view label,
                             const std::map<std::string, int64_t, std::less<>>& values) {
  out += fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n", name, help);
  for (const auto& [key, value] : values) out += fmt::format("{}{{{}=\"{}\"}} {}\n", name, label, key, value);
}

// Prometheus' float spelling: "+Inf", otherwise the shortest round-trip form.
std::string le_label(double bound) { return std::isinf(bound) ? "+Inf" : fmt::format("{}", bound); }

}  // namespace

void render_counter(std::string& out, std::string_view name, std::string_view help, int64_t value) {
  out += fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n{0} {2}\n", name, help, value);
}

void render_gauge(std::string& out, std::string_view name, std::string_view help, double value) {
  out += fmt::format("# HELP {0} {1}\n# TYPE {0} gauge\n{0} {2}\n", name, help, value);
}


Histogram::Histogram(std::vector<double> upper_bounds) : upper_bounds_(std::move(upper_bounds)) {
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    SF_CHECK(std::isfinite(upper_bounds_[i]) && (i == 0 || upper_bounds_[i] > upper_bounds_[i - 1]),
             "histogram: bucket bound {} = {} must be finite and above the previous one", i, upper_bounds_[i]);
  }
  counts_.assign(upper_bounds_.size() + 1, 0);
}

void Histogram::observe(double value) {
  // Prometheus buckets are "less than or equal": the first bound >= value.
  const auto it = std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value);
  ++counts_[static_cast<size_t>(it - upper_bounds_.begin())];
  ++count_;
  sum_ += value;
}

void Histogram::render(std::string& out, std::string_view name, std::string_view help) const {
  out += fmt::format("# HELP {0} {1}\n# TYPE {0} histogram\n", name, help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    cumulative += counts_[i];
    const double bound = i < upper_bounds_.size() ? upper_bounds_[i] : INFINITY;
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, le_label(bound), cumulative);
  }
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, count_);
}

ServingMetrics::ServingMetrics()
    : ttft_(latency_buckets()), itl_(latency_buckets()), e2e_(latency_buckets()), step_(latency_buckets()) {}

void ServingMetrics::observe_time_to_first_token(double seconds) {
  std::lock_guard lock(mutex_);
  ttft_.observe(seconds);
}

void ServingMetrics::observe_inter_token_latency(double seconds) {
  std::lock_guard lock(mutex_);
  itl_.observe(seconds);
}

void ServingMetrics::observe_e2e_latency(double seconds) {
  std::lock_guard lock(mutex_);
  e2e_.observe(seconds);
}

void ServingMetrics::record_step(double now_s, double duration_s, int32_t prefill_tokens, int32_t decode_tokens,
                                 int32_t generated_tokens) {
  std::lock_guard lock(mutex_);
  step_.observe(duration_s);
  ++steps_;
  prefill_tokens_computed_ += prefill_tokens;
  generation_tokens_ += generated_tokens;
  samples_.push_back({now_s, prefill_tokens_computed_, generation_tokens_});
  // Keep one sample at or before the window's start as the baseline.
  while (samples_.size() > 1 && samples_[1].time_s <= now_s - kThroughputWindowS) samples_.pop_front();
}

void ServingMetrics::add_prompt_tokens(int64_t tokens) {
  std::lock_guard lock(mutex_);
  prompt_tokens_ += tokens;
}

void ServingMetrics::count_finished(std::string_view finish_reason) {
  std::lock_guard lock(mutex_);
  auto it = finished_.find(finish_reason);
  if (it == finished_.end()) it = finished_.emplace(std::string(finish_reason), 0).first;
  ++it->second;
}

void ServingMetrics::count_rejected(std::string_view reason) {
  std::lock_guard lock(mutex_);
  auto it = rejected_.find(reason);
  if (it == rejected_.end()) it = rejected_.emplace(std::string(reason), 0).first;
  ++it->second;
}

void ServingMetrics::set_gauges(const EngineGauges& gauges) {
  std::lock_guard lock(mutex_);
  gauges_ = gauges;
}

double ServingMetrics::rate(double now_s, int64_t CounterSample::*field, int64_t current) const {
  // The newest sample at or before the window's start, else the oldest one.
  const CounterSample* baseline = nullptr;
  for (const CounterSample& sample : samples_) {
    if (baseline != nullptr && sample.time_s > now_s - kThroughputWindowS) break;
    baseline = &sample;
  }
  if (baseline == nullptr || now_s <= baseline->time_s) return 0.0;
  return static_cast<double>(current - baseline->*field) / (now_s - baseline->time_s);
}

std::string ServingMetrics::render(double now_s) const {
  std::lock_guard lock(mutex_);
  std::string out;
  ttft_.render(out, "splitflow_time_to_first_token_seconds", "Time from a request's arrival to its first token.");
  itl_.render(out, "splitflow_inter_token_latency_seconds", "Time between consecutive tokens of one sequence.");
  e2e_.render(out, "splitflow_e2e_request_latency_seconds", "Time from a request's arrival to its last token.");
  step_.render(out, "splitflow_engine_step_seconds", "Duration of one engine step (schedule, forward, sample).");

  render_counter(out, "splitflow_prompt_tokens_total", "Prompt tokens of the requests handed to the engine.",
                 prompt_tokens_);
  render_counter(out, "splitflow_prefill_tokens_computed_total",
                 "Prompt tokens run through the model (prefix-cache hits excluded, recomputation included).",
                 prefill_tokens_computed_);
  render_counter(out, "splitflow_generation_tokens_total", "Tokens sampled.", generation_tokens_);
  render_counter(out, "splitflow_engine_steps_total", "Engine steps run.", steps_);
  render_counter(out, "splitflow_preemptions_total", "Sequences preempted (by recompute or by swap).",
                 gauges_.preemptions);
  render_counter(out, "splitflow_swap_outs_total", "Sequences preempted by swapping their KV to host memory.",
                 gauges_.swap_outs);
  render_labelled_counter(out, "splitflow_request_finished_total", "Finished sequences by finish reason.",
                          "finished_reason", finished_);
  render_labelled_counter(out, "splitflow_requests_rejected_total", "Requests refused before reaching the engine.",
                          "reason", rejected_);
  render_counter(out, "splitflow_prefix_cache_queries_total", "Full KV blocks looked up in the prefix cache.",
                 gauges_.prefix_cache_queried_blocks);
  render_counter(out, "splitflow_prefix_cache_hits_total", "Full KV blocks found in the prefix cache.",
                 gauges_.prefix_cache_hit_blocks);

  render_gauge(out, "splitflow_prompt_throughput_tokens_per_second",
               "Prompt tokens computed per second over the last 10 s.",
               rate(now_s, &CounterSample::prompt_tokens, prefill_tokens_computed_));
  render_gauge(out, "splitflow_generation_throughput_tokens_per_second", "Tokens sampled per second over the last 10 s.",
               rate(now_s, &CounterSample::generation_tokens, generation_tokens_));
  render_gauge(out, "splitflow_num_requests_pending", "Requests accepted but not yet handed to the engine.",
               gauges_.requests_pending);
  render_gauge(out, "splitflow_num_requests_running", "Unfinished requests in the engine.", gauges_.requests_in_engine);
  render_gauge(out, "splitflow_num_sequences_waiting", "Sequences waiting for admission (preempted ones included).",
               gauges_.sequences_waiting);
  render_gauge(out, "splitflow_num_sequences_running", "Sequences holding KV blocks.", gauges_.sequences_running);
  render_gauge(out, "splitflow_num_sequences_swapped", "Preempted sequences whose KV is in host memory.",
               gauges_.sequences_swapped);
  render_gauge(out, "splitflow_kv_cache_blocks_total", "KV cache blocks.", gauges_.kv_blocks_total);
  render_gauge(out, "splitflow_kv_cache_blocks_free", "KV cache blocks no sequence references (cached ones included).",
               gauges_.kv_blocks_free);
  render_gauge(out, "splitflow_kv_cache_usage_ratio", "Fraction of KV cache blocks referenced by sequences.",
               gauges_.kv_blocks_total ? 1.0 - static_cast<double>(gauges_.kv_blocks_free) / gauges_.kv_blocks_total : 0.0);
  render_gauge(out, "splitflow_prefix_cache_cached_free_blocks", "Free KV blocks still holding a prefix-cache entry.",
               gauges_.kv_blocks_cached_free);
  render_gauge(out, "splitflow_prefix_cache_hit_rate", "Prefix-cache hits over lookups, in full blocks, since start.",
               gauges_.prefix_cache_queried_blocks
                   ? static_cast<double>(gauges_.prefix_cache_hit_blocks) / gauges_.prefix_cache_queried_blocks
                   : 0.0);
  return out;
}

}  // namespace splitflow
