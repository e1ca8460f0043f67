#include "engine/sampler.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace splitflow {

namespace {

// Vocabulary-sized scratch, shared by every Sampler on this thread (the engine thread).
struct SamplingWorkspace {
  std::vector<float> logits;  // (vocab_size) processed logits
  Candidates candidates;
  RuleScratch rule;
};

SamplingWorkspace& workspace() {
  thread_local SamplingWorkspace instance;
  return instance;
}

const SamplingParams& validated(const SamplingParams& params) {
  params.validate();
  return params;
}

uint64_t seed_of(const SamplingParams& params) {
  if (params.seed) return *params.seed;
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace

Sampler::Sampler(const SamplingParams& params, int32_t vocab_size)
    : params_(validated(params)),
      vocab_size_(vocab_size),
      seed_(seed_of(params)),
      mirostat_mu_(2.0f * params.mirostat_tau),
      anti_lm_(params.fsd_ngram_order, params.fsd_beta) {
  SF_CHECK(vocab_size > 0, "sampler: vocab_size must be > 0, got {}", vocab_size);
  params_.validate_token_ids(vocab_size);
  uses_history_ = params_.repetition_penalty != 1.0f || params_.frequency_penalty != 0.0f ||
                  params_.presence_penalty != 0.0f || params_.fsd != FsdMode::Off;
  top_logprobs_.reserve(static_cast<size_t>(params_.top_logprobs));
}

void Sampler::reset_history() {
  synced_prompt_.clear();
  synced_generated_tokens_ = 0;
  last_synced_generated_token_ = -1;
  seen_counts_.clear();
  generated_counts_.clear();
  anti_lm_.clear();
}

void Sampler::check_in_vocabulary(std::span<const int32_t> tokens, size_t from, const char* what) const {
  for (size_t i = from; i < tokens.size(); ++i) {
    SF_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size_,
             "sampler: {} token {} at position {} is outside the vocabulary [0, {})", what, tokens[i], i,
             vocab_size_);
  }
}

void Sampler::absorb(int32_t token_id, bool generated) {
  if (params_.repetition_penalty != 1.0f) seen_counts_.add(token_id);
  if (generated && (params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f)) {
    generated_counts_.add(token_id);
  }
  if (params_.fsd != FsdMode::Off) anti_lm_.append(token_id);
}

void Sampler::sync_history(std::span<const int32_t> prompt_tokens, std::span<const int32_t> generated_tokens) {
  if (!uses_history_) return;
  const bool extends_previous =
      std::equal(prompt_tokens.begin(), prompt_tokens.end(), synced_prompt_.begin(), synced_prompt_.end()) &&
      generated_tokens.size() >= synced_generated_tokens_ &&
      (synced_generated_tokens_ == 0 ||
       generated_tokens[synced_generated_tokens_ - 1] == last_synced_generated_token_);
  // Check before absorbing anything, so a bad token leaves the state as it was.
  check_in_vocabulary(prompt_tokens, extends_previous ? prompt_tokens.size() : 0, "prompt");
  check_in_vocabulary(generated_tokens, extends_previous ? synced_generated_tokens_ : 0, "generated");
  if (!extends_previous) {
    reset_history();
    synced_prompt_.assign(prompt_tokens.begin(), prompt_tokens.end());
    for (int32_t token_id : prompt_tokens) absorb(token_id, false);
  }
  for (size_t i = synced_generated_tokens_; i < generated_tokens.size(); ++i) absorb(generated_tokens[i], true);
  synced_generated_tokens_ = generated_tokens.size();
  if (!generated_tokens.empty()) last_synced_generated_token_ = generated_tokens.back();
}

TokenLogprob Sampler::sample(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                             std::span<const int32_t> generated_tokens) {
  SF_CHECK(logits.size() == static_cast<size_t>(vocab_size_),
           "sampler: logits row has {} entries, expected vocab_size {}", logits.size(), vocab_size_);
  SamplingWorkspace& ws = workspace();

  // 1. Check the row; the raw maximum serves the log-softmax and the plain greedy path.
  float raw_max = -std::numeric_limits<float>::infinity();
  size_t raw_argmax = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float logit = logits[i];
    SF_CHECK(!std::isnan(logit) && logit != std::numeric_limits<float>::infinity(),
             "sampler: logit of token {} is {} (the model produced NaN/inf)", i, logit);
    if (logit > raw_max) {
      raw_max = logit;
      raw_argmax = i;
    }
  }
  SF_CHECK(raw_max > -std::numeric_limits<float>::infinity(),
           "sampler: every logit is -inf, no token can be sampled");
  const bool want_logprobs = params_.logprobs || params_.top_logprobs > 0;
  double raw_log_normalizer = std::numeric_limits<double>::quiet_NaN();
  if (want_logprobs) {
    double raw_sum = 0.0;
    for (float logit : logits) raw_sum += std::exp(logit - raw_max);
    raw_log_normalizer = static_cast<double>(raw_max) + std::log(raw_sum);
  }
  auto raw_logprob = [&](int32_t id) {
    return static_cast<float>(static_cast<double>(logits[static_cast<size_t>(id)]) - raw_log_normalizer);
  };
  top_logprobs_.clear();
  if (params_.top_logprobs > 0) {
    ws.candidates.assign(logits);
    ws.candidates.sort_top(static_cast<size_t>(params_.top_logprobs));
    for (size_t i = 0; i < static_cast<size_t>(params_.top_logprobs) && i < ws.candidates.size(); ++i) {
      top_logprobs_.push_back({ws.candidates.items[i].id, raw_logprob(ws.candidates.items[i].id)});
    }
  }

  int32_t token_id = -1;
  const uint64_t step = generated_tokens.size();
  if (params_.is_greedy() && !uses_history_) {
    token_id = static_cast<int32_t>(raw_argmax);  // nothing changes the logits: no copy
  } else if (!uses_history_) {
    token_id = sample_processed(logits, step);  // the rule (or mirostat) over the model's row, no copy
  } else {
    // 2. Penalties.
    ws.logits.assign(logits.begin(), logits.end());
    sync_history(prompt_tokens, generated_tokens);
    apply_repetition_penalty(ws.logits, seen_counts_, params_.repetition_penalty);
    apply_frequency_presence_penalties(ws.logits, generated_counts_, params_.frequency_penalty,
                                       params_.presence_penalty);
    // 3. FSD.
    if (params_.fsd != FsdMode::Off) {
      const bool sample_this_step = params_.fsd == FsdMode::Randomized &&
                                    generated_tokens.size() < static_cast<size_t>(params_.fsd_random_steps) &&
                                    step_uniform(seed_, step) < params_.fsd_random_probability;
      if (!sample_this_step) {
        apply_temperature(ws.logits, params_.is_greedy() ? 1.0f : params_.temperature);
        ws.candidates.assign(ws.logits);
        token_id = fsd_select(ws.candidates, params_.fsd_top_k, params_.fsd_alpha, anti_lm_);
      }
    }
    if (token_id < 0) token_id = sample_processed(ws.logits, step);
  }
  const float logprob = want_logprobs ? raw_logprob(token_id) : std::numeric_limits<float>::quiet_NaN();
  return {token_id, logprob};
}

int32_t Sampler::sample_processed(std::span<const float> logits, uint64_t step) {
  SamplingWorkspace& ws = workspace();
  const uint32_t noise_key = sampling_noise_key(seed_, step);
  // 4. Mirostat.
  if (params_.mirostat != 0 && !params_.is_greedy()) {
    const float inv_t = inverse_temperature(params_.temperature);
    ws.candidates.assign(logits);
    for (TokenLogit& candidate : ws.candidates.items) candidate.logit = scaled_logit(candidate.logit, inv_t);
    if (params_.mirostat == 1) {
      return mirostat_v1_sample(ws.candidates, params_.mirostat_tau, params_.mirostat_eta, vocab_size_, mirostat_mu_,
                                noise_key);
    }
    return mirostat_v2_sample(ws.candidates, params_.mirostat_tau, params_.mirostat_eta, mirostat_mu_, noise_key);
  }
  // 5. The sampling rule.
  const SamplingRow row{params_.temperature, params_.top_k, params_.top_p, params_.min_p, seed_, step};
  if (params_.is_greedy() || (params_.tfs_z >= 1.0f && params_.typical_p >= 1.0f)) {
    return sample_by_rule(logits, row, ws.rule);
  }
  Candidates& candidates = ws.candidates;
  rule_top_k(logits, inverse_temperature(row.temperature), row.top_k, candidates.items);
  candidates.sorted_size = 0;
  tail_free_filter(candidates, params_.tfs_z);
  typical_filter(candidates, params_.typical_p);
  rule_top_p(candidates.items, row.top_p);
  rule_min_p(candidates.items, row.min_p);
  return sample_gumbel(candidates, noise_key);
}

}  // namespace splitflow
