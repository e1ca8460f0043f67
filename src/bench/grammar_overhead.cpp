#include "bench/grammar_overhead.h"


#include "core/error.h"
#include "engine/engine.h"
#include "grammar/constraint_cache.h"
#include "grammar/json_schema.h"
#include "runtime/model_runner.h"
#include "sampling/token_mask.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>

namespace splitflow::bench {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// An endless JSON array of values: never complete, so every step of every sequence is masked
// and the states visited are those of real JSON (strings, numbers, nested objects).
std::string endless_json_gbnf() {
  std::string rules = grammar::json_object_gbnf();
  rules.replace(0, rules.find('\n'), R"(root ::= "[" ws json-value ( "," ws json-value )*)");
  return rules;
}

struct DecodeRun {
  double decode_step_s = 0;  // median time of a pure decode step at the full batch (a shared machine has outliers)
  int32_t steps = 0;
  ConstrainedStepStats masks;  // every constrained step's (prefill's too)
};

DecodeRun run_engine(ModelRunner& runner, const Tokenizer* tokenizer, const SchedulerConfig& config, int32_t batch,
                     const GrammarOverheadOptions& options, std::shared_ptr<const TokenConstraintSpec> constraint) {
  Engine engine(runner, tokenizer, config, EngineOptions{});
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = options.output_len;
  params.ignore_eos = true;
  params.constraint = std::move(constraint);
  const int32_t vocab = runner.spec().vocab_size;
  for (int32_t i = 0; i < batch; ++i) {
    std::vector<int32_t> prompt;
    for (int32_t t = 0; t < options.input_len; ++t) prompt.push_back((i * 7919 + t * 104729 + 17) % std::min(vocab, 32000));
    engine.add_request(std::move(prompt), params);
  }
  DecodeRun run;
  std::vector<double> step_seconds;
  while (engine.has_unfinished()) {
    const int32_t running = engine.num_running_sequences();
    const auto start = Clock::now();
    const EngineStep step = engine.step();
    const double seconds = seconds_since(start);
    if (step.num_prefill_tokens == 0 && step.num_decode_tokens == batch && running == batch) {
      step_seconds.push_back(seconds);
      ++run.steps;
    }
  }
  run.masks = engine.constrained_step_stats();
  if (step_seconds.empty()) {
    run.decode_step_s = std::numeric_limits<double>::quiet_NaN();
  } else {
    std::nth_element(step_seconds.begin(), step_seconds.begin() + static_cast<ptrdiff_t>(step_seconds.size() / 2),
                     step_seconds.end());
    run.decode_step_s = step_seconds[step_seconds.size() / 2];
  }
  return run;
}

}  // namespace

nlohmann::json run_grammar_overhead(LoadedModel model, Backend& backend, const GrammarOverheadOptions& options) {
  SF_CHECK(model.tokenizer != nullptr, "bench grammar needs the model's tokenizer (its vocabulary is what masks cover)");
  const int32_t max_batch = *std::max_element(options.batch_sizes.begin(), options.batch_sizes.end());
  const int32_t total_len = options.input_len + options.output_len;
  const int32_t block_size = 16;
  const int32_t blocks = max_batch * ((total_len + block_size - 1) / block_size) + 4;
  const ModelSpec spec = model.spec;
  ModelRunner runner(spec, std::move(model.weights), backend, KvCacheConfig{blocks, block_size, 0},
                     RunnerLimits{std::max(2048, max_batch * options.input_len), max_batch});
  SchedulerConfig config;
  config.max_batch_tokens = std::max(2048, max_batch * options.input_len);
  config.max_seqs = max_batch;
  config.max_model_len = static_cast<int32_t>(std::min<int64_t>(runner.context_limit(), blocks * block_size));
  config.num_blocks = blocks;
  config.block_size = block_size;
  config.num_host_blocks = 0;

  grammar::ConstraintCache cache(*model.tokenizer, spec.vocab_size);
  const auto vocab_start = Clock::now();
  const auto& vocabulary = cache.vocabulary();
  const double vocabulary_s = seconds_since(vocab_start);
  const auto compiled = cache.get_gbnf("bench", endless_json_gbnf());

  // Untimed: the weights' pages and the caches warm before either configuration is measured.
  run_engine(runner, model.tokenizer.get(), config, 1, GrammarOverheadOptions{{1}, 4, options.input_len, 1}, nullptr);

  nlohmann::json rows = nlohmann::json::array();
  for (const int32_t batch : options.batch_sizes) {
    DecodeRun plain, cold, warm;
    grammar::MaskCacheStats mask_stats;
    plain.decode_step_s = cold.decode_step_s = warm.decode_step_s = std::numeric_limits<double>::infinity();
    for (int32_t r = 0; r < options.repeats; ++r) {
      // cold: a grammar compiled anew, its mask cache empty (a schema's first requests); warm:
      // the same requests again, every state's mask cached (a schema the server has seen).
      auto fresh_grammar = std::make_shared<const grammar::CompiledGrammar>(compiled->grammar_ptr(), vocabulary, spec.vocab_size);
      const DecodeRun p = run_engine(runner, model.tokenizer.get(), config, batch, options, nullptr);
      const DecodeRun c = run_engine(runner, model.tokenizer.get(), config, batch, options, fresh_grammar);
      const DecodeRun w = run_engine(runner, model.tokenizer.get(), config, batch, options, fresh_grammar);
      if (p.decode_step_s < plain.decode_step_s) plain = p;
      if (c.decode_step_s < cold.decode_step_s) cold = c;
      if (w.decode_step_s < warm.decode_step_s) warm = w;
      mask_stats = fresh_grammar->cache_stats();
    }
    // The masks' host time a step: on the helper, and waited for by the engine thread after it
    // issued the forward (both overlap the forward: they cost what outlasts it).
    const auto per_step_us = [](double seconds, int64_t steps) { return steps > 0 ? seconds / steps * 1e6 : 0.0; };
    rows.push_back({{"batch", batch},
                    {"mask_helper_us_per_row_warm", per_step_us(warm.masks.compute_s, warm.masks.rows)},
                    {"mask_helper_us_per_step_warm", per_step_us(warm.masks.compute_s, warm.masks.steps)},
                    {"mask_wait_us_per_step_warm", per_step_us(warm.masks.wait_s, warm.masks.steps)},
                    {"mask_helper_us_per_step_cold", per_step_us(cold.masks.compute_s, cold.masks.steps)},
                    {"mask_wait_us_per_step_cold", per_step_us(cold.masks.wait_s, cold.masks.steps)},
                    {"unconstrained_step_ms", plain.decode_step_s * 1e3},
                    {"constrained_cold_step_ms", cold.decode_step_s * 1e3},
                    {"constrained_warm_step_ms", warm.decode_step_s * 1e3},
                    {"unconstrained_ms_per_token", plain.decode_step_s * 1e3 / batch},
                    {"constrained_cold_ms_per_token", cold.decode_step_s * 1e3 / batch},
                    {"constrained_warm_ms_per_token", warm.decode_step_s * 1e3 / batch},
                    {"overhead_cold", cold.decode_step_s / plain.decode_step_s - 1},
                    {"overhead_warm", warm.decode_step_s / plain.decode_step_s - 1},
                    {"mask_cache_misses", mask_stats.misses},  // over the cold and warm runs
                    {"mask_cache_hits", mask_stats.hits},
                    {"decode_steps_timed", std::min({plain.steps, cold.steps, warm.steps})}});
  }

  // The mask alone, over the tokenizer's vocabulary.
  auto fresh = std::make_shared<const grammar::CompiledGrammar>(compiled->grammar_ptr(), vocabulary, spec.vocab_size);
  std::vector<uint32_t> mask(fresh->mask_words());
  nlohmann::json states = nlohmann::json::array();
  for (const char* prefix : {"[", "[\"abc", "[{\"k\": ", "[1", "[{\"a\": [tr"}) {
    grammar::GrammarMatcher matcher(fresh->grammar_ptr());
    SF_CHECK(matcher.advance(std::string_view(prefix)), "bench grammar: the endless JSON grammar refused '{}'", prefix);
    auto start = Clock::now();
    fresh->fill_mask(matcher, false, mask);
    const double miss_s = seconds_since(start);
    constexpr int kHits = 200;
    start = Clock::now();
    for (int i = 0; i < kHits; ++i) fresh->fill_mask(matcher, false, mask);
    const double hit_s = seconds_since(start) / kHits;
    int64_t allowed = 0;
    for (const uint32_t w : mask) allowed += __builtin_popcount(w);
    states.push_back({{"prefix", prefix}, {"miss_ms", miss_s * 1e3}, {"hit_us", hit_s * 1e6}, {"allowed_tokens", allowed}});
  }
  std::vector<float> logits(static_cast<size_t>(spec.vocab_size), 0.5f);
  constexpr int kApplies = 200;
  const auto apply_start = Clock::now();
  for (int i = 0; i < kApplies; ++i) mask_logits_row(logits.data(), mask.data(), static_cast<int64_t>(logits.size()));
  const double apply_us = seconds_since(apply_start) / kApplies * 1e6;

  return {{"model_vocab_size", spec.vocab_size},
          {"tokenizer_vocab_size", vocabulary->vocab_size()},
          {"trie_nodes", vocabulary->trie().num_nodes()},
          {"vocabulary_build_ms", vocabulary_s * 1e3},
          {"output_len", options.output_len},
          {"input_len", options.input_len},
          {"grammar", "endless JSON array (json_object rules)"},
          {"decode", rows},
          {"mask_states", states},
          {"mask_apply_us", apply_us}};
}

}  // namespace splitflow::bench
