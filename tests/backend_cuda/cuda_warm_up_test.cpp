// ModelRunner::warm_up on the CUDA backend: after a warm-up (run while sequences are cached, block
// 0 among their blocks), recorded decode steps replay warm-up's graphs and give the logits of the
// same steps issued eagerly (bf16 tolerance), and exactly those of a runner that records each
// bucket at its first use. Skips without a GPU.
#include "backend_cuda/cuda_runner_util.h"

#include <cmath>
#include <cstring>

using namespace splitflow;
using namespace splitflow::test;

namespace {

double max_abs_difference(const Tensor& a, const Tensor& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::abs(double(a.as<float>()[i]) - double(b.as<float>()[i])));
  return worst;
}

TEST(CudaWarmUp, RecordedDecodeAfterWarmUpMatchesEagerAndFirstUseRecording) {
  SF_REQUIRE_GPU();
  auto backend = make_test_cuda_backend();
  const ModelSpec spec = decode_runner_spec();
  const ModelWeights weights = random_weights(spec, DType::BF16, 41);
  const KvCacheConfig kv = DecodingSequences::kv_config();
  ModelRunner eager(spec, weights, *backend, kv, {128, 8, false});
  ModelRunner first_use(spec, weights, *backend, kv, {128, 8, true});
  ModelRunner warmed(spec, weights, *backend, kv, {128, 8, true});
  DecodingSequences seqs;  // sequence 0 owns block 0, which the warm-up's dummy spans read
  seqs.prefill(eager, {&first_use, &warmed}, 42);

  const WarmupReport report = warmed.warm_up();
  EXPECT_EQ(report.decode_buckets, (std::vector<int32_t>{1, 2, 4, 8}));
  // Each bucket with and without sampling, less bucket 1 without sampling: sequence 3's one-token
  // prompt above was a decode-shaped step and recorded it before the warm-up.
  EXPECT_EQ(report.decode_recordings, 7);
  EXPECT_EQ(report.prefill_tokens, 128);

  // Batches of 5 (bucket 8), 3 (bucket 4), 1, 2 sequences; each size replays several times.
  int mismatched_top1 = 0, rows = 0;
  for (int active : {5, 5, 3, 3, 1, 2, 5}) {
    SCOPED_TRACE(::testing::Message() << active << " sequences");
    const ForwardBatch batch = seqs.decode_batch(active);
    const Tensor a = eager.forward(batch);
    const Tensor b = warmed.forward(batch);
    const Tensor c = first_use.forward(batch);
    ASSERT_EQ(b.shape, a.shape);
    ASSERT_EQ(c.shape, a.shape);
    std::vector<double> reference(a.as<float>(), a.as<float>() + a.numel());
    std::vector<float> got(b.as<float>(), b.as<float>() + b.numel());
    EXPECT_LE(relative_error(got, reference), 2e-3);
    EXPECT_EQ(std::memcmp(b.data, c.data, b.nbytes()), 0)
        << "max |warmed - first use| = " << max_abs_difference(b, c);
    for (int s = 0; s < active; ++s, ++rows) mismatched_top1 += argmax_row(a, s) != argmax_row(b, s);
    seqs.advance(a, active);
  }
  EXPECT_LE(mismatched_top1, 1) << "of " << rows << " rows";

  // Greedy sampling replays warm-up's sampled recording: forward()'s argmax.
  expect_greedy_sampling_is_argmax(warmed, seqs);
}

}  // namespace
