// ModelRunner on the CUDA backend: recorded decode steps (CUDA graphs, spans padded to a bucket)
// against the same steps issued eagerly, across batch sizes, contexts and replays; greedy
// forward_sample against the argmax of forward(). Skips without a GPU.
#include "backend_cuda/cuda_runner_util.h"

using namespace splitflow;
using namespace splitflow::test;

namespace {

TEST(CudaRunner, RecordedDecodeMatchesEagerDecode) {
  SF_REQUIRE_GPU();
  auto backend = make_test_cuda_backend();
  const ModelSpec spec = decode_runner_spec();
  const ModelWeights weights = random_weights(spec, DType::BF16, 11);
  const KvCacheConfig kv = DecodingSequences::kv_config();
  ModelRunner eager(spec, weights, *backend, kv, {128, 8, false});
  ModelRunner recorded(spec, weights, *backend, kv, {128, 8, true});
  DecodingSequences seqs;
  seqs.prefill(eager, {&recorded}, 12);

  // Batches of 5 (bucket 8), 3 (bucket 4), 1, 2 sequences; each size replays several times.
  int mismatched_top1 = 0, rows = 0;
  for (int active : {5, 5, 3, 3, 3, 1, 1, 2, 5}) {
    const ForwardBatch batch = seqs.decode_batch(active);
    const Tensor a = eager.forward(batch);
    const Tensor b = recorded.forward(batch);
    ASSERT_EQ(b.shape, a.shape);
    std::vector<double> reference(a.as<float>(), a.as<float>() + a.numel());
    std::vector<float> got(b.as<float>(), b.as<float>() + b.numel());
    EXPECT_LE(relative_error(got, reference), 2e-3) << active << " sequences";
    for (int s = 0; s < active; ++s, ++rows) mismatched_top1 += argmax_row(a, s) != argmax_row(b, s);
    seqs.advance(a, active);
  }
  EXPECT_LE(mismatched_top1, 1) << "of " << rows << " rows";

  // Greedy sampling on the device, recorded with the sampler, picks forward()'s argmax.
  expect_greedy_sampling_is_argmax(recorded, seqs);
}

}  // namespace
