// engine/sequence.h — one request as the scheduler and the block manager see it: its tokens
// (prompt then generated), how many of them have KV in the cache, the KV blocks it holds and
// where it is in its lifecycle. Plain data: the Scheduler moves it between states, the
// BlockManager fills its block_table; it never samples, detokenizes or touches the model.
//
// Token accounting: positions [0, num_computed_tokens) have KV in the cache (in host memory while
// Swapped); the rest of [0, num_tokens()) must still be fed to the model (a prompt chunk, or the
// last sampled token when decoding, or everything again after a preemption by recompute).
//
// Encoder-decoder models: token_ids are the decoder's (its start token, then the generated ones)
// and encoder_token_ids the encoder's input (the request's prompt). The encoder's cross K/V fill
// positions [0, num_encoder_tokens()) of the same blocks (runtime/batch.h), written in the step
// whose span starts the decoder at position 0 (again after a preemption by recompute), so the
// block table covers num_kv_positions().
#pragma once

#include "engine/sampling_params.h"
#include "engine/stop_checker.h"

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace splitflow {

enum class SequenceStatus : int8_t {
  Waiting,   // queued; holds no KV blocks
  Running,   // holds KV blocks; scheduled every step until it finishes or is preempted
  Swapped,   // preempted with its computed KV copied to host blocks; holds no device blocks
  Reserved,  // holds KV blocks that another instance's KV is being written into (Splitwise); not scheduled yet
  Finished,  // done; its blocks are released
};

struct Sequence {
  Sequence(int64_t id, std::vector<int32_t> prompt_ids, SamplingParams params, double arrival_time_s = 0.0);

  int64_t id;
  std::vector<int32_t> token_ids;  // (num_tokens) the prompt, then the generated tokens
  std::vector<int32_t> encoder_token_ids;  // encoder-decoder models: the encoder's input; else empty
  int32_t num_prompt_tokens;
  SequenceStatus status = SequenceStatus::Waiting;
  int32_t num_computed_tokens = 0;  // tokens whose KV is in the cache
  int32_t num_cached_tokens = 0;    // of those, found in the prefix cache at the latest allocation
  std::vector<int32_t> block_table;  // KV blocks; block b holds positions [b*block_size, (b+1)*block_size)
  std::vector<int32_t> host_block_table;  // while Swapped: host block b holds what block b held
  SamplingParams params;
  double arrival_time_s;
  FinishReason finish_reason = FinishReason::None;
  // In a step whose tokens have not come back yet (an engine with several steps in flight, for
  // pipeline parallelism): schedule() neither plans it again nor preempts it until postprocess().
  bool in_flight = false;

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  std::span<const int32_t> prompt_ids() const { return {token_ids.data(), static_cast<size_t>(num_prompt_tokens)}; }
  std::span<const int32_t> output_ids() const {
    return std::span<const int32_t>(token_ids).subspan(static_cast<size_t>(num_prompt_tokens));
  }
  // Tokens still to be fed to the model before the next token can be sampled.
  int32_t num_uncomputed_tokens() const { return num_tokens() - num_computed_tokens; }
  // Only the last sampled token lacks KV: the next step is a one-token decode.
  bool is_decoding() const { return num_uncomputed_tokens() == 1 && num_output_tokens() > 0; }
  bool is_finished() const { return status == SequenceStatus::Finished; }
  int32_t num_encoder_tokens() const { return static_cast<int32_t>(encoder_token_ids.size()); }
  // Positions the block table covers: the decoder's tokens and the encoder's cross K/V.
  int32_t num_kv_positions() const { return std::max(num_tokens(), num_encoder_tokens()); }
  // Positions whose KV is in the cache: the encoder's arrive with the decoder's first span.
  int32_t num_computed_kv_positions() const {
    return num_computed_tokens > 0 ? std::max(num_computed_tokens, num_encoder_tokens()) : 0;
  }
};

}  // namespace splitflow
