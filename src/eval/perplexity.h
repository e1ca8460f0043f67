// eval/perplexity.h — perplexity of a model over a token stream, by llama.cpp's method
// (tools/perplexity: `llama-perplexity -f FILE -c N`), so the numbers compare with it:
//  - the text is tokenized once (with BOS when the tokenizer adds one) and cut into
//    non-overlapping chunks of n_ctx tokens (a partial last chunk is dropped);
//  - each chunk is evaluated from an empty context; with add_bos its first token is replaced by BOS;
//  - only the second half is scored: the predictions of tokens n_ctx/2 + 1 .. n_ctx - 1 from the
//    logits at positions n_ctx/2 .. n_ctx - 2, each -log softmax(logits)[next token] in fp64;
//  - PPL = exp(mean NLL), its standard error PPL * sqrt((mean(NLL^2) - mean(NLL)^2) / (count - 1)).
//
// Owns the chunking and the scoring. Must never run a model itself: a ChunkLogits callable gives a
// chunk's logits (the CLI wires a ModelRunner to it), so the method is testable on its own.
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace splitflow {

struct PerplexityOptions {
  int32_t n_ctx = 512;          // tokens per chunk
  int32_t max_chunks = -1;      // -1: every whole chunk of the text
  int32_t bos_token_id = -1;    // >= 0: replaces each chunk's first token (llama.cpp's add_bos)
};

struct PerplexityChunk {
  int32_t index = 0;
  double chunk_ppl = 0;     // this chunk's scored tokens alone
  double running_ppl = 0;   // every chunk so far
};

struct PerplexityResult {
  int32_t chunks = 0;
  int64_t scored_tokens = 0;
  int64_t evaluated_tokens = 0;  // chunks x n_ctx
  double mean_nll = 0;
  double ppl = 0;
  double ppl_stderr = 0;
  std::vector<PerplexityChunk> per_chunk;
};

// The logits of one chunk: [n_ctx, vocab] f32, row j predicting the token after position j.
using ChunkLogits = std::function<Tensor(std::span<const int32_t> chunk)>;

// Throws naming the numbers when the text has fewer than 2 * n_ctx tokens (llama.cpp's minimum),
// n_ctx < 4, or the logits come back in the wrong shape. on_chunk (may be empty) sees each chunk.
PerplexityResult perplexity(std::span<const int32_t> tokens, const PerplexityOptions& options,
                            const ChunkLogits& chunk_logits,
                            const std::function<void(const PerplexityChunk&)>& on_chunk = {});

}  // namespace splitflow
