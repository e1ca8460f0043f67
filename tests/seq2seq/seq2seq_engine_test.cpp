// Continuous batching of encoder-decoder requests through the Engine (engine/engine.h on a
// Seq2SeqRunner), on the tiny T5 and BART fixtures: requests arriving at different steps, sampled
// on the host and by the device rule, n = 2, a cancellation, and caches small enough to preempt by
// recompute (the encoder runs again) and by swap (the cross K/V travels with the blocks). Every
// choice's tokens must equal generate_seq2seq's for that request alone (tested against
// transformers in seq2seq_test.cpp), and the greedy ones transformers' own. Bad requests are
// refused with errors naming the problem.
#include "encdec_fixtures.h"
#include "splitflow_command.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
#include <set>

namespace splitflow {
namespace {

struct RequestPlan {
  std::vector<int32_t> prompt;
  SamplingParams params;
  int32_t n = 1;
  int32_t arrival_step = 0;
  std::vector<int32_t> transformers_greedy;  // empty unless the fixture has this prompt's
};

std::vector<int32_t> random_prompt(std::mt19937& rng, int32_t length, int32_t vocab) {
  std::uniform_int_distribution<int32_t> id(2, vocab - 1);
  std::vector<int32_t> prompt(static_cast<size_t>(length));
  for (int32_t& t : prompt) t = id(rng);
  return prompt;
}

SamplingParams greedy(int32_t max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

SamplingParams sampled(uint64_t seed, int32_t max_tokens, float temperature) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  p.max_tokens = max_tokens;
  return p;
}

struct RunStats {
  std::map<std::pair<int64_t, int32_t>, std::vector<int32_t>> outputs;  // (request, choice) -> tokens
  std::map<std::pair<int64_t, int32_t>, FinishReason> finish;
  int32_t max_decode_tokens = 0;   // most decode tokens of one step
  bool encoder_beside_decodes = false;  // a step ran encoders and other requests' decode steps
};

// Adds each request at its step and runs the engine until everything finishes; `on_step` may
// act on the engine after each step (cancel a request).
RunStats run(Engine& engine, const std::vector<RequestPlan>& requests, std::vector<int64_t>& ids,
             const std::function<void(int32_t step)>& on_step = {}) {
  RunStats stats;
  ids.assign(requests.size(), -1);
  for (int32_t step = 0;; ++step) {
    for (size_t r = 0; r < requests.size(); ++r) {
      if (requests[r].arrival_step == step)
        ids[r] = engine.add_request(requests[r].prompt, requests[r].params, requests[r].n);
    }
    const bool pending_arrivals = std::any_of(requests.begin(), requests.end(),
                                              [&](const RequestPlan& r) { return r.arrival_step > step; });
    if (!engine.has_unfinished() && !pending_arrivals) break;
    const EngineStep result = engine.step();
    stats.max_decode_tokens = std::max(stats.max_decode_tokens, result.num_decode_tokens);
    if (result.num_encoder_tokens > 0 && result.num_decode_tokens > 0) stats.encoder_beside_decodes = true;
    for (const SequenceOutput& out : result.outputs) {
      stats.outputs[{out.request_id, out.index}].push_back(out.token.token_id);
      if (out.finish_reason != FinishReason::None) stats.finish[{out.request_id, out.index}] = out.finish_reason;
    }
    if (on_step) on_step(step);
    EXPECT_LT(step, 500) << "the engine does not finish";
    if (step >= 500) break;
  }
  return stats;
}

// Each choice of each request against generate_seq2seq alone with that choice's seed.
void expect_equal_to_references(const test::EncDecEngine& fixture, const std::vector<RequestPlan>& requests,
                                const std::vector<int64_t>& ids, const RunStats& stats,
                                const std::set<int64_t>& cancelled = {}) {
  for (size_t r = 0; r < requests.size(); ++r) {
    if (cancelled.count(ids[r])) continue;
    for (int32_t i = 0; i < requests[r].n; ++i) {
      SamplingParams params = requests[r].params;
      if (params.seed) params.seed = *params.seed + static_cast<uint64_t>(i);
      const GenerationResult want = fixture.reference(requests[r].prompt, params);
      const auto key = std::make_pair(ids[r], i);
      ASSERT_TRUE(stats.outputs.count(key)) << "request " << r << " choice " << i << " gave nothing";
      EXPECT_EQ(stats.outputs.at(key), want.output_ids) << "request " << r << " choice " << i;
      EXPECT_EQ(stats.finish.at(key), want.finish_reason) << "request " << r << " choice " << i;
      if (!requests[r].transformers_greedy.empty()) {
        EXPECT_EQ(stats.outputs.at(key), requests[r].transformers_greedy) << "request " << r << " vs transformers";
      }
    }
  }
}

// Six requests over the fixture's two prompts and random ones, arriving over five steps.
std::vector<RequestPlan> mixed_requests(const test::EncDecModel& model) {
  const int32_t vocab = static_cast<int32_t>(model.spec.vocab_size);
  std::mt19937 rng(28);
  std::vector<RequestPlan> requests;
  for (int p = 0; p < 2; ++p) {
    const std::string key = "prompt" + std::to_string(p);
    const std::vector<int32_t> want = test::expected_ids(*model.expected, key + ".greedy");
    requests.push_back({test::expected_ids(*model.expected, key + ".encoder_tokens"),
                        greedy(static_cast<int32_t>(want.size())), 1, 0, want});
  }
  requests.push_back({random_prompt(rng, 5, vocab), sampled(7, 14, 0.9f), 2, 0, {}});
  requests.back().params.top_k = 40;
  SamplingParams penalized = sampled(11, 12, 1.0f);  // penalties: the host Sampler
  penalized.top_p = 0.9f;
  penalized.repetition_penalty = 1.2f;
  requests.push_back({random_prompt(rng, 17, vocab), penalized, 1, 0, {}});
  SamplingParams with_logprobs = greedy(16);
  with_logprobs.logprobs = true;
  requests.push_back({random_prompt(rng, 3, vocab), with_logprobs, 1, 3, {}});
  requests.push_back({random_prompt(rng, 30, vocab), sampled(5, 8, 0.7f), 1, 5, {}});
  return requests;
}

class EncDecEngineFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(EncDecEngineFixture, BatchedRequestsEqualEachAlone) {
  for (const bool splitfuse : {true, false}) {
    SCOPED_TRACE(splitfuse ? "splitfuse" : "prefill-first");
    test::EncDecEngine fixture(GetParam(), {.splitfuse = splitfuse});
    const std::vector<RequestPlan> requests = mixed_requests(fixture.model);
    std::vector<int64_t> ids;
    const RunStats stats = run(*fixture.engine, requests, ids);
    EXPECT_GE(stats.max_decode_tokens, 4) << "decoder steps of different requests were not batched";
    // Prefill-first pauses the decodes while a prompt runs.
    EXPECT_EQ(stats.encoder_beside_decodes, splitfuse) << "requests joining while others decode";
    expect_equal_to_references(fixture, requests, ids, stats);
    EXPECT_EQ(fixture.engine->scheduler().block_manager().num_free_blocks(), 64) << "blocks leaked";
  }
}

TEST_P(EncDecEngineFixture, CancelledRequestLeavesTheOthersUnchanged) {
  test::EncDecEngine fixture(GetParam());
  const std::vector<RequestPlan> requests = mixed_requests(fixture.model);
  std::vector<int64_t> ids;
  std::set<int64_t> cancelled;
  const RunStats stats = run(*fixture.engine, requests, ids, [&](int32_t step) {
    if (step == 2) {
      EXPECT_TRUE(fixture.engine->abort(ids[2]));
      cancelled.insert(ids[2]);
    }
  });
  EXPECT_LT(stats.outputs.at({ids[2], 0}).size(), 14u);
  expect_equal_to_references(fixture, requests, ids, stats, cancelled);
  EXPECT_EQ(fixture.engine->scheduler().block_manager().num_free_blocks(), 64) << "blocks leaked";
}

// Short prompts whose decoders outgrow them: 4 sequences of up to 7 blocks in 14.
std::vector<RequestPlan> growing_requests(const test::EncDecModel& model) {
  const int32_t vocab = static_cast<int32_t>(model.spec.vocab_size);
  std::mt19937 rng(4);
  std::vector<RequestPlan> requests;
  requests.push_back({random_prompt(rng, 3, vocab), greedy(24), 1, 0, {}});
  requests.push_back({random_prompt(rng, 6, vocab), sampled(3, 24, 0.8f), 1, 0, {}});
  requests.push_back({random_prompt(rng, 4, vocab), greedy(22), 1, 0, {}});
  requests.push_back({random_prompt(rng, 5, vocab), sampled(9, 24, 1.0f), 1, 1, {}});
  for (RequestPlan& r : requests) r.params.ignore_eos = true;
  return requests;
}

TEST_P(EncDecEngineFixture, PreemptionByRecomputeRunsTheEncoderAgain) {
  test::EncDecEngine fixture(GetParam(), {.num_blocks = 14, .max_seqs = 4});
  const std::vector<RequestPlan> requests = growing_requests(fixture.model);
  std::vector<int64_t> ids;
  const RunStats stats = run(*fixture.engine, requests, ids);
  EXPECT_GT(fixture.engine->scheduler().num_preemptions(), 0);
  EXPECT_EQ(fixture.engine->scheduler().num_swap_outs(), 0);
  expect_equal_to_references(fixture, requests, ids, stats);
}

TEST_P(EncDecEngineFixture, PreemptionBySwapKeepsTheCrossKv) {
  test::EncDecEngine fixture(GetParam(), {.num_blocks = 14, .max_seqs = 4, .num_host_blocks = 32, .swap_min_tokens = 1});
  const std::vector<RequestPlan> requests = growing_requests(fixture.model);
  std::vector<int64_t> ids;
  const RunStats stats = run(*fixture.engine, requests, ids);
  EXPECT_GT(fixture.engine->scheduler().num_swap_outs(), 0);
  expect_equal_to_references(fixture, requests, ids, stats);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EncDecEngineFixture, ::testing::ValuesIn(test::encdec_fixture_names()),
                         [](const auto& info) { return info.param; });

void expect_error(const std::function<void()>& call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(EncDecEngine, RefusesBadRequests) {
  test::EncDecEngine fixture("t5_v1_0", {.max_batch_tokens = 40});
  Engine& engine = *fixture.engine;
  // The encoder runs whole in one step beside the decoder's first token: 39 tokens at most here.
  EXPECT_EQ(engine.max_prompt_tokens(), 39);
  const SamplingParams params = greedy(4);
  expect_error([&] { engine.add_request(std::vector<int32_t>(40, 5), params); },
               "the prompt has 40 tokens but the encoder takes at most 39");
  expect_error([&] { engine.add_request(std::vector<int32_t>{}, params); }, "the prompt is empty");
  expect_error([&] { engine.add_request(std::vector<int32_t>{5, 128}, params); }, "outside the vocabulary");
  RequestStart resumed;
  resumed.prior_output_ids = {3};
  expect_error([&] { engine.add_request(std::vector<int32_t>{5, 6}, params, 1, resumed); }, "cannot be resumed");
  EXPECT_FALSE(engine.has_unfinished());
  // A prompt at the limit still runs.
  const int64_t id = engine.add_request(std::vector<int32_t>(39, 5), params);
  int32_t tokens = 0;
  while (engine.has_unfinished()) {
    for (const SequenceOutput& out : engine.step().outputs) tokens += out.request_id == id;
  }
  EXPECT_EQ(tokens, 4);
}

TEST(EncDecEngine, TheDecoderAloneIsRefused) {
  test::EncDecEngine fixture("bart");
  SchedulerConfig config = fixture.engine->config();
  expect_error([&] { Engine(fixture.runner->decoder(), nullptr, config); }, "the engine needs its encoder too");
}

// The fixtures have no tokenizer: `splitflow generate` runs them on --prompt-ids (printing ids) and
// names the missing tokenizer when given text.
TEST(EncDecCommand, GenerateRunsAFixtureWithoutATokenizerOnIds) {
  const test::EncDecModel model = test::load_encdec("t5_v1_1");
  const std::vector<int32_t> prompt = test::expected_ids(*model.expected, "prompt1.encoder_tokens");
  const std::vector<int32_t> want = test::expected_ids(*model.expected, "prompt1.greedy");
  std::string ids;
  for (const int32_t id : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  const std::string dir = test::fixture_path("encdec/t5_v1_1");
  const test::CommandResult result = test::run_splitflow({"generate", "--model", dir, "--prompt-ids", ids, "-n",
                                                          std::to_string(want.size()), "--temp", "0", "--ignore-eos"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::string expected;
  for (const int32_t id : want) expected += std::to_string(id) + " ";
  EXPECT_EQ(result.out, expected + "\n");
  EXPECT_NE(result.err.find("has no tokenizer.json: prompts must be token ids"), std::string::npos) << result.err;
  test::expect_command_error(test::run_splitflow({"generate", "--model", dir, "--prompt", "hello"}),
                             "this model has no tokenizer: pass --tokenizer or --prompt-ids");
}

}  // namespace
}  // namespace splitflow
