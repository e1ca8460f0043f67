// engine/sampler.h — one sequence's sampler: turns a logits row into the next token under the
// request's SamplingParams, and owns the per-sequence state that decoding needs across steps
// (seeded RNG, mirostat's mu, penalty counts and FSD's n-gram table, all updated incrementally
// as tokens are appended). It never touches the model, the tokenizer or the text; stop handling
// is engine/stop_checker.h.
//
// One step, in this fixed order (each step is a function of engine/logits_processors.h,
// engine/fsd.h or sampling/host_rule.h that tests call alone):
//   1. raw log-probabilities log_softmax(logits), when asked for (logprobs, top_logprobs): those
//      of the model's own distribution, before any processing (OpenAI's and vLLM's default).
//   2. penalties: repetition (CTRL, over prompt + generated), then frequency and presence
//      (OpenAI, over generated).
//   3. FSD, when on (and for randomized FSD, unless this step samples): softmax at the request's
//      temperature (1 when the temperature is 0) -> fsd_select. Done.
//   4. mirostat 1 or 2, when on (temperature > 0): temperature, its own truncation, a Gumbel draw.
//      Done.
//   5. the sampling rule (sampling/sampling_rule.h) over the penalized row: temperature 0 argmax;
//      else temperature -> top-k -> [tail-free -> typical, host-only, when on] -> top-p -> min-p
//      -> the Gumbel-max draw keyed by (seed, step = generated_tokens.size(), token).
// Every random choice is a pure function of (seed, step): the Sampler holds no RNG state, so a
// sequence's tokens do not depend on what else it asks for (logprobs) or on which path samples
// it: without penalties, FSD, mirostat, tail-free or typical, step 5 is exactly what the
// backends' sample() computes on the same row. The seed is params.seed, or one drawn from
// std::random_device at construction. Scratch buffers (vocabulary-sized) are per thread, not per
// sequence, so many live Samplers stay small and no step allocates once the thread's buffers have
// grown.
#pragma once

#include "engine/fsd.h"
#include "engine/logits_processors.h"
#include "engine/sampling_params.h"

#include <cstdint>
#include <span>
#include <vector>

namespace splitflow {

struct TokenLogprob {
  int32_t token_id;
  float logprob;  // natural log of the model's probability (step 1); NaN unless asked for
};

class Sampler {
 public:
  // Validates params (throws splitflow::Error naming the bad parameter).
  Sampler(const SamplingParams& params, int32_t vocab_size);

  // logits: (vocab_size) the model's output for the next position. prompt_tokens and
  // generated_tokens: the sequence so far; each call should extend the previous call's sequence
  // (append-only, as the engine does). A different prompt, or a generated part that is shorter
  // or whose last previously seen token changed, rebuilds the penalty counts and the n-gram
  // table from scratch; rewriting earlier generated tokens in place is not detected.
  TokenLogprob sample(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                      std::span<const int32_t> generated_tokens);

  // The params.top_logprobs most probable tokens of the last sample() call, most probable first.
  std::span<const TokenLogprob> top_logprobs() const { return top_logprobs_; }
  float mirostat_mu() const { return mirostat_mu_; }
  uint64_t seed() const { return seed_; }
  const SamplingParams& params() const { return params_; }
  int32_t vocab_size() const { return vocab_size_; }

 private:
  void sync_history(std::span<const int32_t> prompt_tokens, std::span<const int32_t> generated_tokens);
  void reset_history();
  void check_in_vocabulary(std::span<const int32_t> tokens, size_t from, const char* what) const;
  void absorb(int32_t token_id, bool generated);
  int32_t sample_processed(std::span<const float> logits, uint64_t step);

  SamplingParams params_;
  int32_t vocab_size_;
  uint64_t seed_;
  float mirostat_mu_;

  // What the history state below has absorbed so far. The prompt is kept to detect a different
  // one; the generated part is assumed append-only and checked through its last absorbed token.
  bool uses_history_ = false;  // penalties or FSD are on
  std::vector<int32_t> synced_prompt_;
  size_t synced_generated_tokens_ = 0;
  int32_t last_synced_generated_token_ = -1;
  TokenCounts seen_counts_;       // prompt + generated (repetition penalty)
  TokenCounts generated_counts_;  // generated (frequency / presence penalties)
  NgramAntiLm anti_lm_;           // prompt + generated (FSD)

  std::vector<TokenLogprob> top_logprobs_;
};

}  // namespace splitflow
