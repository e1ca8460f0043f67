// The continuous-batching Engine over parallel jobs (CPU ranks as threads, tests/parallel/
// parallel_harness.h): the scheduler runs on rank 0 only, and every call its runner gets (forward,
// forward_sample with device sampling, swap_blocks) is mirrored on the other ranks. Reference: the
// same Engine on one rank, which tests/engine checks against the Generator and transformers.
// Pipeline stages compute exactly what one rank computes (the same layers, weights and order of
// operations), so their outputs must be identical. Tensor parallelism sums partial products in
// another order (f32 differences around 1e-7 relative); on this model and these prompts no greedy
// or seeded draw sits that close to a tie, so its outputs must be identical too.
#include "engine/engine.h"

#include "engine/model_loader.h"
#include "parallel_harness.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <map>

using namespace splitflow;

namespace {

const std::vector<std::string> kPrompts = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun.",
    "Tom had a big red ball.",
    "The sun was shining and the birds were singing in the tall green trees. A little dog",
    "One day, a bird",
    "Lily and her mom went to the park. They saw a big slide and",
    "There was a boy who liked to run.",
};

constexpr int32_t kBlockSize = 16;

struct Outputs {
  std::map<int64_t, std::vector<int32_t>> tokens;  // by request
  int64_t preemptions = 0, swap_outs = 0;
};

// Runs every prompt greedily and seeded-sampled on an Engine over `runner`, to completion.
Outputs run_engine(ModelRunner& runner, const Tokenizer& tokenizer, int32_t num_host_blocks) {
  SchedulerConfig config;
  config.max_batch_tokens = runner.limits().max_batch_tokens;
  config.max_seqs = runner.limits().max_seqs;
  config.num_blocks = runner.kv_config().num_blocks;
  config.block_size = runner.kv_config().block_size;
  config.num_host_blocks = num_host_blocks;
  config.swap_min_tokens = 16;  // swap rather than recompute, so swap_blocks is mirrored too
  config.max_model_len = 256;
  Engine engine(runner, &tokenizer, config);
  Outputs outputs;
  for (size_t p = 0; p < kPrompts.size(); ++p) {
    SamplingParams params;
    params.max_tokens = 80;
    params.ignore_eos = true;
    params.temperature = p % 2 == 0 ? 0.0f : 0.8f;
    params.seed = 1000 + p;
    engine.add_request(kPrompts[p], params);
  }
  for (int steps = 0; engine.has_unfinished(); ++steps) {
    SF_CHECK(steps < 20000, "the engine made no progress");
    EngineStep step = engine.step();
    outputs.preemptions += step.num_preempted;
    outputs.swap_outs += step.num_swapped_out;
    for (const SequenceOutput& out : step.outputs) outputs.tokens[out.request_id].push_back(out.token.token_id);
  }
  return outputs;
}

class EngineOverParallelJob : public ::testing::TestWithParam<ParallelLayout> {};

TEST_P(EngineOverParallelJob, GivesTheOneRankOutputs) {
  const ParallelLayout layout = GetParam();
  ModelLoadOptions options;
  options.model_path = test::shared_path("models/stories260K-hf");
  LoadedModel model = load_model(options);
  // A cache too small for every sequence at once: the scheduler preempts, swapping to host blocks.
  const KvCacheConfig kv{24, kBlockSize, 24};
  const RunnerLimits limits{64, 8};

  auto backend = make_cpu_backend(1);
  ModelRunner one(model.spec, model.weights, *backend, kv, limits);
  const Outputs expected = run_engine(one, *model.tokenizer, kv.num_host_blocks);
  ASSERT_EQ(expected.tokens.size(), kPrompts.size());
  EXPECT_GT(expected.swap_outs, 0) << "the cache should be tight enough to swap (preemptions: " << expected.preemptions << ")";

  Outputs got;
  test::run_parallel(model.spec, model.weights, layout, kv, limits,
                     [&](ModelRunner& runner) { got = run_engine(runner, *model.tokenizer, kv.num_host_blocks); });
  EXPECT_EQ(got.preemptions, expected.preemptions);
  EXPECT_EQ(got.swap_outs, expected.swap_outs);
  ASSERT_EQ(got.tokens.size(), expected.tokens.size());
  for (const auto& [request, tokens] : expected.tokens) EXPECT_EQ(got.tokens[request], tokens) << "request " << request;
}

INSTANTIATE_TEST_SUITE_P(Layouts, EngineOverParallelJob,
                         ::testing::Values(ParallelLayout{1, 2}, ParallelLayout{1, 2, {4, 1}}, ParallelLayout{2, 1},
                                           ParallelLayout{4, 1}, ParallelLayout{2, 2}),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.tensor_parallel) + "_pp" +
                                  std::to_string(info.param.pipeline_parallel) +
                                  (info.param.stage_layers.empty() ? "" : "_given");
                         });

}  // namespace
