// A request's seed fully determines its tokens (issue 29, item 6): the same (prompt, seed,
// temperature, top_p, top_k, min_p) gives the same tokens with or without logprobs, sampled on
// the device path (ModelRunner::forward_sample) or on the host (the Sampler, or the rule in a
// mixed step), alone or among 16 other requests with other parameters (under preemption too), and
// choice i of an n > 1 request seeded s as a one-choice request seeded s + i. On the real
// stories260K model, CPU backend; the CPU backend's sample() is the device path here.
#include "engine/engine.h"

#include "backend/backend.h"
#include "core/error.h"
#include "engine/model_loader.h"
#include "sampling/host_rule.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>

namespace splitflow {
namespace {

constexpr int32_t kBlockSize = 16;

class SeedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = make_cpu_backend(0).release();
    LoadedModel model = load();
    tokenizer_ = model.tokenizer.release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete backend_;
  }
  static LoadedModel load() {
    ModelLoadOptions options;
    options.model_path = test::shared_path("models/stories260K-hf");
    return load_model(options);
  }

  // An engine over a runner of its own (num_blocks of KV, up to max_seqs sequences per step).
  struct Setup {
    std::unique_ptr<ModelRunner> runner;
    std::unique_ptr<Engine> engine;
  };
  static Setup make(bool device_sampling, int32_t num_blocks = 96, int32_t max_seqs = 20) {
    LoadedModel model = load();
    Setup setup;
    setup.runner = std::make_unique<ModelRunner>(model.spec, std::move(model.weights), *backend_,
                                                 KvCacheConfig{num_blocks, kBlockSize, 0}, RunnerLimits{128, max_seqs});
    SchedulerConfig config;
    config.max_batch_tokens = 128;
    config.max_seqs = max_seqs;
    config.num_blocks = num_blocks;
    config.block_size = kBlockSize;
    config.max_model_len = 128;
    setup.engine = std::make_unique<Engine>(*setup.runner, tokenizer_, config, EngineOptions{device_sampling});
    return setup;
  }

  using Outputs = std::map<std::pair<int64_t, int32_t>, std::vector<int32_t>>;  // (request, choice) -> tokens
  static Outputs run(Engine& engine, int64_t* preemptions = nullptr) {
    Outputs outputs;
    for (int steps = 0; engine.has_unfinished(); ++steps) {
      SF_CHECK(steps < 20000, "the engine made no progress");
      const EngineStep step = engine.step();
      if (preemptions) *preemptions += step.num_preempted;
      for (const SequenceOutput& out : step.outputs) outputs[{out.request_id, out.index}].push_back(out.token.token_id);
    }
    return outputs;
  }
  // The tokens of one request run alone.
  static std::vector<std::vector<int32_t>> alone(const std::string& prompt, const SamplingParams& params, int32_t n = 1,
                                                 bool device_sampling = true) {
    Setup setup = make(device_sampling);
    const int64_t id = setup.engine->add_request(prompt, params, n);
    const Outputs outputs = run(*setup.engine);
    std::vector<std::vector<int32_t>> choices;
    for (int32_t i = 0; i < n; ++i) choices.push_back(outputs.at({id, i}));
    return choices;
  }

  static SamplingParams seeded() {
    SamplingParams params;
    params.temperature = 0.8f;
    params.top_k = 30;
    params.top_p = 0.9f;
    params.min_p = 0.02f;
    params.max_tokens = 40;
    params.ignore_eos = true;  // every run is as long, so a late difference cannot hide behind an EOS
    params.seed = 4242;
    return params;
  }

  static Backend* backend_;
  static Tokenizer* tokenizer_;
};

Backend* SeedTest::backend_ = nullptr;
Tokenizer* SeedTest::tokenizer_ = nullptr;

const std::string kPrompt = "Lily and her mom went to the park. They saw a big slide and";

TEST_F(SeedTest, LogprobsAndTheSamplingPathDoNotChangeTheTokens) {
  const SamplingParams params = seeded();
  ASSERT_TRUE(device_samplable(params));
  const std::vector<int32_t> reference = alone(kPrompt, params).at(0);  // device path: forward_sample
  SamplingParams other_seed = params;
  other_seed.seed = 4243;
  ASSERT_NE(alone(kPrompt, other_seed).at(0), reference) << "the seed was meant to matter";

  SamplingParams with_logprobs = params;
  with_logprobs.logprobs = true;  // the host Sampler
  SamplingParams with_top_logprobs = params;
  with_top_logprobs.top_logprobs = 5;
  for (const bool device_sampling : {true, false}) {
    SCOPED_TRACE(device_sampling ? "device sampling on" : "device sampling off (host Sampler always)");
    EXPECT_EQ(alone(kPrompt, params, 1, device_sampling).at(0), reference);
    EXPECT_EQ(alone(kPrompt, with_logprobs, 1, device_sampling).at(0), reference);
    EXPECT_EQ(alone(kPrompt, with_top_logprobs, 1, device_sampling).at(0), reference);
  }
}

TEST_F(SeedTest, ChoiceIOfNEqualsAOneChoiceRequestSeededSeedPlusI) {
  SamplingParams params = seeded();
  params.max_tokens = 24;
  const std::vector<std::vector<int32_t>> choices = alone(kPrompt, params, 4);
  for (uint64_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    SamplingParams one = params;
    one.seed = *params.seed + i;
    EXPECT_EQ(choices[i], alone(kPrompt, one).at(0));
    one.logprobs = true;
    EXPECT_EQ(choices[i], alone(kPrompt, one, 1, /*device_sampling=*/false).at(0));
  }
  EXPECT_NE(choices[0], choices[1]);
  // And with logprobs (host-sampled choices) the same choices.
  SamplingParams host = params;
  host.logprobs = true;
  EXPECT_EQ(alone(kPrompt, host, 4), choices);
}

// The request among 16 others with other parameters (greedy, other filters, penalties, mirostat,
// typical, logprobs, n = 2, unseeded, stop strings), so its steps mix device- and host-sampled
// rows and batch sizes change as the others finish; every seeded request gets what it gets alone.
// A second run over a cache too small for all of them preempts sequences: still the same tokens.
TEST_F(SeedTest, ABatchOfSixteenOtherRequestsChangesNoSeededOutput) {
  const std::vector<std::string> prompts = {
      "Once upon a time, there was a little girl named Lily.", "Tom had a big red ball.",
      "The sun was shining and the birds were singing.",      "One day, a bird",
      "There was a boy who liked to run.",                     "The cat sat on the mat and",
  };
  struct Request {
    std::string prompt;
    SamplingParams params;
    int32_t n = 1;
  };
  std::vector<Request> others;
  for (int r = 0; r < 16; ++r) {
    SamplingParams p;
    p.max_tokens = 10 + 3 * r;
    p.seed = 100 + static_cast<uint64_t>(r);
    p.temperature = 0.3f + 0.1f * static_cast<float>(r % 9);
    switch (r % 8) {
      case 0: p.temperature = 0.0f; break;
      case 1: p.top_k = 5; break;
      case 2: p.top_p = 0.5f; p.logprobs = true; break;
      case 3: p.repetition_penalty = 1.3f; p.frequency_penalty = 0.5f; break;
      case 4: p.mirostat = 2; break;
      case 5: p.typical_p = 0.8f; p.top_logprobs = 2; break;
      case 6: p.seed.reset(); break;
      case 7: p.min_p = 0.1f; p.stop = {"the"}; break;
    }
    others.push_back({prompts[static_cast<size_t>(r) % prompts.size()], p, r == 9 ? 2 : 1});
  }
  const SamplingParams target = seeded();

  // Alone: the target, and every seeded other.
  const std::vector<int32_t> expected = alone(kPrompt, target).at(0);
  std::vector<std::vector<std::vector<int32_t>>> expected_others;
  for (const Request& r : others) {
    expected_others.push_back(r.params.seed ? alone(r.prompt, r.params, r.n) : std::vector<std::vector<int32_t>>{});
  }

  for (const int32_t num_blocks : {96, 12}) {
    SCOPED_TRACE(num_blocks == 96 ? "ample cache" : "a cache that forces preemption");
    Setup setup = make(/*device_sampling=*/true, num_blocks);
    std::vector<int64_t> ids;
    for (size_t r = 0; r < others.size(); ++r) {
      if (r == 8) ids.push_back(setup.engine->add_request(kPrompt, target));
      ids.push_back(setup.engine->add_request(others[r].prompt, others[r].params, others[r].n));
    }
    int64_t preemptions = 0;
    const Outputs outputs = run(*setup.engine, &preemptions);
    if (num_blocks == 12) {
      EXPECT_GT(preemptions, 0);
    }
    EXPECT_EQ(outputs.at({ids[8], 0}), expected);
    for (size_t r = 0; r < others.size(); ++r) {
      if (!others[r].params.seed) continue;
      const int64_t id = ids[r < 8 ? r : r + 1];
      for (int32_t i = 0; i < others[r].n; ++i) {
        EXPECT_EQ(outputs.at({id, i}), expected_others[r][static_cast<size_t>(i)]) << "request " << r << " choice " << i;
      }
    }
  }
}

// The device path (the CPU backend's sample(), what forward_sample runs) and the host path (the
// Sampler, as logprobs force) on the same rows: the same tokens, step after step, for every
// combination of the rule's parameters; masked (-inf) tokens included.
TEST_F(SeedTest, BackendSampleAndHostSamplerDrawTheSameTokens) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.5f);
  const int32_t vocab = 2000;
  const std::vector<SamplingParams> settings = [] {
    std::vector<SamplingParams> all;
    for (const float temperature : {0.0f, 0.5f, 1.0f, 1.6f})
      for (const int32_t top_k : {0, 1, 40})
        for (const float top_p : {1.0f, 0.9f, 0.3f})
          for (const float min_p : {0.0f, 0.05f}) {
            SamplingParams p;
            p.temperature = temperature;
            p.top_k = top_k;
            p.top_p = top_p;
            p.min_p = min_p;
            p.seed = 1000 + all.size();
            all.push_back(p);
          }
    return all;
  }();
  for (const SamplingParams& params : settings) {
    SamplingParams with_logprobs = params;
    with_logprobs.logprobs = true;
    with_logprobs.top_logprobs = 2;
    Sampler host(with_logprobs, vocab);
    std::vector<int32_t> generated;
    for (int step = 0; step < 25; ++step) {
      std::vector<float> logits(static_cast<size_t>(vocab));
      for (float& v : logits) v = normal(rng);
      if (step % 5 == 0) std::fill(logits.begin(), logits.begin() + vocab / 2, -INFINITY);
      SamplingRow row{params.temperature, params.top_k, params.top_p, params.min_p, *params.seed,
                      static_cast<uint64_t>(step)};
      int32_t device_token = -1;
      backend_->sample(DeviceTensor{logits.data(), DType::F32, {1, vocab}},
                       DeviceTensor{&row, DType::I32, {1, kSamplingRowWords}},
                       DeviceTensor{&device_token, DType::I32, {1}});
      const int32_t host_token = host.sample(logits, {}, generated).token_id;
      ASSERT_EQ(host_token, device_token) << "temperature " << params.temperature << " top_k " << params.top_k
                                          << " top_p " << params.top_p << " min_p " << params.min_p << " step " << step;
      generated.push_back(host_token);
    }
  }
}

// Logprobs are the model's own distribution, log_softmax of the raw logits (OpenAI's and vLLM's
// default), whatever temperature and filters the token was drawn under.
TEST_F(SeedTest, LogprobsAreTheRawDistributionWhateverTheSamplingParameters) {
  SamplingParams params = seeded();
  params.temperature = 0.6f;
  params.top_k = 5;
  params.max_tokens = 10;
  params.logprobs = true;
  params.top_logprobs = 2;
  Setup setup = make(true);
  const std::vector<int32_t> prompt = tokenizer_->encode(kPrompt, true);
  const int64_t id = setup.engine->add_request(prompt, params);
  std::vector<TokenOutput> tokens;
  while (setup.engine->has_unfinished()) {
    for (SequenceOutput& out : setup.engine->step().outputs) {
      if (out.request_id == id) tokens.push_back(std::move(out.token));
    }
  }
  ASSERT_EQ(tokens.size(), 10u);
  std::vector<int32_t> all = prompt;
  for (size_t t = 0; t + 1 < tokens.size(); ++t) all.push_back(tokens[t].token_id);
  ForwardBatch batch;
  batch.token_ids = all;
  batch.logits_mode = LogitsMode::All;
  const int32_t n = static_cast<int32_t>(all.size());
  std::vector<int32_t> table(static_cast<size_t>((n + kBlockSize - 1) / kBlockSize));
  std::iota(table.begin(), table.end(), 0);
  batch.spans.push_back({n, 0, table, true});
  const Tensor logits = setup.runner->forward(batch);
  const size_t vocab = static_cast<size_t>(setup.runner->spec().vocab_size);
  for (size_t t = 0; t < tokens.size(); ++t) {
    SCOPED_TRACE(t);
    const float* row = logits.as<float>() + (prompt.size() - 1 + t) * vocab;
    double max = row[0], sum = 0;
    for (size_t v = 0; v < vocab; ++v) max = std::max<double>(max, row[v]);
    for (size_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - max);
    const int32_t token = tokens[t].token_id;
    EXPECT_NEAR(tokens[t].logprob, row[token] - max - std::log(sum), 1e-4);
    // Drawn from the top 5 at temperature 0.6: a distribution the reported numbers are not.
    int32_t rank = 0;
    for (size_t v = 0; v < vocab; ++v) rank += row[v] > row[token];
    EXPECT_LT(rank, 5);
  }
}

// An unseeded request draws its seed once when it is added: choices differ from each other (seed +
// i) and from another unseeded request's, and each is still one rule's draws (checked above).
TEST_F(SeedTest, UnseededRequestsDrawTheirOwnSeeds) {
  SamplingParams params = seeded();
  params.seed.reset();
  params.max_tokens = 30;
  Setup setup = make(true);
  const int64_t a = setup.engine->add_request(kPrompt, params, 2);
  const int64_t b = setup.engine->add_request(kPrompt, params);
  const Outputs outputs = run(*setup.engine);
  EXPECT_NE(outputs.at({a, 0}), outputs.at({a, 1}));
  EXPECT_NE(outputs.at({a, 0}), outputs.at({b, 0}));
}

}  // namespace
}  // namespace splitflow
