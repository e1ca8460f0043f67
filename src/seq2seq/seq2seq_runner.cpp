#include "seq2seq/seq2seq_runner.h"

#include "core/error.h"

#include <algorithm>
#include <numeric>

namespace splitflow {
namespace {

// The encoder's cache: one forward of max_batch_tokens tokens in up to max_seqs sequences, each
// sequence rounding up to whole blocks.
KvCacheConfig encoder_cache(const KvCacheConfig& decoder, const RunnerLimits& limits) {
  KvCacheConfig kv;
  kv.block_size = decoder.block_size;
  kv.num_blocks = (limits.max_batch_tokens + kv.block_size - 1) / kv.block_size + limits.max_seqs;
  kv.dtype = decoder.dtype;
  return kv;
}

// A copy (tensors share their storage): copies of ModelWeights share the encoder's.
ModelWeights take_encoder_weights(ModelWeights& weights) {
  SF_CHECK(weights.encoder != nullptr, "encoder_decoder weights: the encoder stack's weights are missing");
  ModelWeights encoder = *weights.encoder;
  weights.encoder.reset();
  return encoder;
}

}  // namespace

Seq2SeqRunner::Seq2SeqRunner(const ModelSpec& spec, ModelWeights weights, Backend& backend, KvCacheConfig kv_config,
                             RunnerLimits limits) {
  SF_CHECK(spec.network == NetworkType::EncoderDecoder, "seq2seq: the model is not an encoder_decoder");
  RunnerLimits encoder_limits = limits;
  encoder_limits.record_decode = false;
  encoder_ = std::make_unique<ModelRunner>(spec.encoder_spec(), take_encoder_weights(weights), backend,
                                           encoder_cache(kv_config, limits), encoder_limits);
  decoder_ = std::make_unique<ModelRunner>(spec, std::move(weights), backend, kv_config, limits);
}

int64_t Seq2SeqRunner::max_prompt_tokens() const {
  return std::min<int64_t>(encoder_->context_limit(), encoder_->limits().max_batch_tokens);
}

void Seq2SeqRunner::encode(const ForwardBatch& prompts) {
  // The encoder's own blocks: consecutive ones per span, each span starting a fresh block.
  ForwardBatch batch;
  batch.token_ids = prompts.token_ids;
  const int32_t block_size = encoder_->kv_config().block_size;
  int32_t next_block = 0;
  for (size_t s = 0; s < prompts.spans.size(); ++s) {
    const SequenceSpan& span = prompts.spans[s];
    SF_CHECK(span.start_position == 0 && span.encoder_tokens == 0,
             "seq2seq encode: span {} must be a whole prompt (start_position 0, no encoder_tokens)", s);
    SequenceSpan own{span.num_tokens, 0, {}, false};
    own.block_table.resize((span.num_tokens + block_size - 1) / block_size);
    std::iota(own.block_table.begin(), own.block_table.end(), next_block);
    next_block += static_cast<int32_t>(own.block_table.size());
    batch.spans.push_back(std::move(own));
  }
  const Tensor states = encoder_->forward_hidden(batch);
  decoder_->write_encoder_kv(prompts, states);
}

}  // namespace splitflow
