// ServingMetrics and Histogram: bucket arithmetic by hand, the Prometheus text format (0.0.4)
// line by line, and the tokens/s gauges over their window.
#include "server/metrics.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <sstream>

namespace splitflow {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (l == line) return true;
  }
  return false;
}

TEST(Histogram, CountsLessOrEqualBucketsCumulatively) {
  Histogram h({0.1, 0.5, 1.0});
  for (const double v : {0.05, 0.1, 0.3, 0.5, 0.7, 2.0, 3.0}) h.observe(v);
  // le=0.1: 0.05, 0.1; le=0.5: + 0.3, 0.5; le=1: + 0.7; +Inf: + 2, 3.
  EXPECT_EQ(h.bucket_counts(), (std::vector<uint64_t>{2, 2, 1, 2}));
  EXPECT_EQ(h.count(), 7u);
  EXPECT_DOUBLE_EQ(h.sum(), 6.65);
  std::string text;
  h.render(text, "x_seconds", "help text");
  EXPECT_TRUE(has_line(text, "# HELP x_seconds help text"));
  EXPECT_TRUE(has_line(text, "# TYPE x_seconds histogram"));
  EXPECT_TRUE(has_line(text, "x_seconds_bucket{le=\"0.1\"} 2"));
  EXPECT_TRUE(has_line(text, "x_seconds_bucket{le=\"0.5\"} 4"));
  EXPECT_TRUE(has_line(text, "x_seconds_bucket{le=\"1\"} 5"));
  EXPECT_TRUE(has_line(text, "x_seconds_bucket{le=\"+Inf\"} 7"));
  EXPECT_TRUE(has_line(text, "x_seconds_count 7"));
  EXPECT_TRUE(has_line(text, "x_seconds_sum 6.65"));
}

TEST(Histogram, RejectsUnorderedOrInfiniteBounds) {
  EXPECT_THROW(Histogram({1.0, 0.5}), Error);
  EXPECT_THROW(Histogram({1.0, 1.0}), Error);
  EXPECT_THROW(Histogram({1.0, INFINITY}), Error);
}

TEST(ServingMetrics, RendersCountersGaugesAndRates) {
  ServingMetrics metrics;
  metrics.observe_time_to_first_token(0.02);
  metrics.observe_inter_token_latency(0.004);
  metrics.observe_e2e_latency(1.5);
  metrics.add_prompt_tokens(100);
  metrics.count_finished("stop");
  metrics.count_finished("stop");
  metrics.count_finished("abort");
  metrics.count_rejected("queue_full");
  // Steps at t = 1, 2, ..., 20 s, each 50 prefill and 10 generated tokens.
  for (int t = 1; t <= 20; ++t) metrics.record_step(t, 0.01, 50, 10, 10);
  EngineGauges gauges;
  gauges.kv_blocks_total = 200;
  gauges.kv_blocks_free = 150;
  gauges.sequences_running = 3;
  gauges.sequences_waiting = 2;
  gauges.prefix_cache_queried_blocks = 40;
  gauges.prefix_cache_hit_blocks = 10;
  gauges.preemptions = 4;
  gauges.swap_outs = 3;
  gauges.sequences_swapped = 1;
  metrics.set_gauges(gauges);

  const std::string text = metrics.render(20.0);
  EXPECT_TRUE(has_line(text, "splitflow_time_to_first_token_seconds_count 1"));
  EXPECT_TRUE(has_line(text, "splitflow_inter_token_latency_seconds_count 1"));
  EXPECT_TRUE(has_line(text, "splitflow_e2e_request_latency_seconds_bucket{le=\"1.5\"} 1"));
  EXPECT_TRUE(has_line(text, "splitflow_engine_step_seconds_count 20"));
  EXPECT_TRUE(has_line(text, "splitflow_prompt_tokens_total 100"));
  EXPECT_TRUE(has_line(text, "splitflow_prefill_tokens_computed_total 1000"));
  EXPECT_TRUE(has_line(text, "splitflow_generation_tokens_total 200"));
  EXPECT_TRUE(has_line(text, "splitflow_preemptions_total 4"));
  EXPECT_TRUE(has_line(text, "splitflow_swap_outs_total 3"));
  EXPECT_TRUE(has_line(text, "splitflow_request_finished_total{finished_reason=\"stop\"} 2"));
  EXPECT_TRUE(has_line(text, "splitflow_request_finished_total{finished_reason=\"abort\"} 1"));
  EXPECT_TRUE(has_line(text, "splitflow_requests_rejected_total{reason=\"queue_full\"} 1"));
  EXPECT_TRUE(has_line(text, "splitflow_kv_cache_usage_ratio 0.25"));
  EXPECT_TRUE(has_line(text, "splitflow_prefix_cache_hit_rate 0.25"));
  EXPECT_TRUE(has_line(text, "splitflow_num_sequences_running 3"));
  EXPECT_TRUE(has_line(text, "splitflow_num_sequences_waiting 2"));
  EXPECT_TRUE(has_line(text, "splitflow_num_sequences_swapped 1"));
  // Over the 10 s window (baseline: the sample at t = 10): 10 steps of 50 and 10 tokens.
  EXPECT_TRUE(has_line(text, "splitflow_prompt_throughput_tokens_per_second 50"));
  EXPECT_TRUE(has_line(text, "splitflow_generation_throughput_tokens_per_second 10"));
  // Idle for 5 s more: the window holds half as many tokens.
  const std::string later = metrics.render(25.0);
  EXPECT_TRUE(has_line(later, "splitflow_generation_throughput_tokens_per_second 5")) << later;
  // Every sample line is "name value" or "name{labels} value".
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("#")) continue;
    EXPECT_TRUE(line.starts_with("splitflow_")) << line;
    EXPECT_EQ(std::count(line.begin(), line.end(), ' '), 1) << line;
  }
}

TEST(ServingMetrics, RatesAreZeroBeforeAnyStep) {
  ServingMetrics metrics;
  const std::string text = metrics.render(3.0);
  EXPECT_TRUE(has_line(text, "splitflow_generation_throughput_tokens_per_second 0"));
  EXPECT_TRUE(has_line(text, "splitflow_kv_cache_usage_ratio 0"));
}

}  // namespace
}  // namespace splitflow
