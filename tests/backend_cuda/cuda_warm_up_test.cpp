// ModelRunner::warm_up on the CUDA backend: after a warm-up (run while sequences are cached, block
// 0 among their blocks), recorded decode steps replay warm-up's graphs and give the logits of the
// same steps issued eagerly (bf16 tolerance), and exactly those of a runner that records each
// bucket at its first use. Skips without a GPU.
#include "backend_cuda/cuda_test_util.h"

#include "runtime/model_runner.h"
#include "runtime/runner_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>

using namespace splitflow;
using namespace splitflow::test;

namespace {

ModelSpec warm_up_spec() {
  ModelSpec spec = tiny_spec();
  spec.hidden_size = 256;
  spec.attention.num_heads = 4;
  spec.attention.num_kv_heads = 2;
  spec.attention.head_dim = 64;
  spec.mlp.intermediate_size = 512;
  spec.vocab_size = 1000;
  spec.max_position = 1024;
  return spec;
}

int64_t argmax_row(const Tensor& logits, int64_t row) {
  const float* r = logits.as<float>() + row * logits.dim(1);
  return std::max_element(r, r + logits.dim(1)) - r;
}

double max_abs_difference(const Tensor& a, const Tensor& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::abs(double(a.as<float>()[i]) - double(b.as<float>()[i])));
  return worst;
}

TEST(CudaWarmUp, RecordedDecodeAfterWarmUpMatchesEagerAndFirstUseRecording) {
  SF_REQUIRE_GPU();
  auto backend = make_test_cuda_backend();
  const ModelSpec spec = warm_up_spec();
  const ModelWeights weights = random_weights(spec, DType::BF16, 41);
  constexpr int kSeqs = 5, kBlocksPerSeq = 8, kBlockSize = 16;
  const KvCacheConfig kv{kSeqs * kBlocksPerSeq, kBlockSize};
  ModelRunner eager(spec, weights, *backend, kv, {128, 8, false});
  ModelRunner first_use(spec, weights, *backend, kv, {128, 8, true});
  ModelRunner warmed(spec, weights, *backend, kv, {128, 8, true});

  std::mt19937_64 rng(42);
  std::vector<std::vector<int32_t>> tables(kSeqs);
  std::vector<int32_t> lengths = {3, 17, 40, 1, 64};
  std::vector<int32_t> next(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    tables[s] = iota_blocks(kBlocksPerSeq, s * kBlocksPerSeq);  // sequence 0 owns block 0
    const std::vector<int32_t> prompt = random_tokens(rng, lengths[s], spec.vocab_size);
    const ForwardBatch batch = single_span(prompt, 0, lengths[s], tables[s], LogitsMode::Last);
    next[s] = static_cast<int32_t>(argmax_row(eager.forward(batch), 0));
    first_use.forward(batch);
    warmed.forward(batch);
  }

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
    ForwardBatch batch;
    for (int s = 0; s < active; ++s) {
      batch.token_ids.push_back(next[s]);
      batch.spans.push_back({1, lengths[s], tables[s], true});
    }
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
    for (int s = 0; s < active; ++s) {
      mismatched_top1 += argmax_row(a, s) != argmax_row(b, s);
      ++rows;
      next[s] = static_cast<int32_t>(argmax_row(a, s));
      ++lengths[s];
    }
  }
  EXPECT_LE(mismatched_top1, 1) << "of " << rows << " rows";

  // Greedy sampling replays warm-up's sampled recording: forward()'s argmax.
  ForwardBatch batch;
  for (int s = 0; s < 3; ++s) {
    batch.token_ids.push_back(next[s]);
    batch.spans.push_back({1, lengths[s], tables[s], true});
  }
  const Tensor logits = warmed.forward(batch);
  const std::vector<int32_t> sampled = warmed.forward_sample(batch, std::vector<SamplingRow>(3));
  for (int s = 0; s < 3; ++s) EXPECT_EQ(sampled[s], argmax_row(logits, s)) << "sequence " << s;
}

}  // namespace
