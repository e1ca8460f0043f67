// ModelRunner on the CUDA backend: recorded decode steps (CUDA graphs, spans padded to a bucket)
// against the same steps issued eagerly, across batch sizes, contexts and replays, with a bf16 and
// an fp8 KV cache; greedy forward_sample against the argmax of forward(); the cache dtypes it
// stores. Skips without a GPU.
#include "backend_cuda/cuda_runner_util.h"

using namespace splitflow;
using namespace splitflow::test;

namespace {

void check_recorded_matches_eager(std::optional<DType> kv_cache_dtype) {
  auto backend = make_test_cuda_backend();
  const ModelSpec spec = decode_runner_spec();
  const ModelWeights weights = random_weights(spec, DType::BF16, 11);
  KvCacheConfig kv = DecodingSequences::kv_config();
  kv.dtype = kv_cache_dtype;
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

TEST(CudaRunner, RecordedDecodeMatchesEagerDecode) {
  SF_REQUIRE_GPU();
  check_recorded_matches_eager(std::nullopt);
}

TEST(CudaRunner, RecordedDecodeMatchesEagerDecodeFp8Cache) {
  SF_REQUIRE_GPU();
  check_recorded_matches_eager(DType::F8E4M3);
}

// bf16 (the default) and fp8 e4m3; an f16 cache is refused naming the backend and what it stores.
TEST(CudaRunner, KvCacheDtypes) {
  SF_REQUIRE_GPU();
  auto backend = make_test_cuda_backend();
  const std::span<const DType> stored = backend->kv_cache_dtypes();
  EXPECT_EQ(std::vector<DType>(stored.begin(), stored.end()), (std::vector<DType>{DType::BF16, DType::F8E4M3}));
  const ModelSpec spec = decode_runner_spec();
  const ModelWeights weights = random_weights(spec, DType::BF16, 13);
  EXPECT_EQ(ModelRunner(spec, weights, *backend, {4, 16}).kv_cache_dtype(), DType::BF16);
  try {
    ModelRunner(spec, weights, *backend, {4, 16, 0, DType::F16});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not store a f16 KV cache (it stores bf16, f8_e4m3)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
