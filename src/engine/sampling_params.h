// engine/sampling_params.h — the per-request decoding parameters (what a user asks for) and their
// validation. Every default means "off" (or the OpenAI default), so a default-constructed
// SamplingParams samples from the model's distribution at temperature 1 with no filter. How the
// parameters are applied, and in which order, is documented in engine/sampler.h.
#pragma once

#include "engine/token_constraint.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace splitflow {

// Frustratingly Simple Decoding (Inferflow §6, Yang et al. 2023); see engine/fsd.h.
enum class FsdMode : int8_t {
  Off,
  Deterministic,  // argmax of (1 - alpha) P_LM - alpha P_antiLM over the LM's top-k
  Randomized,     // in the first fsd_random_steps steps, sample instead with fsd_random_probability
};

// "off", "fsd", "randomized" (as the CLI and the server spell them); throws on anything else.
FsdMode fsd_mode_from_name(std::string_view name);
std::string_view fsd_mode_name(FsdMode mode);

struct SamplingParams {
  // Softmax temperature; 0 means greedy (argmax after penalties).
  float temperature = 1.0f;
  int32_t top_k = 0;       // keep the k most probable tokens; 0 = off
  float top_p = 1.0f;      // nucleus: smallest set with mass >= top_p; 1 = off
  float min_p = 0.0f;      // keep p >= min_p * p_max; 0 = off
  float typical_p = 1.0f;  // locally typical sampling mass; 1 = off
  float tfs_z = 1.0f;      // tail-free sampling threshold; 1 = off

  // Mirostat (Basu et al. 2021): 0 = off, 1 = v1 (Zipf-estimated top-k), 2 = v2 (surprise
  // threshold). When on, it replaces top_k/top_p/min_p/typical_p/tfs_z.
  int32_t mirostat = 0;
  float mirostat_tau = 5.0f;  // target surprise, bits per token
  float mirostat_eta = 0.1f;  // learning rate of mu

  // CTRL repetition penalty over the prompt and the generated tokens: a seen token's logit is
  // divided by it when positive, multiplied when negative. 1 = off.
  float repetition_penalty = 1.0f;
  // OpenAI definitions over the generated tokens: logit -= count * frequency_penalty
  // + (count > 0) * presence_penalty. 0 = off.
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;

  FsdMode fsd = FsdMode::Off;
  float fsd_alpha = 0.5f;                // weight of the anti-LM, in [0, 1]
  int32_t fsd_top_k = 6;                 // candidates taken from the LM
  int32_t fsd_ngram_order = 3;           // n of the anti-LM n-gram model, 1..kMaxFsdNgramOrder
  float fsd_beta = 0.9f;                 // backoff weight of the anti-LM, in (0, 1]
  int32_t fsd_random_steps = 10;         // Randomized: steps where sampling may replace FSD
  float fsd_random_probability = 0.5f;   // Randomized: chance of sampling in those steps

  std::optional<uint64_t> seed;  // unset: seeded from std::random_device

  int32_t max_tokens = 256;              // generated tokens, >= 1
  std::vector<std::string> stop;         // stop strings; not included in the output
  std::vector<int32_t> stop_token_ids;   // finish ("stop") when one is generated
  bool ignore_eos = false;               // keep going past the tokenizer's EOS ids
  // Report the chosen token's log-probability (else TokenLogprob::logprob is NaN); costs one
  // pass of exp over the vocabulary. top_logprobs > 0 implies it.
  bool logprobs = false;
  int32_t top_logprobs = 0;              // also report the n most probable tokens, 0..kMaxTopLogprobs
  // Structured outputs: only tokens this constraint allows are drawn (grammar/, engine/token_constraint.h).
  std::shared_ptr<const TokenConstraintSpec> constraint;

  static constexpr int32_t kMaxFsdNgramOrder = 8;
  static constexpr int32_t kMaxTopLogprobs = 20;

  // Throws splitflow::Error naming the parameter, the allowed range and the value given.
  void validate() const;
  // Token ids (stop_token_ids) must lie in [0, vocab_size).
  void validate_token_ids(int32_t vocab_size) const;

  bool is_greedy() const { return temperature == 0.0f; }
};

}  // namespace splitflow
