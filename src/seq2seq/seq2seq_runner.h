// seq2seq/seq2seq_runner.h — encoder-decoder models (spec network encoder_decoder: T5) on one
// backend, as two ModelRunners: the encoder stack is an encoder_only runner on
// spec.encoder_spec() (with a small KV cache of its own, for the self-attention of one forward),
// the decoder stack the runner whose paged cache holds each sequence's decoder K/V and, in its
// cross layers, the encoder's K/V (runtime/model_runner.h). encode() runs prompts through the
// encoder and writes their cross K/V through the sequences' block tables; decoder steps are the
// decoder runner's ordinary forwards, each span giving its sequence's encoder_tokens.
//
// Owns the two runners. Must never decide which sequences run or which blocks they own (callers
// bring block tables), and holds no architecture knowledge (everything comes from the spec).
#pragma once

#include "runtime/model_runner.h"

#include <memory>

namespace splitflow {

class Seq2SeqRunner {
 public:
  // weights.encoder holds the encoder stack's weights. kv_config and limits are the decoder's; the
  // encoder gets the same limits (one forward of up to max_batch_tokens prompt tokens) and a cache
  // just large enough for them.
  Seq2SeqRunner(const ModelSpec& spec, ModelWeights weights, Backend& backend, KvCacheConfig kv_config,
                RunnerLimits limits = {});

  // Runs each span's tokens (whole prompts: start_position 0, encoder_tokens 0) through the encoder
  // and writes the decoder's cross K/V for them at positions [0, num_tokens) of the span's block
  // table in the decoder's cache. Later decoder spans of these sequences set encoder_tokens to the
  // span's num_tokens and keep the blocks.
  void encode(const ForwardBatch& prompts);

  ModelRunner& encoder() { return *encoder_; }
  ModelRunner& decoder() { return *decoder_; }
  const ModelSpec& spec() const { return decoder_->spec(); }
  // Prompt tokens one sequence may have: the encoder's context and one forward's budget.
  int64_t max_prompt_tokens() const;

 private:
  std::unique_ptr<ModelRunner> encoder_, decoder_;
};

}  // namespace splitflow
