// seq2seq/seq2seq_generator.h — one request on an encoder-decoder model: the prompt is the
// encoder's input; the decoder starts from spec.decoder_start_token_id and samples one token per
// step (the same Sampler, StopChecker and StreamDecoder as engine/generator.h's decoder-only path).
// Behind `splitflow generate` for encoder_decoder models.
#pragma once

#include "engine/generator.h"
#include "seq2seq/seq2seq_runner.h"

namespace splitflow {

// Throws splitflow::Error for an empty prompt, one longer than the encoder takes
// (Seq2SeqRunner::max_prompt_tokens), token ids outside the vocabulary or bad params. Ends
// ("length") when the decoder reaches its context. on_logits sees each step's logits row.
// GenerationResult::prompt_tokens counts the encoder's input; output_ids exclude the start token.
GenerationResult generate_seq2seq(Seq2SeqRunner& runner, const Tokenizer* tokenizer,
                                  const std::vector<int32_t>& prompt_ids, const SamplingParams& params,
                                  const std::function<void(std::string_view)>& on_text = {},
                                  const std::function<void(std::span<const float>)>& on_logits = {});

}  // namespace splitflow
