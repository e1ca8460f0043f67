// AsyncEngine over the real stories260K model: concurrent clients get exactly the single-request
// Generator's greedy outputs; queue limits, cancels, drain and stop behave as documented. Tests
// that need a deterministic interleaving drive the loop themselves with run_once().
#include "server/async_engine.h"

#include "core/error.h"
#include "server_test_util.h"

#include <gtest/gtest.h>

#include <latch>
#include <thread>

namespace splitflow {
namespace {

using namespace std::chrono_literals;

struct Collected {
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;
  std::vector<FinishReason> reasons;
  std::string error;
  int updates = 0;
};

Collected collect(RequestStream& stream) {
  Collected c;
  c.texts.resize(static_cast<size_t>(stream.num_choices()));
  c.ids.resize(c.texts.size());
  c.reasons.resize(c.texts.size(), FinishReason::None);
  RequestUpdate update;
  while (true) {
    if (!stream.next(update, 10s)) {
      ADD_FAILURE() << "no update within 10 s";
      return c;
    }
    ++c.updates;
    for (size_t i = 0; i < c.texts.size(); ++i) {
      c.texts[i] += update.choices[i].text;
      for (const TokenOutput& t : update.choices[i].tokens) c.ids[i].push_back(t.token_id);
      if (update.choices[i].finish_reason != FinishReason::None) c.reasons[i] = update.choices[i].finish_reason;
    }
    if (update.finished) {
      c.error = update.error;
      return c;
    }
  }
}

SamplingParams greedy(int32_t max_tokens) {
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = max_tokens;
  return params;
}

const std::vector<std::string> kPrompts = {"Once upon a time", "Tom had a big red ball.", "The sun was shining",
                                           "One day, a bird", "Lily and her mom went to the park.",
                                           "There was a boy who liked to run.", "The cat sat", "Max was sad"};

// Every prompt of kPrompts from its own client thread at once, greedy, 40 tokens each. The engine
// loop starts once every client has submitted, so all sequences compete for the KV blocks from
// the first step (tests that expect preemption or swapping do not depend on thread timing).
std::vector<Collected> submit_all_concurrently(AsyncEngine& async, test::StoriesEngine& stories) {
  std::vector<Collected> results(kPrompts.size());
  std::vector<std::thread> clients;
  std::latch submitted(static_cast<std::ptrdiff_t>(kPrompts.size()));
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    clients.emplace_back([&, i] {
      auto stream = async.submit(stories.tokenizer->encode(kPrompts[i], true), greedy(40), 1);
      submitted.count_down();
      results[i] = collect(*stream);
    });
  }
  submitted.wait();
  async.start();
  for (std::thread& client : clients) client.join();
  return results;
}

TEST(AsyncEngine, ConcurrentClientsGetTheGreedyOutputsOfOneAtATime) {
  // 12 blocks for 4 running sequences of up to 4 blocks each: some are preempted on the way.
  test::StoriesEngine stories(/*num_blocks=*/12, /*max_seqs=*/4, /*max_batch_tokens=*/32, /*max_model_len=*/128);
  AsyncEngine async(*stories.engine, AsyncEngineConfig{});
  const std::vector<Collected> results = submit_all_concurrently(async, stories);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    SCOPED_TRACE(kPrompts[i]);
    const GenerationResult expected = stories.reference(stories.tokenizer->encode(kPrompts[i], true), 40);
    EXPECT_EQ(results[i].ids[0], expected.output_ids);
    EXPECT_EQ(results[i].texts[0], expected.text);
    EXPECT_EQ(results[i].reasons[0], expected.finish_reason);
    EXPECT_TRUE(results[i].error.empty());
  }
  EXPECT_EQ(async.num_in_flight(), 0);
  const std::string metrics = async.render_metrics();
  EXPECT_NE(metrics.find("splitflow_time_to_first_token_seconds_count 8\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("splitflow_e2e_request_latency_seconds_count 8\n"), std::string::npos);
  EXPECT_EQ(metrics.find("splitflow_preemptions_total 0\n"), std::string::npos) << "meant to preempt";
  async.stop();
}

TEST(AsyncEngine, SwappingClientsGetTheGreedyOutputsAndTheSwapMetricsCount) {
  // As above, with 64 host blocks: victims with 16 tokens or more to recompute are swapped.
  test::StoriesEngine stories(12, 4, 32, 128, /*num_host_blocks=*/64, /*swap_min_tokens=*/16);
  AsyncEngine async(*stories.engine, AsyncEngineConfig{});
  const std::vector<Collected> results = submit_all_concurrently(async, stories);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    SCOPED_TRACE(kPrompts[i]);
    const GenerationResult expected = stories.reference(stories.tokenizer->encode(kPrompts[i], true), 40);
    EXPECT_EQ(results[i].ids[0], expected.output_ids);
    EXPECT_TRUE(results[i].error.empty());
  }
  const std::string metrics = async.render_metrics();
  EXPECT_EQ(metrics.find("splitflow_swap_outs_total 0\n"), std::string::npos) << "meant to swap";
  EXPECT_NE(metrics.find("splitflow_swap_outs_total "), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("splitflow_num_sequences_swapped 0\n"), std::string::npos) << "all swapped back";
  async.stop();
  EXPECT_EQ(stories.engine->scheduler().block_manager().num_free_host_blocks(), 64);
}

TEST(AsyncEngine, QueueLimitRefusesOnlyWhileSequencesWait) {
  test::StoriesEngine stories;
  AsyncEngine async(*stories.engine, AsyncEngineConfig{.max_queued_sequences = 3});
  const auto prompt = stories.tokenizer->encode(kPrompts[0], true);
  auto a = async.submit(prompt, greedy(5), 2);
  auto b = async.submit(prompt, greedy(5), 1);
  try {
    async.submit(prompt, greedy(5), 1);
    ADD_FAILURE() << "a fourth waiting sequence was accepted";
  } catch (const SubmitRejected& e) {
    EXPECT_EQ(e.reason, SubmitRejected::Reason::QueueFull);
    EXPECT_NE(std::string(e.what()).find("3 sequences wait"), std::string::npos) << e.what();
  }
  EXPECT_EQ(async.num_in_flight(), 2);
  while (async.run_once()) {
  }
  EXPECT_EQ(collect(*a).reasons, (std::vector<FinishReason>{FinishReason::Length, FinishReason::Length}));
  EXPECT_EQ(collect(*b).reasons[0], FinishReason::Length);
  EXPECT_NE(async.render_metrics().find("splitflow_requests_rejected_total{reason=\"queue_full\"} 1"), std::string::npos);

  // With nothing waiting, a request larger than the queue is still taken.
  auto big = async.submit(prompt, greedy(3), 5);
  while (async.run_once()) {
  }
  EXPECT_EQ(collect(*big).reasons.size(), 5u);
}

TEST(AsyncEngine, GroupsAreAdmittedWholeOrNotAtAll) {
  test::StoriesEngine stories;
  AsyncEngine async(*stories.engine, AsyncEngineConfig{.max_queued_sequences = 4});
  std::vector<std::vector<int32_t>> prompts;
  for (size_t p = 0; p < 3; ++p) prompts.push_back(stories.tokenizer->encode(kPrompts[p], true));
  auto group_of = [&](size_t count, int32_t max_tokens) {
    std::vector<PromptSubmission> group;
    for (size_t p = 0; p < count; ++p) group.push_back({prompts[p], greedy(max_tokens)});
    return group;
  };
  auto single = async.submit(prompts[0], greedy(4), 1);
  // 1 waiting + 3 prompts * 2 choices > 4: none of the three is queued.
  EXPECT_THROW(async.submit_group(group_of(3, 4), 2), SubmitRejected);
  EXPECT_EQ(async.num_in_flight(), 1);
  // A prompt the engine refuses (a token id past the 512-token vocabulary) is named; none is queued.
  std::vector<PromptSubmission> bad = group_of(3, 4);
  bad[1].prompt_ids.push_back(600);
  try {
    async.submit_group(std::move(bad), 1);
    ADD_FAILURE() << "a bad prompt was accepted";
  } catch (const PromptRejected& e) {
    EXPECT_EQ(e.index, 1u);
    EXPECT_TRUE(std::string(e.what()).starts_with("prompt 1: ")) << e.what();
  }
  EXPECT_EQ(async.num_in_flight(), 1);

  // 1 + 3 fits: each stream gets its own prompt's greedy output, and all share one group.
  const auto streams = async.submit_group(group_of(3, 6), 1);
  ASSERT_EQ(streams.size(), 3u);
  EXPECT_EQ(async.num_in_flight(), 4);
  for (size_t p = 1; p < 3; ++p) EXPECT_EQ(&streams[p]->group(), &streams[0]->group());
  EXPECT_NE(&single->group(), &streams[0]->group());
  const uint64_t version = streams[0]->group().version();
  while (async.run_once()) {
  }
  EXPECT_GT(streams[0]->group().version(), version);
  EXPECT_TRUE(streams[0]->group().wait_for_news(version, 0ms));
  for (size_t p = 0; p < 3; ++p) {
    SCOPED_TRACE(p);
    EXPECT_EQ(streams[p]->num_prompt_tokens(), static_cast<int32_t>(prompts[p].size()));
    EXPECT_EQ(collect(*streams[p]).ids[0], stories.reference(prompts[p], 6).output_ids);
  }
  EXPECT_EQ(collect(*single).ids[0], stories.reference(prompts[0], 4).output_ids);
}

TEST(AsyncEngine, CancelAbortsAndFreesTheBlocks) {
  test::StoriesEngine stories;
  AsyncEngine async(*stories.engine, AsyncEngineConfig{});
  SamplingParams params = greedy(300);
  params.ignore_eos = true;
  auto stream = async.submit(stories.tokenizer->encode(kPrompts[4], true), params, 2);
  for (int i = 0; i < 6; ++i) async.run_once();
  const BlockManager& blocks = stories.engine->scheduler().block_manager();
  EXPECT_LT(blocks.num_free_blocks(), blocks.num_blocks());
  async.cancel(stream);
  async.cancel(stream);  // twice is harmless
  async.run_once();
  EXPECT_EQ(blocks.num_free_blocks(), blocks.num_blocks());
  EXPECT_FALSE(stories.engine->has_unfinished());
  const Collected c = collect(*stream);
  EXPECT_EQ(c.reasons, (std::vector<FinishReason>{FinishReason::Abort, FinishReason::Abort}));
  EXPECT_GT(c.ids[0].size(), 0u);
  EXPECT_LT(c.ids[0].size(), 300u);
  EXPECT_EQ(async.num_in_flight(), 0);
  EXPECT_NE(async.render_metrics().find("splitflow_request_finished_total{finished_reason=\"abort\"} 2"),
            std::string::npos);
}

TEST(AsyncEngine, CancelBeforeAdmissionNeverReachesTheEngine) {
  test::StoriesEngine stories;
  AsyncEngine async(*stories.engine, AsyncEngineConfig{});
  auto stream = async.submit(stories.tokenizer->encode(kPrompts[1], true), greedy(10), 1);
  async.cancel(stream);
  async.run_once();
  EXPECT_FALSE(stories.engine->has_unfinished());
  EXPECT_EQ(collect(*stream).reasons[0], FinishReason::Abort);
  EXPECT_EQ(async.num_in_flight(), 0);
}

TEST(AsyncEngine, UpdatesMergeWhileTheClientDoesNotRead) {
  test::StoriesEngine stories;
  AsyncEngine async(*stories.engine, AsyncEngineConfig{});
  const auto prompt = stories.tokenizer->encode(kPrompts[0], true);
  auto stream = async.submit(prompt, greedy(8), 1);
  while (async.run_once()) {
  }
  const Collected c = collect(*stream);
  EXPECT_EQ(c.updates, 1);  // eight steps' outputs in one update
  EXPECT_EQ(c.ids[0], stories.reference(prompt, 8).output_ids);
}

TEST(AsyncEngine, DrainRefusesNewRequestsAndWaitsForInFlightOnes) {
  test::StoriesEngine stories;
  AsyncEngine async(*stories.engine, AsyncEngineConfig{});
  const auto prompt = stories.tokenizer->encode(kPrompts[2], true);
  SamplingParams params = greedy(60);
  params.ignore_eos = true;
  auto stream = async.submit(prompt, params, 1);
  async.begin_drain();
  try {
    async.submit(prompt, params, 1);
    ADD_FAILURE() << "a request was accepted while draining";
  } catch (const SubmitRejected& e) {
    EXPECT_EQ(e.reason, SubmitRejected::Reason::ShuttingDown);
  }
  EXPECT_FALSE(async.wait_until_idle(1ms));
  async.start();
  EXPECT_TRUE(async.wait_until_idle(10s));
  EXPECT_EQ(collect(*stream).reasons[0], FinishReason::Length);
  async.stop();
}

TEST(AsyncEngine, StopEndsInFlightRequestsWithAbort) {
  test::StoriesEngine stories;
  AsyncEngine async(*stories.engine, AsyncEngineConfig{});
  const auto prompt = stories.tokenizer->encode(kPrompts[3], true);
  auto running = async.submit(prompt, greedy(100), 1);
  async.run_once();
  async.run_once();
  auto pending = async.submit(prompt, greedy(100), 1);
  async.stop();
  EXPECT_EQ(collect(*running).reasons[0], FinishReason::Abort);
  EXPECT_EQ(collect(*pending).reasons[0], FinishReason::Abort);
  EXPECT_EQ(async.num_in_flight(), 0);
  EXPECT_FALSE(stories.engine->has_unfinished());
  async.stop();  // idempotent
}

TEST(AsyncEngine, BadRequestsThrowFromSubmit) {
  test::StoriesEngine stories;
  AsyncEngine async(*stories.engine, AsyncEngineConfig{});
  EXPECT_THROW(async.submit({1, 600}, greedy(5), 1), Error);
  EXPECT_THROW(async.submit(std::vector<int32_t>(513, 5), greedy(5), 1), Error);
  EXPECT_THROW(async.submit({1, 2}, greedy(5), 0), Error);
  EXPECT_EQ(async.num_in_flight(), 0);
  EXPECT_THROW(AsyncEngine(*stories.engine, AsyncEngineConfig{.max_queued_sequences = -1}), Error);
}

}  // namespace
}  // namespace splitflow
