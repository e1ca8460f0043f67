// engine/scheduler.h — decides, step by step, which tokens of which sequences the next forward
// runs (continuous batching), and applies the sampled tokens afterwards. Pure CPU logic over
// Sequences and a BlockManager: it never runs the model, moves KV, samples or detokenizes. The
// engine loop is: plan = schedule(); run the plan's swap copies; logits =
// runner.forward(plan.batch); sample one token per logits row; postprocess(plan, tokens).
//
// Dynamic SplitFuse (splitfuse = true, DeepSpeed-FastGen): every step takes one decode token from
// each running sequence, then fills the rest of max_batch_tokens with prompt chunks: first the
// running sequences whose prompt is partly computed, then waiting sequences FCFS, admitted while
// max_seqs and the free KV blocks allow (a sequence gets the blocks for all its tokens when
// admitted; the head of the queue blocks the rest, so no request is overtaken).
// Prefill-first (splitfuse = false, for comparison): a step runs either prompts (as many whole
// prompts as fit the budget; a prompt longer than the budget alone, in chunks) or, when no
// prompt is pending, one decode token of every running sequence; decode pauses while prompts run.
//
// Preemption: when a decode token needs a new block and none is free, the newest running
// sequence is preempted, by swapping when it pays and the host swap space allows, else by
// recompute. The oldest sequence is preempted last, so it always progresses as long as one
// sequence of max_model_len tokens fits the cache (checked at construction).
//  - Recompute: the victim releases its blocks and returns to the front of the waiting queue, to
//    be recomputed (prompt and generated tokens; the prefix cache may still hold some) when
//    readmitted.
//  - Swap (num_host_blocks > 0): the victim's computed KV is copied to host blocks, its device
//    blocks are released, and it joins the swapped queue (SequenceStatus::Swapped). The rule: swap
//    when a recompute would run at least swap_min_tokens tokens again (BlockManager::
//    num_recompute_tokens: computed tokens outside blocks other sequences share) and the free
//    host blocks hold its computed KV. Swapping costs the KV bytes twice over the host link;
//    recomputing costs the prefill FLOPs and token budget of later steps. Per token of Llama-3-8B
//    on an H100 that is ~6 us of copying (128 KiB each way at ~47 GB/s) against ~25 us of
//    prefill, so long victims swap; a short one is cheap to recompute either way (its tokens
//    ride along in a SplitFuse step and its blocks may still be in the prefix cache), and the
//    threshold keeps the host space for long ones.
// Readmission, at the start of each step: swapped sequences first, oldest first (the swapped
// queue keeps admission order), each when the free blocks cover all its tokens plus the blocks
// the running decodes take this step (so a swap-in never causes a preemption in the same step).
// Waiting sequences are admitted only while nothing is swapped and in a step that preempted
// nothing (so a recompute victim may wait behind a younger swapped one). New requests never pass
// a preempted one, and every step runs the oldest running sequence, so every sequence finishes
// (no starvation).
// Reservation (Splitwise token instances, splitwise/): reserve() gives a sequence whose KV comes
// from another instance blocks for all its tokens at once (status Reserved: it is in no queue and
// never preempted while the KV is written); admit_reserved() marks every token but the last
// computed, and the sequence joins the running ones at the next schedule() with room (max_seqs),
// before any swapped or waiting one, its last token a one-token span that samples.
// A step's copies run before its forward: swap_in_copies first (a host block freed by a swap-in
// may be reused by a swap-out of the same step), then swap_out_copies (a device block freed by a
// swap-out may be written by the forward).
// Steps in flight (an engine pipelining micro-batches through pipeline stages): a sequence whose
// step has not been postprocessed yet (Sequence::in_flight, set by the engine) is skipped by
// schedule() and never chosen as a victim; the others are planned as usual, so consecutive plans
// hold disjoint sequences. postprocess() clears the mark.
// Encoder-decoder sequences (engine/sequence.h): the decoder's tokens are scheduled as above; a
// span that starts the decoder at position 0 (admission, or readmission after a recompute) has the
// engine run the sequence's encoder whole before the forward, so admission charges the encoder's
// tokens to the step's budget too (StepPlan::num_encoder_tokens). Every span carries the
// sequence's encoder length and a block table covering it.
#pragma once

#include "engine/block_manager.h"
#include "engine/sequence.h"
#include "runtime/batch.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

namespace splitflow {

struct SchedulerConfig {
  int32_t max_batch_tokens = 512;  // tokens of one forward; >= max_seqs so every decode fits
  int32_t max_seqs = 64;           // sequences running at once (spans of one forward)
  int32_t max_model_len = 2048;    // tokens a sequence may reach (the model's context)
  int32_t num_blocks = 0;          // KV cache blocks
  int32_t block_size = 16;         // tokens per block
  int32_t num_host_blocks = 0;     // host swap space in blocks (0: preemption by recompute only)
  int32_t swap_min_tokens = 256;   // swap a victim whose recompute would run at least this many tokens
  bool splitfuse = true;
  std::vector<int32_t> eos_token_ids;  // finish a sequence ("stop") unless its params.ignore_eos
};

struct StepPlan {
  // Per span of batch, in span order: its sequence and whether its logits are sampled (the span
  // reaches the sequence's last token). Sampled spans give one logits row each, in span order.
  std::vector<Sequence*> seqs;
  ForwardBatch batch;
  int32_t num_decode_tokens = 0;
  int32_t num_prefill_tokens = 0;  // prompt chunks and recomputed tokens
  int32_t num_encoder_tokens = 0;  // encoder inputs of the spans starting at position 0 (encoder-decoders)
  std::vector<Sequence*> preempted;    // sent back to waiting (recompute) while planning this step
  std::vector<Sequence*> swapped_out;  // moved to the swapped queue while planning this step
  std::vector<Sequence*> swapped_in;   // readmitted from the swapped queue this step
  std::vector<BlockCopy> swap_in_copies;   // host -> device, run first
  std::vector<BlockCopy> swap_out_copies;  // device -> host, run next, before the forward
  bool empty() const { return seqs.empty(); }
  int32_t num_sampled() const;
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerConfig config);

  // Queues a sequence (owned by the caller, which keeps it alive until it finishes). Throws when
  // its prompt is longer than max_model_len, its encoder input does not fit one step beside a
  // decoder token or the whole cache, or it is not Waiting. at_front: ahead of the queue,
  // for the later choices of an n > 1 request whose first sequence has already been admitted.
  void add(Sequence& seq, bool at_front = false);
  StepPlan schedule();
  // sampled_tokens: one per sampled span of plan, in span order. Marks the spans' tokens
  // computed, enters full blocks into the prefix cache, appends each sampled token and finishes
  // its sequence on EOS or a stop token ("stop"), max_tokens or max_model_len ("length").
  // Returns the sequences finished by this step; their blocks are released.
  std::vector<Sequence*> postprocess(const StepPlan& plan, std::span<const int32_t> sampled_tokens);
  // Reserves blocks for every token of a Waiting sequence that holds none, when the free blocks
  // cover them plus what the running decodes take this step; false (nothing changed) otherwise.
  // Leading blocks may come from the prefix cache (num_computed_tokens says how many tokens: their
  // KV is already there and must not be written).
  bool reserve(Sequence& seq);
  // The reserved sequence's KV is written: all tokens but the last count as computed, and it runs
  // from the next schedule() with room.
  void admit_reserved(Sequence& seq);
  // Ends a sequence for a reason found outside (a stop string the engine's StopChecker matched):
  // removes it from the queues and releases its blocks (device and host).
  void finish(Sequence& seq, FinishReason reason);

  // Micro-batches (an engine with this many steps in flight): each plan decodes at most
  // ceil(running / micro_batches) sequences, so the running ones spread over the steps in flight
  // instead of all landing in the first. 1 (the default): no cap.
  void set_micro_batches(int32_t micro_batches) { micro_batches_ = std::max(micro_batches, 1); }

  // Work for the next schedule(): reserved sequences whose KV is still being written are not.
  bool has_unfinished() const { return !waiting_.empty() || !running_.empty() || !swapped_.empty() || !admitted_.empty(); }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::deque<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& swapped() const { return swapped_; }
  const BlockManager& block_manager() const { return block_manager_; }
  const SchedulerConfig& config() const { return config_; }
  int64_t num_preemptions() const { return num_preemptions_; }  // by recompute and by swap
  int64_t num_swap_outs() const { return num_swap_outs_; }

 private:
  void schedule_splitfuse(StepPlan& plan);
  void schedule_prefill_first(StepPlan& plan);
  // The newest running sequence that is not in flight (Sequence::in_flight).
  Sequence& newest_preemptible();
  // Gives every decoding sequence one token, preempting the newest ones when blocks run out.
  void schedule_decodes(StepPlan& plan);
  // Admits waiting sequences FCFS and schedules their chunks; whole prompts only unless chunking.
  void schedule_waiting(StepPlan& plan, int32_t& budget, bool chunk);
  // Running sequences with prompt tokens left take chunks of the budget, in running order.
  void continue_prompts(StepPlan& plan, int32_t& budget);
  // decode: a running sequence's one new token (a readmitted sequence whose cached prefix leaves
  // one token to recompute is still prefill work).
  void add_span(StepPlan& plan, Sequence& seq, int32_t num_tokens, bool decode);
  // Readmits swapped sequences, oldest first, while the blocks allow (see above).
  void schedule_swap_in(StepPlan& plan);
  // Blocks the running decodes take this step.
  int32_t decode_block_demand() const;
  // Moves admitted reserved sequences to running while max_seqs allows.
  void schedule_admitted();
  // Swaps the sequence out when that pays and the host blocks allow, else sends it to waiting.
  void preempt(Sequence& seq, StepPlan& plan);
  bool reached_stop(const Sequence& seq, int32_t token) const;

  SchedulerConfig config_;
  BlockManager block_manager_;
  std::deque<Sequence*> waiting_;
  std::deque<Sequence*> running_;  // in admission order: the newest is preempted first
  std::deque<Sequence*> swapped_;  // in admission order: the oldest is readmitted first
  std::deque<Sequence*> admitted_;  // reserved, KV written, waiting for room among the running ones
  int32_t micro_batches_ = 1;
  int64_t num_preemptions_ = 0;
  int64_t num_swap_outs_ = 0;
};

}  // namespace splitflow
