// runtime/batch.h — one forward step's work: a flattened batch of tokens from several sequences,
// each contributing a span (a prompt chunk or one decode token) over its paged KV cache.
// The scheduler builds it; ModelRunner executes it on any backend. Prefill, chunked prefill and
// decode are all this one shape.
#pragma once

#include <cstdint>
#include <vector>

namespace splitflow {

struct SequenceSpan {
  int32_t num_tokens = 0;       // new tokens this step: a prompt chunk, or 1 when decoding
  int32_t start_position = 0;   // tokens already in this sequence's KV cache
  // KV blocks covering positions [0, start_position + num_tokens); block b holds positions
  // [b*block_size, (b+1)*block_size). Written for the new tokens, read for all of them.
  std::vector<int32_t> block_table;
  bool want_logits = true;      // return logits of this span's last token (LogitsMode::Last)
  // encoder_decoder decoders: the sequence's encoder length, whose K/V (ModelRunner::write_encoder_kv)
  // the cross-attention reads at positions [0, encoder_tokens) of the same block table, which
  // must then cover max(start_position + num_tokens, encoder_tokens) positions.
  int32_t encoder_tokens = 0;
};

enum class LogitsMode {
  Last,  // one row per span with want_logits, in span order
  All,   // one row per token (perplexity, reference checks)
};

struct ForwardBatch {
  std::vector<int32_t> token_ids;   // (total_tokens) the spans' tokens, concatenated in span order
  std::vector<SequenceSpan> spans;
  LogitsMode logits_mode = LogitsMode::Last;

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
};

}  // namespace splitflow
