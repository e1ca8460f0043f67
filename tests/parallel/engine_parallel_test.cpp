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
  int32_t most_in_flight = 0;  // steps still in flight when step() returned, at most
};

LoadedModel load_stories() {
  ModelLoadOptions options;
  options.model_path = test::shared_path("models/stories260K-hf");
  return load_model(options);
}

// An engine's scheduler on `runner`'s limits and cache.
SchedulerConfig engine_config(const ModelRunner& runner, int32_t num_host_blocks) {
  SchedulerConfig config;
  config.max_batch_tokens = runner.limits().max_batch_tokens;
  config.max_seqs = runner.limits().max_seqs;
  config.num_blocks = runner.kv_config().num_blocks;
  config.block_size = runner.kv_config().block_size;
  config.num_host_blocks = num_host_blocks;
  config.swap_min_tokens = 16;  // swap rather than recompute, so swap_blocks is mirrored too
  config.max_model_len = 256;
  return config;
}

// Every prompt, greedy and seeded-sampled in turn; host_sampled: the last asks for logprobs, so
// its steps need the host. Returns the request ids in prompt order.
std::vector<int64_t> add_prompts(Engine& engine, bool host_sampled = false) {
  std::vector<int64_t> ids;
  for (size_t p = 0; p < kPrompts.size(); ++p) {
    SamplingParams params;
    params.max_tokens = 80;
    params.ignore_eos = true;
    params.temperature = p % 2 == 0 ? 0.0f : 0.8f;
    params.seed = 1000 + p;
    params.logprobs = host_sampled && p + 1 == kPrompts.size();
    ids.push_back(engine.add_request(kPrompts[p], params));
  }
  return ids;
}

// Runs every prompt on an Engine over `runner` to completion, with up to steps_in_flight steps in
// flight (EngineOptions).
Outputs run_engine(ModelRunner& runner, const Tokenizer& tokenizer, int32_t num_host_blocks, int32_t steps_in_flight = 1,
                   bool host_sampled = false) {
  Engine engine(runner, &tokenizer, engine_config(runner, num_host_blocks),
                EngineOptions{.max_steps_in_flight = steps_in_flight});
  Outputs outputs;
  add_prompts(engine, host_sampled);
  for (int steps = 0; engine.has_unfinished(); ++steps) {
    SF_CHECK(steps < 20000, "the engine made no progress");
    EngineStep step = engine.step();
    outputs.preemptions += step.num_preempted;
    outputs.swap_outs += step.num_swapped_out;
    outputs.most_in_flight = std::max(outputs.most_in_flight, engine.num_steps_in_flight());
    for (const SequenceOutput& out : step.outputs) outputs.tokens[out.request_id].push_back(out.token.token_id);
  }
  return outputs;
}

class EngineOverParallelJob : public ::testing::TestWithParam<ParallelLayout> {};

TEST_P(EngineOverParallelJob, GivesTheOneRankOutputs) {
  const ParallelLayout layout = GetParam();
  LoadedModel model = load_stories();
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

// Micro-batches in flight through the pipeline stages (EngineOptions::max_steps_in_flight): the
// plans differ (each holds sequences the steps in flight do not), but every token depends only on
// its sequence's prompt, seed and step, so every request gives the one-rank outputs; a request
// sampled on the host makes its steps wait for the others and run alone.
class EngineWithStepsInFlight : public ::testing::TestWithParam<std::tuple<ParallelLayout, bool>> {};

TEST_P(EngineWithStepsInFlight, GivesTheOneRankOutputs) {
  const auto& [layout, host_sampled] = GetParam();
  LoadedModel model = load_stories();
  const KvCacheConfig kv{24, kBlockSize, 24};
  const RunnerLimits limits{64, 8};
  auto backend = make_cpu_backend(1);
  ModelRunner one(model.spec, model.weights, *backend, kv, limits);
  const Outputs expected = run_engine(one, *model.tokenizer, kv.num_host_blocks, 1, host_sampled);
  ASSERT_EQ(expected.tokens.size(), kPrompts.size());

  Outputs got;
  test::run_parallel(model.spec, model.weights, layout, kv, limits, [&](ModelRunner& runner) {
    got = run_engine(runner, *model.tokenizer, kv.num_host_blocks, layout.pipeline_parallel, host_sampled);
  });
  EXPECT_GT(got.preemptions, 0) << "the cache should be tight enough to preempt with steps in flight too";
  // Six sequences over two or three micro-batches: the pipeline fills (a host-sampled step runs
  // alone, with nothing in flight, but the others still overlap).
  EXPECT_EQ(got.most_in_flight, layout.pipeline_parallel - 1) << "steps should stay in flight while one returns";
  ASSERT_EQ(got.tokens.size(), expected.tokens.size());
  for (const auto& [request, tokens] : expected.tokens) EXPECT_EQ(got.tokens[request], tokens) << "request " << request;
}

INSTANTIATE_TEST_SUITE_P(Layouts, EngineWithStepsInFlight,
                         ::testing::Combine(::testing::Values(ParallelLayout{1, 2}, ParallelLayout{1, 3},
                                                              ParallelLayout{2, 2}),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           const ParallelLayout& layout = std::get<0>(info.param);
                           return "tp" + std::to_string(layout.tensor_parallel) + "_pp" +
                                  std::to_string(layout.pipeline_parallel) +
                                  (std::get<1>(info.param) ? "_host_sampled" : "");
                         });

// An abort while the request's step is in flight: the step finishes first, the request gives no
// output after abort() returns, and the other requests are untouched.
TEST(EngineWithStepsInFlight, AbortOfARequestInFlight) {
  LoadedModel model = load_stories();
  const KvCacheConfig kv{64, kBlockSize, 0};
  const RunnerLimits limits{64, 8};
  auto backend = make_cpu_backend(1);
  ModelRunner one(model.spec, model.weights, *backend, kv, limits);
  const Outputs expected = run_engine(one, *model.tokenizer, 0);

  test::run_parallel(model.spec, model.weights, ParallelLayout{1, 2}, kv, limits, [&](ModelRunner& runner) {
    Engine engine(runner, model.tokenizer.get(), engine_config(runner, 0), EngineOptions{.max_steps_in_flight = 2});
    const std::vector<int64_t> ids = add_prompts(engine);
    const int64_t victim = ids[2];
    std::map<int64_t, std::vector<int32_t>> tokens;
    bool aborted = false;
    for (int steps = 0; engine.has_work(); ++steps) {
      ASSERT_LT(steps, 20000);
      if (!aborted && tokens[victim].size() >= 5) {
        EXPECT_TRUE(engine.abort(victim));
        aborted = true;
      }
      for (const SequenceOutput& out : engine.step().outputs) {
        ASSERT_FALSE(aborted && out.request_id == victim) << "output after abort";
        tokens[out.request_id].push_back(out.token.token_id);
      }
    }
    ASSERT_TRUE(aborted);
    for (size_t p = 0; p < kPrompts.size(); ++p) {
      const std::vector<int32_t>& want = expected.tokens.at(static_cast<int64_t>(p));
      const std::vector<int32_t>& have = tokens[ids[p]];
      if (ids[p] == victim) {
        ASSERT_LE(have.size(), want.size());
        EXPECT_TRUE(std::equal(have.begin(), have.end(), want.begin())) << "the aborted request's prefix";
      } else {
        EXPECT_EQ(have, want) << "request " << p;
      }
    }
  });
}

}  // namespace
