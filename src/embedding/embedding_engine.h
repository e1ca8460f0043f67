// embedding/embedding_engine.h — embeddings through the model runner: each input is a
// prefill-only sequence (no sampling, no decode), batched with the others waiting (first come,
// first served, whole sequences only: bidirectional attention needs a sequence in one forward),
// its K/V written to blocks of the paged cache for the step and released at once, its last
// hidden states pooled on the device (ModelRunner::forward_pooled) and normalized as the spec's
// `embedding` says.
//
// Owns: the waiting queue, the step's KV blocks (a BlockAllocator over the runner's cache), the
// normalization. Must never: sample, keep KV across steps, or run a sequence split over two steps.
// Single-threaded like Engine: server/async_embedder.h runs it on its own thread.
#pragma once

#include "runtime/block_allocator.h"
#include "runtime/model_runner.h"

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

namespace splitflow {

struct EmbeddingEngineConfig {
  int32_t max_batch_tokens = 8192;  // tokens of one forward; at most the runner's
  int32_t max_seqs = 256;           // sequences of one forward; at most the runner's
};

struct EmbeddingResult {
  int64_t request_id = 0;
  std::vector<float> embedding;  // [hidden]: pooled, L2-normalized when the spec says so
  int32_t num_tokens = 0;
};

// KV blocks one step of `config` can fill (each sequence rounds up to whole blocks): the cache a
// runner serving only embeddings needs, since nothing outlives a step.
int32_t embedding_cache_blocks(const EmbeddingEngineConfig& config, int32_t block_size);

class EmbeddingEngine {
 public:
  // Throws unless the runner holds an encoder_only model and the limits fit the runner's.
  EmbeddingEngine(ModelRunner& runner, EmbeddingEngineConfig config = {});

  // The most tokens one input may have: the spec's embedding.max_tokens (else max_position),
  // bounded by one step's tokens and the KV cache.
  int32_t max_input_tokens() const { return max_input_tokens_; }
  int64_t embedding_size() const { return runner_.spec().hidden_size; }
  const ModelSpec& spec() const { return runner_.spec(); }

  // Throws splitflow::Error naming the problem: empty input, a token outside the vocabulary,
  // more than max_input_tokens(). Touches no state: any thread may call it.
  void check_input(std::span<const int32_t> ids) const;
  // Queues one input after check_input(); returns its id (increasing from 0).
  int64_t add_request(std::vector<int32_t> ids);
  // Drops a queued input; false when unknown (already embedded or never queued).
  bool abort(int64_t request_id);

  // One forward over as many waiting inputs as fit, in arrival order; their embeddings, in
  // arrival order. Empty when nothing waits.
  std::vector<EmbeddingResult> step();
  bool has_unfinished() const { return !waiting_.empty(); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }

  // Every input, batched; their embeddings in input order (a convenience for the CLI and tests;
  // the engine must be idle).
  std::vector<std::vector<float>> embed(const std::vector<std::vector<int32_t>>& inputs);

 private:
  struct Waiting {
    int64_t id;
    std::vector<int32_t> ids;
  };

  ModelRunner& runner_;
  EmbeddingEngineConfig config_;
  int32_t max_input_tokens_ = 0;
  BlockAllocator blocks_;
  std::deque<Waiting> waiting_;
  int64_t next_id_ = 0;
};

}  // namespace splitflow
