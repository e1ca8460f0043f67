// bench::throughput_bound against sums worked out by hand for small workloads.
#include "bench/throughput.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace splitflow::bench {
namespace {

ThroughputOptions workload(int32_t n, int32_t in, int32_t out, int32_t max_seqs, int32_t budget) {
  ThroughputOptions options;
  options.num_requests = n;
  options.input_len = in;
  options.output_len = out;
  options.max_seqs = max_seqs;
  options.max_batch_tokens = budget;
  return options;
}

TEST(ThroughputBound, DecodeBoundWorkloadWorkedByHand) {
  // 3 requests of 4 in / 3 out, 2 at a time, 8 tokens a step.
  // Steps: decode tokens 3 x 2 = 6 at 2 a step -> 3; all tokens 3 x 6 = 18 at 8 a step -> 3.
  // KV positions: each request's decode steps read 5 and 6 positions -> 3 x 11 = 33.
  // FLOPs: 2 x (5 params x 18 tokens + 7 params x 9 output rows) = 2 x (90 + 63) = 306.
  const ModelCost cost{100, 10, 5, 7};
  const ThroughputBound bound = throughput_bound(workload(3, 4, 3, 2, 8), cost, 1.0, 0.0);
  EXPECT_EQ(bound.min_steps, 3);
  EXPECT_DOUBLE_EQ(bound.weight_read_bytes, 300);
  EXPECT_DOUBLE_EQ(bound.kv_read_bytes, 330);
  EXPECT_DOUBLE_EQ(bound.gemm_flops, 306);
  // At 1 GB/s with the GEMM rate unknown: only the bytes count, serial or not.
  EXPECT_DOUBLE_EQ(bound.serial_s, 630e-9);
  EXPECT_DOUBLE_EQ(bound.overlapped_s, 630e-9);
}

TEST(ThroughputBound, TheTokenBudgetCanSetTheStepCount) {
  // 2 requests of 30 in / 2 out, 4 at a time, 16 tokens a step: decode needs ceil(2 / 4) = 1
  // step, but the 2 x 31 = 62 tokens need ceil(62 / 16) = 4.
  const ThroughputBound bound = throughput_bound(workload(2, 30, 2, 4, 16), ModelCost{1000, 1, 1, 1}, 1.0, 0.0);
  EXPECT_EQ(bound.min_steps, 4);
  EXPECT_DOUBLE_EQ(bound.weight_read_bytes, 4000);
  EXPECT_DOUBLE_EQ(bound.kv_read_bytes, 2 * 31);  // one decode step each, reading 31 positions
}

TEST(ThroughputBound, ComputeBoundStepsAndOverlap) {
  // 1 request of 1 in / 2 out, budget 2: steps max(1, ceil(2 / 2)) = 1. KV: one decode step
  // reading 2 positions of 1e9 bytes. Weights 1e9 bytes. FLOPs 2 x (1e12 x 2 + 1e12 x 2) = 8e12.
  const ModelCost cost{1'000'000'000, 1'000'000'000, 1'000'000'000'000, 1'000'000'000'000};
  const ThroughputBound bound = throughput_bound(workload(1, 1, 2, 1, 2), cost, 1000.0, 2.0);
  EXPECT_DOUBLE_EQ(bound.gemm_flops, 8e12);
  // At 1 TB/s and 2 TFLOP/s: KV 2 ms, weights 1 ms, GEMMs 4 s. In sequence: 2 ms + max(1 ms,
  // 4 s); overlapped: max(3 ms, 4 s).
  EXPECT_DOUBLE_EQ(bound.serial_s, 2e-3 + 4.0);
  EXPECT_DOUBLE_EQ(bound.overlapped_s, 4.0);
  // A fast GEMM leaves the bytes: in sequence 2 ms + 1 ms, overlapped the same 3 ms.
  const ThroughputBound fast = throughput_bound(workload(1, 1, 2, 1, 2), cost, 1000.0, 1e6);
  EXPECT_DOUBLE_EQ(fast.serial_s, 3e-3);
  EXPECT_DOUBLE_EQ(fast.overlapped_s, 3e-3);
}

TEST(ThroughputBound, OneOutputTokenNeedsNoDecodeStep) {
  const ThroughputBound bound = throughput_bound(workload(4, 8, 1, 4, 32), ModelCost{10, 10, 1, 1}, 1.0, 0.0);
  EXPECT_EQ(bound.min_steps, 1);  // 32 prompt tokens in one step
  EXPECT_DOUBLE_EQ(bound.kv_read_bytes, 0);
}

TEST(ThroughputBound, RejectsAnUnmeasuredBandwidth) {
  EXPECT_THROW(throughput_bound(workload(1, 1, 1, 1, 1), ModelCost{}, 0.0, 0.0), std::runtime_error);
}

}  // namespace
}  // namespace splitflow::bench
