// engine/generator.h — one request from prompt ids to finished text on a ModelRunner: prefill in
// chunks of the runner's batch budget, then decode one token per step, sampling with the
// request's Sampler, detokenizing as a stream and stopping by StopChecker. This is the
// single-sequence path behind `splitflow generate`; the continuous-batching Engine (issue 4)
// schedules many sequences through the same ModelRunner::forward.
#pragma once

#include "engine/sampler.h"
#include "engine/sampling_params.h"
#include "engine/stop_checker.h"
#include "runtime/model_runner.h"
#include "tokenizer/tokenizer.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace splitflow {

struct GenerationResult {
  std::vector<int32_t> output_ids;  // sampled tokens, the stopping EOS/stop token included
  std::string text;                 // detokenized output, stop string excluded
  FinishReason finish_reason = FinishReason::None;
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0;  // prompt forward passes, up to the first sampled token
  double decode_seconds = 0;   // every later step
};

class Generator {
 public:
  // tokenizer may be null (dummy weights): then no text is produced, only ids.
  Generator(ModelRunner& runner, const Tokenizer* tokenizer);

  // Generates from `prompt_ids`. on_text receives text as soon as it is safe to stream (complete
  // UTF-8, not possibly the start of a stop string). Throws splitflow::Error for an empty prompt,
  // a prompt that does not fit the context, token ids outside the vocabulary, or bad params.
  // Generation also ends ("length") when the sequence reaches the model's context.
  // on_logits, when set, sees each step's logits row (vocab floats) before the token is sampled.
  GenerationResult generate(const std::vector<int32_t>& prompt_ids, const SamplingParams& params,
                            const std::function<void(std::string_view)>& on_text = {},
                            const std::function<void(std::span<const float>)>& on_logits = {});

 private:
  ModelRunner& runner_;
  const Tokenizer* tokenizer_;
};

// The decode loop of the single-request generators (Generator, seq2seq's generate_seq2seq): from
// `logits`, the row of the step that consumed the prompt, samples a token (penalties see
// `penalty_prompt` as the prompt), detokenizes and checks stops, and feeds the token back at
// `position` (then position + 1, ...) through `feed`, which returns the next step's logits row,
// until a stop, max_tokens, or `context` positions ("length"). Fills everything but prompt_tokens;
// prefill_seconds runs from `prefill_start` to the first token.
GenerationResult decode_sequence(const ModelSpec& spec, const Tokenizer* tokenizer, const SamplingParams& params,
                                 std::span<const int32_t> penalty_prompt, Tensor logits, int64_t position,
                                 int64_t context, const std::function<Tensor(int32_t token, int64_t position)>& feed,
                                 std::chrono::steady_clock::time_point prefill_start,
                                 const std::function<void(std::string_view)>& on_text,
                                 const std::function<void(std::span<const float>)>& on_logits);

// The number of KV blocks one sequence of up to `max_tokens` tokens needs.
int32_t blocks_for_tokens(int64_t max_tokens, int32_t block_size);

}  // namespace splitflow
