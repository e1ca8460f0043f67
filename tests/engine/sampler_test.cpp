// The Sampler's chain (order, greedy path, penalties over history, seeds, logprobs, bad input)
// against references computed here in double precision.
#include "core/error.h"
#include "engine/sampler.h"
#include "sampling_reference.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace splitflow {
namespace {

using test::ids_by_probability;
using test::random_logits;
using test::restrict_to;
using test::softmax;

void expect_error_mentions(const std::function<void()>& action, const std::string& text) {
  try {
    action();
    ADD_FAILURE() << "no error; expected one mentioning '" << text << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(Sampler, GreedyTakesTheArgmaxAfterPenalties) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.top_k = 1;  // ignored on the greedy path
  params.repetition_penalty = 1.2f;
  Sampler sampler(params, 4);
  const std::vector<float> logits = {2.0f, 1.9f, -1.0f, 0.0f};
  EXPECT_EQ(sampler.sample(logits, std::vector<int32_t>{3}, {}).token_id, 0);
  // Token 0 in the prompt: 2.0 / 1.2 = 1.67 < 1.9.
  Sampler penalized(params, 4);
  EXPECT_EQ(penalized.sample(logits, std::vector<int32_t>{0}, {}).token_id, 1);
}

TEST(Sampler, FrequencyAndPresencePenaltiesCountOnlyGeneratedTokens) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.frequency_penalty = 0.3f;
  params.presence_penalty = 0.2f;
  const std::vector<float> logits = {2.0f, 1.6f, 1.0f};
  Sampler sampler(params, 3);
  // Token 0 only in the prompt: not penalized.
  EXPECT_EQ(sampler.sample(logits, std::vector<int32_t>{0, 0, 0}, {}).token_id, 0);
  // Generated once: 2.0 - 0.3 - 0.2 = 1.5 < 1.6.
  Sampler generated_once(params, 3);
  EXPECT_EQ(generated_once.sample(logits, std::vector<int32_t>{0}, std::vector<int32_t>{0}).token_id, 1);
}

TEST(Sampler, IncrementalPenaltyCountsMatchRecounting) {
  // Greedy with a strong frequency penalty cycles through tokens; at every step the choice must
  // equal argmax(logits - count * f - present * p) recomputed from the whole history.
  SamplingParams params;
  params.temperature = 0.0f;
  params.frequency_penalty = 0.7f;
  params.presence_penalty = 0.1f;
  params.repetition_penalty = 1.1f;
  const std::vector<float> logits = random_logits(12, 1, 1.0);
  const std::vector<int32_t> prompt = {4, 5, 4};
  Sampler sampler(params, 12);
  std::vector<int32_t> generated;
  for (int step = 0; step < 60; ++step) {
    std::vector<double> expected(logits.begin(), logits.end());
    std::map<int32_t, int> counts;
    std::set<int32_t> seen(prompt.begin(), prompt.end());
    for (int32_t t : generated) {
      ++counts[t];
      seen.insert(t);
    }
    for (int32_t t : seen) {
      const size_t i = static_cast<size_t>(t);
      expected[i] = expected[i] > 0 ? expected[i] / 1.1 : expected[i] * 1.1;
    }
    for (const auto& [t, n] : counts) expected[static_cast<size_t>(t)] -= n * 0.7 + 0.1;
    const int32_t want = static_cast<int32_t>(std::max_element(expected.begin(), expected.end()) - expected.begin());
    const int32_t token = sampler.sample(logits, prompt, generated).token_id;
    ASSERT_EQ(token, want) << "step " << step;
    generated.push_back(token);
  }
  // A rewritten history (same length, different last token) is recounted from scratch.
  std::vector<int32_t> rewritten(generated.size(), 11);
  Sampler fresh(params, 12);
  EXPECT_EQ(sampler.sample(logits, prompt, rewritten).token_id, fresh.sample(logits, prompt, rewritten).token_id);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentTokens) {
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_p = 0.95f;
  params.seed = 2024;
  const std::vector<float> logits = random_logits(100, 2, 1.0);
  Sampler a(params, 100), b(params, 100);
  params.seed = 2025;
  Sampler c(params, 100);
  // The step is the number of generated tokens: each sampler gets its own growing history.
  std::vector<int32_t> tokens_a, tokens_b, tokens_c;
  for (int step = 0; step < 300; ++step) {
    tokens_a.push_back(a.sample(logits, {}, tokens_a).token_id);
    tokens_b.push_back(b.sample(logits, {}, tokens_b).token_id);
    tokens_c.push_back(c.sample(logits, {}, tokens_c).token_id);
  }
  // A draw is a function of (seed, step): asking again at the same step gives the same token.
  const std::vector<int32_t> first_ten(tokens_a.begin(), tokens_a.begin() + 10);
  EXPECT_EQ(a.sample(logits, {}, first_ten).token_id, tokens_a[10]);
  EXPECT_EQ(tokens_a, tokens_b);
  EXPECT_NE(tokens_a, tokens_c);
}

TEST(Sampler, ChainFrequenciesMatchTheFilteredDistribution) {
  // temperature -> top_k -> top_p -> min_p, each on the renormalized output of the previous.
  SamplingParams params;
  params.temperature = 0.7f;
  params.top_k = 12;
  params.top_p = 0.8f;
  params.min_p = 0.1f;
  params.seed = 5;
  const std::vector<float> logits = random_logits(64, 3, 1.0);
  std::vector<float> scaled = logits;
  for (float& l : scaled) l /= 0.7f;
  const std::vector<double> p = softmax(scaled);
  const std::vector<int32_t> order = ids_by_probability(p);
  std::vector<double> q = restrict_to(p, std::set<int32_t>(order.begin(), order.begin() + 12));
  std::set<int32_t> nucleus;
  double mass = 0.0;
  for (int32_t id : ids_by_probability(q)) {
    nucleus.insert(id);
    mass += q[static_cast<size_t>(id)];
    if (mass >= 0.8f) break;
  }
  q = restrict_to(q, nucleus);
  const double q_max = *std::max_element(q.begin(), q.end());
  std::set<int32_t> above_min_p;
  for (int32_t id : nucleus) {
    if (q[static_cast<size_t>(id)] >= 0.1f * q_max) above_min_p.insert(id);
  }
  q = restrict_to(q, above_min_p);
  ASSERT_GE(above_min_p.size(), 3u);

  Sampler sampler(params, 64);
  std::map<int32_t, int64_t> counts;
  const int64_t draws = 30000;
  std::vector<int32_t> generated;  // the step is generated.size()
  for (int64_t i = 0; i < draws; ++i) {
    generated.push_back(sampler.sample(logits, {}, generated).token_id);
    ++counts[generated.back()];
  }
  test::expect_chi_square_fits(counts, q, draws);
}

TEST(Sampler, TemperatureOnlyFrequencies) {
  SamplingParams params;
  params.temperature = 1.5f;
  params.seed = 6;
  const std::vector<float> logits = random_logits(20, 4, 2.0);
  std::vector<float> scaled = logits;
  for (float& l : scaled) l /= 1.5f;
  Sampler sampler(params, 20);
  std::map<int32_t, int64_t> counts;
  std::vector<int32_t> generated;
  for (int i = 0; i < 30000; ++i) {
    generated.push_back(sampler.sample(logits, {}, generated).token_id);
    ++counts[generated.back()];
  }
  test::expect_chi_square_fits(counts, softmax(scaled), 30000);
}

TEST(Sampler, LogprobsAreThoseOfTheRawModelDistribution) {
  SamplingParams params;
  params.temperature = 0.5f;
  params.repetition_penalty = 1.5f;
  params.top_logprobs = 3;
  params.seed = 1;
  const std::vector<float> logits = {0.3f, 2.0f, -1.0f, 1.5f, 0.0f};
  const std::vector<double> p = softmax(logits);
  Sampler sampler(params, 5);
  for (int i = 0; i < 20; ++i) {
    const TokenLogprob result = sampler.sample(logits, std::vector<int32_t>{1}, {});
    EXPECT_NEAR(result.logprob, std::log(p[static_cast<size_t>(result.token_id)]), 1e-5);
  }
  const auto top = sampler.top_logprobs();
  ASSERT_EQ(top.size(), 3u);
  const std::vector<int32_t> order = ids_by_probability(p);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(top[i].token_id, order[i]);
    EXPECT_NEAR(top[i].logprob, std::log(p[static_cast<size_t>(order[i])]), 1e-5);
  }
  SamplingParams only_chosen;
  only_chosen.logprobs = true;
  only_chosen.temperature = 0.0f;
  Sampler chosen(only_chosen, 5);
  const TokenLogprob greedy = chosen.sample(logits, {}, {});
  EXPECT_EQ(greedy.token_id, 1);
  EXPECT_NEAR(greedy.logprob, std::log(p[1]), 1e-5);
  EXPECT_TRUE(chosen.top_logprobs().empty());
  Sampler without(SamplingParams{}, 5);
  EXPECT_TRUE(std::isnan(without.sample(logits, {}, {}).logprob));
  EXPECT_TRUE(without.top_logprobs().empty());
}

TEST(Sampler, MirostatUpdatesMuFromTheTemperedDistribution) {
  for (int version : {1, 2}) {
    SamplingParams params;
    params.temperature = 0.8f;
    params.mirostat = version;
    params.mirostat_tau = 3.0f;
    params.mirostat_eta = 0.2f;
    params.top_k = 1;  // mirostat replaces the truncation filters
    params.seed = 9;
    const std::vector<float> logits = random_logits(300, 5, 2.0);
    std::vector<float> scaled = logits;
    for (float& l : scaled) l /= 0.8f;
    const std::vector<double> p = softmax(scaled);
    Sampler sampler(params, 300);
    EXPECT_FLOAT_EQ(sampler.mirostat_mu(), 6.0f);
    std::set<int32_t> distinct;
    std::vector<int32_t> generated;
    for (int step = 0; step < 30; ++step) {
      const double mu_before = sampler.mirostat_mu();
      const int32_t token = sampler.sample(logits, {}, generated).token_id;
      generated.push_back(token);
      distinct.insert(token);
      const double surprise = -std::log2(p[static_cast<size_t>(token)]);
      EXPECT_NEAR(sampler.mirostat_mu(), mu_before - 0.2 * (surprise - 3.0), 1e-5) << "v" << version;
    }
    EXPECT_GT(distinct.size(), 1u) << "top_k = 1 must not apply under mirostat";
  }
}

TEST(Sampler, BadInputIsReported) {
  SamplingParams params;
  Sampler sampler(params, 4);
  const std::vector<float> good = {0.0f, 1.0f, 2.0f, 3.0f};
  expect_error_mentions([&] { sampler.sample(std::vector<float>{0.0f, 1.0f}, {}, {}); }, "vocab_size 4");
  expect_error_mentions([&] { sampler.sample(std::vector<float>{0.0f, NAN, 1.0f, 1.0f}, {}, {}); }, "token 1");
  expect_error_mentions([&] { sampler.sample(std::vector<float>{0.0f, 1.0f, INFINITY, 1.0f}, {}, {}); }, "token 2");
  expect_error_mentions([&] { sampler.sample(std::vector<float>(4, -INFINITY), {}, {}); }, "-inf");
  SamplingParams penalized;
  penalized.repetition_penalty = 1.3f;
  Sampler with_history(penalized, 4);
  const std::vector<int32_t> bad_prompt = {0, 9};
  expect_error_mentions([&] { with_history.sample(good, bad_prompt, {}); }, "prompt token 9 at position 1");
  expect_error_mentions([&] { with_history.sample(good, {}, std::vector<int32_t>{-1}); }, "generated token -1");
  // A rejected call leaves nothing half-counted: the next good call sees only its own history.
  SamplingParams greedy_penalized = penalized;
  greedy_penalized.temperature = 0.0f;
  Sampler recovering(greedy_penalized, 4);
  EXPECT_THROW(recovering.sample(good, std::vector<int32_t>{3, 3, 9}, {}), Error);
  EXPECT_EQ(recovering.sample(good, std::vector<int32_t>{0}, {}).token_id, 3);
  SamplingParams invalid;
  invalid.top_p = 0.0f;
  expect_error_mentions([&] { Sampler s(invalid, 4); }, "top_p");
  SamplingParams bad_stop;
  bad_stop.stop_token_ids = {4};
  expect_error_mentions([&] { Sampler s(bad_stop, 4); }, "stop_token_ids[0]");
  expect_error_mentions([&] { Sampler s(SamplingParams{}, 0); }, "vocab_size");
}

TEST(Sampler, MaskedTokensAreNeverDrawn) {
  SamplingParams params;
  params.seed = 4;
  Sampler sampler(params, 6);
  const std::vector<float> logits = {-INFINITY, 0.0f, -INFINITY, 0.5f, -INFINITY, 0.2f};
  std::vector<int32_t> generated;
  std::set<int32_t> seen;
  for (int i = 0; i < 2000; ++i) {
    const int32_t token = sampler.sample(logits, {}, generated).token_id;
    ASSERT_TRUE(token == 1 || token == 3 || token == 5) << token;
    generated.push_back(token);
    seen.insert(token);
  }
  EXPECT_EQ(seen.size(), 3u);
}

// Time per call on a Qwen2-sized vocabulary (151936) for the main configurations; the bound is
// loose (a shared 2-core machine) and catches only accidental quadratic work or full re-sorts.
TEST(Sampler, LargeVocabularyCost) {
  const std::vector<float> logits = random_logits(151936, 8, 3.0);
  std::vector<int32_t> prompt(500);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919) % 151936);
  struct Config {
    const char* name;
    SamplingParams params;
  };
  std::vector<Config> configs;
  auto add = [&](const char* name, auto change) {
    SamplingParams params;
    params.seed = 1;
    change(params);
    configs.push_back({name, params});
  };
  add("greedy", [](SamplingParams& p) { p.temperature = 0.0f; });
  add("temperature", [](SamplingParams& p) { p.temperature = 0.8f; });
  add("top_k 40 + top_p 0.95", [](SamplingParams& p) { p.top_k = 40; p.top_p = 0.95f; });
  add("top_p 0.9", [](SamplingParams& p) { p.top_p = 0.9f; });
  add("min_p 0.05", [](SamplingParams& p) { p.min_p = 0.05f; });
  add("typical 0.9", [](SamplingParams& p) { p.typical_p = 0.9f; });
  add("tail-free 0.95", [](SamplingParams& p) { p.tfs_z = 0.95f; });
  add("mirostat 2", [](SamplingParams& p) { p.mirostat = 2; });
  add("penalties + fsd", [](SamplingParams& p) {
    p.repetition_penalty = 1.1f;
    p.frequency_penalty = 0.5f;
    p.fsd = FsdMode::Deterministic;
  });
  for (const Config& config : configs) {
    Sampler sampler(config.params, 151936);
    std::vector<int32_t> generated;
    sampler.sample(logits, prompt, generated);  // warm the thread's buffers
    const int calls = 10;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) generated.push_back(sampler.sample(logits, prompt, generated).token_id);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / calls;
    std::printf("  sampler %-24s %7.2f ms/token (vocab 151936)\n", config.name, ms);
    EXPECT_LT(ms, 100.0) << config.name;
  }
}

}  // namespace
}  // namespace splitflow
