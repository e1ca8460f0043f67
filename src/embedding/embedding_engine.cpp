#include "embedding/embedding_engine.h"

#include "core/error.h"
#include "embedding/pooling.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <unordered_map>

namespace splitflow {

int32_t embedding_cache_blocks(const EmbeddingEngineConfig& config, int32_t block_size) {
  SF_CHECK(block_size > 0, "embeddings: block_size must be positive, not {}", block_size);
  return (config.max_batch_tokens + block_size - 1) / block_size + config.max_seqs;
}

EmbeddingEngine::EmbeddingEngine(ModelRunner& runner, EmbeddingEngineConfig config)
    : runner_(runner), config_(config), blocks_(runner.kv_config().num_blocks) {
  const ModelSpec& spec = runner.spec();
  SF_CHECK(spec.network == NetworkType::EncoderOnly,
           "embeddings: '{}' is a generative (decoder_only) model; embeddings need an encoder_only model",
           spec.name);
  SF_CHECK(config.max_batch_tokens > 0 && config.max_batch_tokens <= runner.limits().max_batch_tokens,
           "embeddings: max_batch_tokens {} must be in [1, the runner's {}]", config.max_batch_tokens,
           runner.limits().max_batch_tokens);
  SF_CHECK(config.max_seqs > 0 && config.max_seqs <= runner.limits().max_seqs,
           "embeddings: max_seqs {} must be in [1, the runner's {}]", config.max_seqs, runner.limits().max_seqs);
  const int64_t cache_tokens = int64_t{runner.kv_config().num_blocks} * runner.kv_config().block_size;
  const int64_t model_limit = spec.embedding.max_tokens > 0 ? spec.embedding.max_tokens : spec.max_position;
  max_input_tokens_ = static_cast<int32_t>(
      std::min<int64_t>({model_limit, runner.context_limit(), config.max_batch_tokens, cache_tokens}));
  // Texts are truncated at max_input_tokens(): below the model's own limit that changes vectors.
  if (max_input_tokens_ < model_limit)
    spdlog::warn("embeddings: inputs are limited to {} tokens by one step's tokens or the KV cache, below the "
                 "model's {}: longer texts are truncated there (raise --max-batch-tokens)",
                 max_input_tokens_, model_limit);
}

void EmbeddingEngine::check_input(std::span<const int32_t> ids) const {
  const int32_t vocab_size = runner_.spec().vocab_size;
  SF_CHECK(!ids.empty(), "the input is empty: give some text (or token ids) to embed");
  for (size_t i = 0; i < ids.size(); ++i)
    SF_CHECK(ids[i] >= 0 && ids[i] < vocab_size, "input token {} at index {} is outside the vocabulary [0, {})",
             ids[i], i, vocab_size);
  SF_CHECK(static_cast<int64_t>(ids.size()) <= max_input_tokens_,
           "the input has {} tokens, but this model embeds at most {} tokens", ids.size(), max_input_tokens_);
}

int64_t EmbeddingEngine::add_request(std::vector<int32_t> ids) {
  check_input(ids);
  waiting_.push_back({next_id_, std::move(ids)});
  return next_id_++;
}

bool EmbeddingEngine::abort(int64_t request_id) {
  const auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const Waiting& w) { return w.id == request_id; });
  if (it == waiting_.end()) return false;
  waiting_.erase(it);
  return true;
}

std::vector<EmbeddingResult> EmbeddingEngine::step() {
  std::vector<EmbeddingResult> results;
  if (waiting_.empty()) return results;
  const int32_t block_size = runner_.kv_config().block_size;
  ForwardBatch batch;
  std::vector<int32_t> lengths;
  int64_t tokens = 0;
  // Whole sequences in arrival order while the step's tokens, spans and free blocks allow; the
  // first always fits (check_input bounds it by one step and the cache).
  while (!waiting_.empty() && static_cast<int32_t>(batch.spans.size()) < config_.max_seqs) {
    const std::vector<int32_t>& ids = waiting_.front().ids;
    const int64_t length = static_cast<int64_t>(ids.size());
    const int32_t needed_blocks = static_cast<int32_t>((length + block_size - 1) / block_size);
    if (tokens + length > config_.max_batch_tokens || needed_blocks > blocks_.num_free()) break;
    SequenceSpan span;
    span.num_tokens = static_cast<int32_t>(length);
    span.start_position = 0;
    blocks_.grow_table(span.block_table, length, block_size);
    batch.spans.push_back(std::move(span));
    batch.token_ids.insert(batch.token_ids.end(), ids.begin(), ids.end());
    results.push_back({waiting_.front().id, {}, static_cast<int32_t>(length)});
    tokens += length;
    waiting_.pop_front();
  }
  SF_CHECK(!batch.spans.empty(), "embeddings: the next input ({} tokens) does not fit one step", waiting_.front().ids.size());
  Tensor pooled;
  try {
    pooled = runner_.forward_pooled(batch, runner_.spec().embedding.pooling);
  } catch (...) {
    for (SequenceSpan& span : batch.spans) blocks_.release_table(span.block_table);
    throw;
  }
  // The K/V were only this step's: the blocks go back at once.
  for (SequenceSpan& span : batch.spans) blocks_.release_table(span.block_table);

  const int64_t hidden = runner_.spec().hidden_size;
  for (size_t i = 0; i < results.size(); ++i) {
    const float* row = pooled.as<float>() + static_cast<int64_t>(i) * hidden;
    results[i].embedding.assign(row, row + hidden);
    if (runner_.spec().embedding.normalize) l2_normalize(results[i].embedding);
  }
  return results;
}

std::vector<std::vector<float>> EmbeddingEngine::embed(const std::vector<std::vector<int32_t>>& inputs) {
  SF_CHECK(waiting_.empty(), "embeddings: embed() needs an idle engine ({} inputs are queued)", waiting_.size());
  for (const auto& ids : inputs) check_input(ids);
  std::unordered_map<int64_t, size_t> index;
  for (size_t i = 0; i < inputs.size(); ++i) index.emplace(add_request(inputs[i]), i);
  std::vector<std::vector<float>> out(inputs.size());
  size_t done = 0;
  while (done < inputs.size()) {
    for (EmbeddingResult& result : step()) {
      const auto it = index.find(result.request_id);
      out[it->second] = std::move(result.embedding);
      ++done;
    }
  }
  return out;
}

}  // namespace splitflow
