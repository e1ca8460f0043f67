// The continuous-batching Engine on the real stories260K model (CPU backend). References: the
// single-request Generator (greedy and seeded outputs), log_softmax of the model's logits computed
// here in double (logprobs), std::string::find on the unstopped text (stop strings).
#include "engine/engine.h"

#include "backend/backend.h"
#include "core/error.h"
#include "engine/generator.h"
#include "engine/model_loader.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <numeric>

namespace splitflow {
namespace {

constexpr int32_t kBlockSize = 16;

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = make_cpu_backend(0).release();
    tokenizer_ = load().tokenizer.release();
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

  static std::unique_ptr<ModelRunner> make_runner(int32_t num_blocks, int32_t max_batch_tokens = 64,
                                                  int32_t max_seqs = 8, int32_t num_host_blocks = 0) {
    LoadedModel model = load();
    return std::make_unique<ModelRunner>(model.spec, std::move(model.weights), *backend_,
                                         KvCacheConfig{num_blocks, kBlockSize, num_host_blocks},
                                         RunnerLimits{max_batch_tokens, max_seqs});
  }

  static SchedulerConfig config_for(const ModelRunner& runner, int32_t max_model_len, bool splitfuse = true) {
    SchedulerConfig config;
    config.max_batch_tokens = runner.limits().max_batch_tokens;
    config.max_seqs = runner.limits().max_seqs;
    config.num_blocks = runner.kv_config().num_blocks;
    config.block_size = runner.kv_config().block_size;
    config.num_host_blocks = runner.kv_config().num_host_blocks;
    config.max_model_len = max_model_len;
    config.splitfuse = splitfuse;
    return config;
  }

  static std::vector<int32_t> encode(const std::string& text) { return tokenizer_->encode(text, true); }

  static Backend* backend_;
  static Tokenizer* tokenizer_;
};

Backend* EngineTest::backend_ = nullptr;
Tokenizer* EngineTest::tokenizer_ = nullptr;

struct Choice {
  std::vector<int32_t> ids;
  std::string text;
  std::vector<TokenOutput> tokens;
  FinishReason finish_reason = FinishReason::None;
  int outputs_after_finish = 0;
};

using Choices = std::map<std::pair<int64_t, int32_t>, Choice>;  // (request, choice index)

// Steps until nothing is left, gathering every output; counts preemptions and swap-outs.
Choices run_to_completion(Engine& engine, int64_t* preemptions = nullptr, int64_t* swap_outs = nullptr) {
  Choices choices;
  for (int steps = 0; engine.has_unfinished(); ++steps) {
    SF_CHECK(steps < 20000, "the engine made no progress");
    EngineStep step = engine.step();
    if (preemptions) *preemptions += step.num_preempted;
    if (swap_outs) *swap_outs += step.num_swapped_out;
    for (SequenceOutput& out : step.outputs) {
      Choice& choice = choices[{out.request_id, out.index}];
      if (choice.finish_reason != FinishReason::None) ++choice.outputs_after_finish;
      choice.ids.push_back(out.token.token_id);
      choice.text += out.text;
      choice.tokens.push_back(std::move(out.token));
      choice.finish_reason = out.finish_reason;
    }
  }
  return choices;
}

const std::vector<std::string> kPrompts = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun.",
    "Tom had a big red ball.",
    "The sun was shining and the birds were singing in the tall green trees. A little dog",
    "One day, a bird",
    "Lily and her mom went to the park. They saw a big slide and",
    "There was a boy who liked to run.",
};

TEST_F(EngineTest, GreedyOutputsEqualTheSingleRequestGenerator) {
  auto runner = make_runner(64);
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 60;

  Generator generator(*runner, tokenizer_);
  std::vector<GenerationResult> expected;
  for (const std::string& prompt : kPrompts) expected.push_back(generator.generate(encode(prompt), params));

  for (const bool splitfuse : {true, false}) {
    SCOPED_TRACE(splitfuse ? "splitfuse" : "prefill-first");
    Engine engine(*runner, tokenizer_, config_for(*runner, 512, splitfuse));
    std::vector<int64_t> ids;
    for (const std::string& prompt : kPrompts) ids.push_back(engine.add_request(prompt, params));
    const Choices choices = run_to_completion(engine);
    ASSERT_EQ(choices.size(), kPrompts.size());
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      const Choice& choice = choices.at({ids[i], 0});
      EXPECT_EQ(choice.ids, expected[i].output_ids) << kPrompts[i];
      EXPECT_EQ(choice.text, expected[i].text) << kPrompts[i];
      EXPECT_EQ(choice.finish_reason, expected[i].finish_reason);
      EXPECT_EQ(choice.outputs_after_finish, 0);
    }
    EXPECT_EQ(engine.scheduler().block_manager().num_free_blocks(), runner->kv_config().num_blocks);
  }
}

TEST_F(EngineTest, ManyRequestsWithPreemptionMatchOneAtATime) {
  auto reference_runner = make_runner(64);
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 48;
  params.ignore_eos = true;  // every sequence grows to its full length, so the cache runs out
  Generator generator(*reference_runner, tokenizer_);

  // 18 requests (the prompts three times over, sharing prefixes) over 10 blocks of 16 tokens:
  // one sequence needs up to 5, so at most two run at once without preemption.
  std::vector<std::vector<int32_t>> prompts;
  for (int round = 0; round < 3; ++round) {
    for (const std::string& prompt : kPrompts) prompts.push_back(encode(prompt));
  }
  std::vector<std::vector<int32_t>> expected;
  for (const auto& prompt : prompts) expected.push_back(generator.generate(prompt, params).output_ids);

  auto tight_runner = make_runner(10, 32, 6);
  for (const bool splitfuse : {true, false}) {
    SCOPED_TRACE(splitfuse ? "splitfuse" : "prefill-first");
    Engine engine(*tight_runner, tokenizer_, config_for(*tight_runner, 128, splitfuse));
    std::vector<int64_t> ids;
    for (const auto& prompt : prompts) ids.push_back(engine.add_request(prompt, params));
    int64_t preemptions = 0;
    const Choices choices = run_to_completion(engine, &preemptions);
    EXPECT_GT(preemptions, 0) << "the cache was meant to be too small to avoid preemption";
    EXPECT_GT(engine.scheduler().block_manager().stats().hit_blocks, 0);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(choices.at({ids[i], 0}).ids, expected[i]) << "request " << i;
      EXPECT_EQ(choices.at({ids[i], 0}).finish_reason, FinishReason::Length);
    }
    EXPECT_EQ(engine.scheduler().block_manager().num_free_blocks(), 10);
  }
}

// The KV of swapped sequences goes to the runner's host area and back through the CPU backend's
// copy_blocks: the greedy outputs must be those of the same requests on a cache large enough that
// nothing is preempted.
TEST_F(EngineTest, SwappingUnderATinyCacheGivesTheOutputsOfAnAmpleCache) {
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 48;
  params.ignore_eos = true;
  std::vector<std::vector<int32_t>> prompts;
  for (int round = 0; round < 3; ++round) {
    for (const std::string& prompt : kPrompts) prompts.push_back(encode(prompt));
  }
  auto ample_runner = make_runner(128, 32, 6);
  auto tight_runner = make_runner(10, 32, 6, 64);
  for (const bool splitfuse : {true, false}) {
    SCOPED_TRACE(splitfuse ? "splitfuse" : "prefill-first");
    Engine ample(*ample_runner, tokenizer_, config_for(*ample_runner, 128, splitfuse));
    std::vector<int64_t> ample_ids;
    for (const auto& prompt : prompts) ample_ids.push_back(ample.add_request(prompt, params));
    int64_t ample_preemptions = 0;
    const Choices expected = run_to_completion(ample, &ample_preemptions);
    ASSERT_EQ(ample_preemptions, 0) << "the reference must run without preemption";

    // Victims with 16 tokens or more to recompute are swapped (one block of stories260K's KV is
    // 20 KiB; 64 host blocks hold any victim here).
    SchedulerConfig config = config_for(*tight_runner, 128, splitfuse);
    config.swap_min_tokens = 16;
    Engine engine(*tight_runner, tokenizer_, config);
    std::vector<int64_t> ids;
    for (const auto& prompt : prompts) ids.push_back(engine.add_request(prompt, params));
    int64_t preemptions = 0, swap_outs = 0;
    const Choices choices = run_to_completion(engine, &preemptions, &swap_outs);
    EXPECT_GT(swap_outs, 0) << "the cache was meant to force swapping";
    EXPECT_EQ(engine.scheduler().num_swap_outs(), swap_outs);
    EXPECT_GE(preemptions, swap_outs);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(choices.at({ids[i], 0}).ids, expected.at({ample_ids[i], 0}).ids) << "request " << i;
      EXPECT_EQ(choices.at({ids[i], 0}).ids.size(), 48u);
    }
    EXPECT_EQ(engine.scheduler().block_manager().num_free_blocks(), 10);
    EXPECT_EQ(engine.scheduler().block_manager().num_free_host_blocks(), 64);
    EXPECT_EQ(engine.num_swapped_sequences(), 0);
  }
}

TEST_F(EngineTest, AbortOfASwappedRequestFreesItsHostBlocks) {
  auto runner = make_runner(10, 32, 6, 64);
  SchedulerConfig config = config_for(*runner, 128);
  config.swap_min_tokens = 16;
  Engine engine(*runner, tokenizer_, config);
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 48;
  params.ignore_eos = true;
  std::vector<int64_t> ids;
  for (const std::string& prompt : kPrompts) ids.push_back(engine.add_request(prompt, params));
  for (int steps = 0; engine.num_swapped_sequences() == 0; ++steps) {
    ASSERT_LT(steps, 1000) << "nothing was swapped";
    engine.step();
  }
  const Sequence* swapped = engine.scheduler().swapped().front();
  ASSERT_FALSE(swapped->host_block_table.empty());
  EXPECT_LT(engine.scheduler().block_manager().num_free_host_blocks(), 64);
  // Requests are numbered from 0 and hold one sequence each here, so the sequence id is the request's.
  EXPECT_TRUE(engine.abort(swapped->id));
  EXPECT_EQ(engine.num_swapped_sequences(), 0);
  EXPECT_EQ(engine.scheduler().block_manager().num_free_host_blocks(), 64);
  run_to_completion(engine);
  EXPECT_EQ(engine.scheduler().block_manager().num_free_blocks(), 10);
}

TEST_F(EngineTest, SeededChoicesEqualTheGeneratorWithSeedPlusIndex) {
  auto runner = make_runner(64);
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_p = 0.95f;
  params.max_tokens = 40;
  params.seed = 1234;
  // A prompt of more than two full blocks, so the later choices find them in the prefix cache.
  const std::vector<int32_t> prompt = encode(kPrompts[0] + " " + kPrompts[2]);
  ASSERT_GT(prompt.size(), 2u * kBlockSize);

  Generator generator(*runner, tokenizer_);
  std::vector<GenerationResult> expected;
  for (uint64_t i = 0; i < 3; ++i) {
    SamplingParams choice = params;
    choice.seed = *params.seed + i;
    expected.push_back(generator.generate(prompt, choice));
  }
  ASSERT_NE(expected[0].output_ids, expected[1].output_ids) << "the seeds were meant to give different stories";

  // The Generator draws with the host Sampler; so does the engine without device sampling.
  Engine engine(*runner, tokenizer_, config_for(*runner, 512), EngineOptions{.device_sampling = false});
  // Another request in between, so the batch composition differs from the reference runs.
  engine.add_request(kPrompts[1], params);
  const int64_t id = engine.add_request(prompt, params, 3);
  EXPECT_EQ(engine.num_waiting_sequences(), 4);
  int32_t prefill_tokens = 0;
  Choices choices;
  while (engine.has_unfinished()) {
    EngineStep step = engine.step();
    prefill_tokens += step.num_prefill_tokens;
    for (SequenceOutput& out : step.outputs) {
      Choice& c = choices[{out.request_id, out.index}];
      c.ids.push_back(out.token.token_id);
      c.text += out.text;
      c.finish_reason = out.finish_reason;
    }
  }
  for (int32_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(choices.at({id, i}).ids, expected[static_cast<size_t>(i)].output_ids);
    EXPECT_EQ(choices.at({id, i}).text, expected[static_cast<size_t>(i)].text);
    EXPECT_EQ(choices.at({id, i}).finish_reason, expected[static_cast<size_t>(i)].finish_reason);
  }
  // The prompt's full blocks were computed once, not three times.
  const int32_t shared_blocks = (static_cast<int32_t>(prompt.size()) - 1) / kBlockSize;
  EXPECT_GE(engine.scheduler().block_manager().stats().hit_blocks, 2 * shared_blocks);
  const int32_t other_prompt = static_cast<int32_t>(encode(kPrompts[1]).size());
  EXPECT_EQ(prefill_tokens, other_prompt + 3 * static_cast<int32_t>(prompt.size()) - 2 * shared_blocks * kBlockSize);
}

// Sequences the device rule covers are drawn by it (ModelRunner::forward_sample), in steps of
// their own and in steps mixed with host-sampled sequences alike. Reference: the CPU backend's
// sample() over the logits of a forward of the whole sequence so far, with the choice's seed
// and the number of tokens generated before as the step.
TEST_F(EngineTest, DeviceRuleSamplingMatchesTheBackendsSampleAndIgnoresBatching) {
  auto runner = make_runner(64);
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_k = 40;
  params.top_p = 0.95f;
  params.min_p = 0.01f;
  params.max_tokens = 30;
  params.seed = 77;
  ASSERT_TRUE(device_samplable(params));
  const std::vector<int32_t> prompt = encode(kPrompts[4]);

  std::vector<std::vector<int32_t>> expected;
  for (uint64_t choice = 0; choice < 2; ++choice) {
    std::vector<int32_t> tokens = prompt;
    std::vector<int32_t> generated;
    while (static_cast<int32_t>(generated.size()) < params.max_tokens) {
      ForwardBatch batch;
      batch.token_ids = tokens;
      const int32_t n = static_cast<int32_t>(tokens.size());
      std::vector<int32_t> table(static_cast<size_t>((n + kBlockSize - 1) / kBlockSize));
      std::iota(table.begin(), table.end(), 0);
      batch.spans.push_back({n, 0, table, true});
      Tensor logits = runner->forward(batch);
      SamplingRow row{params.temperature, params.top_k, params.top_p, params.min_p, *params.seed + choice,
                      static_cast<uint64_t>(generated.size())};
      int32_t token = -1;
      backend_->sample(DeviceTensor{logits.as<float>(), DType::F32, {1, runner->spec().vocab_size}},
                       DeviceTensor{&row, DType::I32, {1, kSamplingRowWords}}, DeviceTensor{&token, DType::I32, {1}});
      generated.push_back(token);
      tokens.push_back(token);
      if (token == tokenizer_->eos_ids().at(0)) break;
    }
    expected.push_back(generated);
  }
  ASSERT_NE(expected[0], expected[1]);

  for (const bool mixed : {false, true}) {
    SCOPED_TRACE(mixed ? "mixed with a host-sampled request" : "device-sampled steps only");
    Engine engine(*runner, tokenizer_, config_for(*runner, 512));
    if (mixed) {
      SamplingParams host = params;
      host.logprobs = true;  // needs the logits on the host
      host.max_tokens = 40;
      engine.add_request(kPrompts[0], host);
    }
    const int64_t id = engine.add_request(prompt, params, 2);
    const Choices choices = run_to_completion(engine);
    EXPECT_EQ(choices.at({id, 0}).ids, expected[0]);
    EXPECT_EQ(choices.at({id, 1}).ids, expected[1]);
    EXPECT_TRUE(std::isnan(choices.at({id, 0}).tokens.front().logprob));
  }
}

TEST_F(EngineTest, StopStringEndsTheTextBeforeIt) {
  auto runner = make_runner(64);
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 80;
  Generator generator(*runner, tokenizer_);
  const std::vector<int32_t> prompt = encode(kPrompts[0]);
  const GenerationResult unstopped = generator.generate(prompt, params);

  // A word from the middle of the story, and a string that spans several tokens.
  const size_t middle = unstopped.text.find(' ', unstopped.text.size() / 2);
  ASSERT_NE(middle, std::string::npos);
  const std::string stop = unstopped.text.substr(middle, 4);
  const std::string expected_text = unstopped.text.substr(0, unstopped.text.find(stop));
  params.stop = {"never appears in a story \x01", stop};

  Engine engine(*runner, tokenizer_, config_for(*runner, 512));
  const int64_t id = engine.add_request(prompt, params);
  const Choices choices = run_to_completion(engine);
  const Choice& choice = choices.at({id, 0});
  EXPECT_EQ(choice.text, expected_text);
  EXPECT_EQ(choice.finish_reason, FinishReason::Stop);
  // The tokens are the unstopped ones up to where the stop string completed.
  ASSERT_LE(choice.ids.size(), unstopped.output_ids.size());
  EXPECT_TRUE(std::equal(choice.ids.begin(), choice.ids.end(), unstopped.output_ids.begin()));
  EXPECT_LT(choice.ids.size(), unstopped.output_ids.size());
  EXPECT_EQ(engine.scheduler().block_manager().num_free_blocks(), runner->kv_config().num_blocks);
}

TEST_F(EngineTest, LogprobsAreTheModelsLogSoftmax) {
  auto runner = make_runner(64);
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 12;
  params.logprobs = true;
  params.top_logprobs = 3;
  const std::vector<int32_t> prompt = encode(kPrompts[3]);
  Engine engine(*runner, tokenizer_, config_for(*runner, 512));
  const int64_t id = engine.add_request(prompt, params);
  const Choice choice = run_to_completion(engine).at({id, 0});
  ASSERT_EQ(choice.tokens.size(), 12u);

  // Reference: one forward over prompt + outputs with logits for every position.
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), choice.ids.begin(), choice.ids.end() - 1);
  ForwardBatch batch;
  batch.token_ids = all;
  batch.logits_mode = LogitsMode::All;
  const int32_t n = static_cast<int32_t>(all.size());
  std::vector<int32_t> table(static_cast<size_t>((n + kBlockSize - 1) / kBlockSize));
  std::iota(table.begin(), table.end(), 0);
  batch.spans.push_back({n, 0, table, true});
  const Tensor logits = runner->forward(batch);
  const size_t vocab = static_cast<size_t>(runner->spec().vocab_size);
  for (size_t t = 0; t < choice.tokens.size(); ++t) {
    SCOPED_TRACE(t);
    const float* row = logits.as<float>() + (prompt.size() - 1 + t) * vocab;
    double max = row[0];
    for (size_t v = 0; v < vocab; ++v) max = std::max<double>(max, row[v]);
    double sum = 0;
    for (size_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - max);
    auto logprob = [&](int32_t id) { return row[id] - max - std::log(sum); };
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 3, order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    const TokenOutput& token = choice.tokens[t];
    EXPECT_EQ(token.token_id, order[0]);  // greedy
    EXPECT_NEAR(token.logprob, logprob(token.token_id), 1e-4);
    ASSERT_EQ(token.top_logprobs.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(token.top_logprobs[k].token_id, order[k]);
      EXPECT_NEAR(token.top_logprobs[k].logprob, logprob(order[k]), 1e-4);
    }
  }
}

TEST_F(EngineTest, AbortFreesBlocksAndEndsOutput) {
  auto runner = make_runner(64);
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 200;
  params.ignore_eos = true;
  Engine engine(*runner, tokenizer_, config_for(*runner, 512));
  const int64_t keep = engine.add_request(kPrompts[1], params);
  const int64_t drop = engine.add_request(kPrompts[0], params, 2);
  int drop_outputs = 0;
  for (int i = 0; i < 10; ++i) {
    for (const SequenceOutput& out : engine.step().outputs) drop_outputs += out.request_id == drop;
  }
  ASSERT_GT(drop_outputs, 0);
  const int32_t free_before = engine.scheduler().block_manager().num_free_blocks();
  EXPECT_TRUE(engine.abort(drop));
  EXPECT_FALSE(engine.abort(drop));
  EXPECT_FALSE(engine.abort(12345));
  // Both choices of the aborted request held blocks (the second shares the prompt's full blocks).
  EXPECT_GT(engine.scheduler().block_manager().num_free_blocks(), free_before);
  EXPECT_EQ(engine.num_unfinished_requests(), 1);
  EXPECT_EQ(engine.num_running_sequences(), 1);
  const Choices rest = run_to_completion(engine);
  EXPECT_EQ(rest.count({drop, 0}) + rest.count({drop, 1}), 0u);
  EXPECT_EQ(rest.at({keep, 0}).finish_reason, FinishReason::Length);
  EXPECT_EQ(engine.scheduler().block_manager().num_free_blocks(), runner->kv_config().num_blocks);
}

TEST_F(EngineTest, AbortBeforeTheLaterChoicesAreQueued) {
  auto runner = make_runner(64);
  SamplingParams params;
  params.max_tokens = 5;
  Engine engine(*runner, tokenizer_, config_for(*runner, 512));
  const int64_t id = engine.add_request(kPrompts[0], params, 4);
  EXPECT_EQ(engine.num_waiting_sequences(), 4);
  EXPECT_TRUE(engine.abort(id));
  EXPECT_EQ(engine.num_waiting_sequences(), 0);
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_TRUE(engine.step().outputs.empty());
}

TEST_F(EngineTest, ContextLimitEndsWithLength) {
  auto runner = make_runner(64);
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 1000;
  params.ignore_eos = true;
  params.stop = {"zzzzzzzzz"};  // text is held back while it could start a stop string
  Engine engine(*runner, tokenizer_, config_for(*runner, 40));
  const std::vector<int32_t> prompt = encode(kPrompts[1]);
  const int64_t id = engine.add_request(prompt, params);
  const Choice choice = run_to_completion(engine).at({id, 0});
  // Tokens are sampled until the sequence passes the 40-token context.
  EXPECT_EQ(prompt.size() + choice.ids.size(), 41u);
  EXPECT_EQ(choice.finish_reason, FinishReason::Length);
  EXPECT_EQ(choice.text, tokenizer_->decode(choice.ids, true));
}

TEST_F(EngineTest, RejectsBadRequests) {
  auto runner = make_runner(64);
  Engine engine(*runner, tokenizer_, config_for(*runner, 100));
  SamplingParams params;
  auto message = [&](std::vector<int32_t> ids, SamplingParams p, int32_t n) -> std::string {
    try {
      engine.add_request(std::move(ids), p, n);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message({}, params, 1).find("prompt is empty"), std::string::npos);
  EXPECT_NE(message({1, 512}, params, 1).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(message({1, -1}, params, 1).find("index 1"), std::string::npos);
  EXPECT_NE(message(std::vector<int32_t>(101, 5), params, 1).find("context holds 100"), std::string::npos);
  EXPECT_NE(message({1, 2}, params, 0).find("n (choices"), std::string::npos);
  SamplingParams bad = params;
  bad.top_p = 0;
  EXPECT_NE(message({1, 2}, bad, 1).find("top_p"), std::string::npos);
  bad = params;
  bad.stop_token_ids = {600};
  EXPECT_NE(message({1, 2}, bad, 1).find("stop_token_ids[0]"), std::string::npos);
  EXPECT_FALSE(engine.has_unfinished());
  // A scheduler config that does not match the runner.
  SchedulerConfig config = config_for(*runner, 100);
  config.num_blocks = 63;
  EXPECT_THROW(Engine(*runner, tokenizer_, config), Error);
  config = config_for(*runner, 100);
  config.max_batch_tokens = 65;
  EXPECT_THROW(Engine(*runner, tokenizer_, config), Error);
  config = config_for(*runner, 100);
  config.num_host_blocks = 8;  // the runner has no swap area
  EXPECT_THROW(Engine(*runner, tokenizer_, config), Error);
  EXPECT_THROW(Engine(*runner, nullptr, config_for(*runner, 100)).add_request("text", params), Error);
}

// The two additions the engine needs from its parts.
TEST(StopCheckerFinish, ReleasesHeldBackTextAndKeepsAnEarlierReason) {
  SamplingParams params;
  params.stop = {"END"};
  StopChecker stop(params, std::vector<int32_t>{2});
  stop.append(5, "the E");
  EXPECT_EQ(stop.safe_bytes(), 4u);  // "E" could start "END"
  stop.finish(FinishReason::Length);
  EXPECT_EQ(stop.finish_reason(), FinishReason::Length);
  EXPECT_EQ(stop.safe_bytes(), 5u);
  // The released "E" is final: only a stop string wholly inside the final text counts.
  stop.append_final_text("ND END!");
  EXPECT_EQ(stop.text(), "the END ");
  EXPECT_EQ(stop.finish_reason(), FinishReason::Stop);
  stop.finish(FinishReason::Abort);  // no-op once finished
  EXPECT_EQ(stop.finish_reason(), FinishReason::Stop);
  EXPECT_THROW(stop.finish(FinishReason::None), Error);
  EXPECT_EQ(finish_reason_name(FinishReason::Abort), "abort");
}

TEST(SchedulerAddAtFront, QueuesAheadOfEarlierSequences) {
  SchedulerConfig config;
  config.max_batch_tokens = 8;
  config.max_seqs = 1;
  config.max_model_len = 32;
  config.num_blocks = 8;
  config.block_size = 4;
  Scheduler scheduler(config);
  Sequence first(0, {1, 2, 3}, SamplingParams{}), second(1, {4, 5}, SamplingParams{});
  scheduler.add(first);
  scheduler.add(second, /*at_front=*/true);
  ASSERT_EQ(scheduler.waiting().size(), 2u);
  EXPECT_EQ(scheduler.waiting().front(), &second);
  const StepPlan plan = scheduler.schedule();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0], &second);
}

}  // namespace
}  // namespace splitflow
