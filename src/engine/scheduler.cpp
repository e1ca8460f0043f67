#include "engine/scheduler.h"

#include "core/error.h"

#include <algorithm>

namespace splitflow {

int32_t StepPlan::num_sampled() const {
  return static_cast<int32_t>(
      std::count_if(batch.spans.begin(), batch.spans.end(), [](const SequenceSpan& s) { return s.want_logits; }));
}

Scheduler::Scheduler(SchedulerConfig config)
    : config_(std::move(config)), block_manager_(config_.num_blocks, config_.block_size, config_.num_host_blocks) {
  SF_CHECK(config_.max_seqs > 0, "scheduler: max_seqs must be positive, got {}", config_.max_seqs);
  SF_CHECK(config_.max_batch_tokens >= config_.max_seqs,
           "scheduler: max_batch_tokens ({}) must be at least max_seqs ({}) so every running sequence can decode",
           config_.max_batch_tokens, config_.max_seqs);
  SF_CHECK(config_.max_model_len > 0, "scheduler: max_model_len must be positive, got {}", config_.max_model_len);
  SF_CHECK(config_.swap_min_tokens > 0, "scheduler: swap_min_tokens must be positive, got {}", config_.swap_min_tokens);
  SF_CHECK(block_manager_.blocks_for_tokens(config_.max_model_len) <= config_.num_blocks,
           "scheduler: a sequence of max_model_len = {} tokens needs {} KV blocks of {} tokens but the cache has {}",
           config_.max_model_len, block_manager_.blocks_for_tokens(config_.max_model_len), config_.block_size,
           config_.num_blocks);
}

void Scheduler::add(Sequence& seq, bool at_front) {
  SF_CHECK(seq.status == SequenceStatus::Waiting && seq.block_table.empty() && seq.host_block_table.empty() &&
               seq.num_computed_tokens == 0,
           "scheduler: sequence {} was already scheduled", seq.id);
  SF_CHECK(seq.num_tokens() <= config_.max_model_len,
           "scheduler: sequence {} has {} tokens but the model's context holds {}", seq.id, seq.num_tokens(),
           config_.max_model_len);
  if (seq.num_encoder_tokens() > 0) {
    // The encoder runs whole in the step that starts the decoder, beside its first token.
    SF_CHECK(seq.num_encoder_tokens() < config_.max_batch_tokens,
             "scheduler: sequence {} has {} encoder tokens but a step runs at most {} tokens, one of them the "
             "decoder's", seq.id, seq.num_encoder_tokens(), config_.max_batch_tokens);
    SF_CHECK(block_manager_.blocks_for_tokens(seq.num_kv_positions()) <= config_.num_blocks,
             "scheduler: sequence {} needs {} KV blocks for its {} encoder tokens but the cache has {}", seq.id,
             block_manager_.blocks_for_tokens(seq.num_kv_positions()), seq.num_encoder_tokens(), config_.num_blocks);
  }
  if (at_front) {
    waiting_.push_front(&seq);
  } else {
    waiting_.push_back(&seq);
  }
}

int32_t Scheduler::decode_block_demand() const {
  int32_t blocks = 0;
  for (const Sequence* seq : running_) {
    if (seq->is_decoding()) {
      blocks += std::max(0, block_manager_.blocks_for_tokens(seq->num_kv_positions()) -
                                static_cast<int32_t>(seq->block_table.size()));
    }
  }
  return blocks;
}

bool Scheduler::reserve(Sequence& seq) {
  SF_CHECK(seq.status == SequenceStatus::Waiting && seq.block_table.empty() && seq.host_block_table.empty(),
           "scheduler: sequence {} cannot be reserved: it was already scheduled", seq.id);
  SF_CHECK(seq.encoder_token_ids.empty(), "scheduler: sequence {} is an encoder-decoder's: its KV is never imported",
           seq.id);
  SF_CHECK(seq.num_tokens() <= config_.max_model_len,
           "scheduler: sequence {} has {} tokens but the model's context holds {}", seq.id, seq.num_tokens(),
           config_.max_model_len);
  if (block_manager_.num_free_blocks() < block_manager_.blocks_for_tokens(seq.num_kv_positions()) + decode_block_demand())
    return false;
  if (!block_manager_.can_allocate(seq)) return false;
  block_manager_.allocate(seq);
  seq.status = SequenceStatus::Reserved;
  return true;
}

void Scheduler::admit_reserved(Sequence& seq) {
  SF_CHECK(seq.status == SequenceStatus::Reserved && !seq.block_table.empty(),
           "scheduler: sequence {} holds no reservation", seq.id);
  seq.num_computed_tokens = seq.num_tokens() - 1;
  block_manager_.cache_computed_blocks(seq);
  admitted_.push_back(&seq);
}

void Scheduler::schedule_admitted() {
  while (!admitted_.empty() && static_cast<int32_t>(running_.size()) < config_.max_seqs) {
    Sequence& seq = *admitted_.front();
    admitted_.pop_front();
    seq.status = SequenceStatus::Running;
    running_.push_back(&seq);
  }
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  schedule_admitted();
  schedule_swap_in(plan);
  if (config_.splitfuse) {
    schedule_splitfuse(plan);
  } else {
    schedule_prefill_first(plan);
  }
  return plan;
}

void Scheduler::add_span(StepPlan& plan, Sequence& seq, int32_t num_tokens, bool decode) {
  SequenceSpan span;
  span.num_tokens = num_tokens;
  span.start_position = seq.num_computed_tokens;
  const int32_t end = span.start_position + num_tokens;
  span.encoder_tokens = seq.num_encoder_tokens();
  span.block_table.assign(seq.block_table.begin(),
                          seq.block_table.begin() + block_manager_.blocks_for_tokens(std::max(end, span.encoder_tokens)));
  span.want_logits = end == seq.num_tokens();
  if (span.start_position == 0) plan.num_encoder_tokens += span.encoder_tokens;
  plan.batch.token_ids.insert(plan.batch.token_ids.end(), seq.token_ids.begin() + span.start_position,
                              seq.token_ids.begin() + end);
  plan.batch.spans.push_back(std::move(span));
  plan.seqs.push_back(&seq);
  (decode ? plan.num_decode_tokens : plan.num_prefill_tokens) += num_tokens;
}

void Scheduler::schedule_swap_in(StepPlan& plan) {
  const int32_t reserved = decode_block_demand();
  while (!swapped_.empty() && static_cast<int32_t>(running_.size()) < config_.max_seqs) {
    Sequence& seq = *swapped_.front();
    if (!block_manager_.can_swap_in(seq, reserved)) break;
    const std::vector<BlockCopy> copies = block_manager_.swap_in(seq);
    plan.swap_in_copies.insert(plan.swap_in_copies.end(), copies.begin(), copies.end());
    swapped_.pop_front();
    running_.push_back(&seq);
    seq.status = SequenceStatus::Running;
    plan.swapped_in.push_back(&seq);
  }
}

void Scheduler::preempt(Sequence& seq, StepPlan& plan) {
  running_.erase(std::find(running_.begin(), running_.end(), &seq));
  ++num_preemptions_;
  if (config_.num_host_blocks > 0 && block_manager_.num_recompute_tokens(seq) >= config_.swap_min_tokens &&
      block_manager_.can_swap_out(seq)) {
    const std::vector<BlockCopy> copies = block_manager_.swap_out(seq);
    plan.swap_out_copies.insert(plan.swap_out_copies.end(), copies.begin(), copies.end());
    seq.status = SequenceStatus::Swapped;
    // Victims go newest first, and nothing is admitted while one is swapped: the front stays the oldest.
    swapped_.push_front(&seq);
    plan.swapped_out.push_back(&seq);
    ++num_swap_outs_;
    return;
  }
  block_manager_.free(seq);
  seq.status = SequenceStatus::Waiting;
  waiting_.push_front(&seq);
  plan.preempted.push_back(&seq);
}

Sequence& Scheduler::newest_preemptible() {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it)
    if (!(*it)->in_flight) return **it;
  SF_CHECK(false, "scheduler: every running sequence is in flight: nothing to preempt");
  return *running_.back();
}

void Scheduler::schedule_decodes(StepPlan& plan) {
  // Oldest first; victims come from the back (the newest not in flight), so those already
  // scheduled are never preempted: the sequence being scheduled is itself a candidate, behind them.
  const auto cap = static_cast<int32_t>((running_.size() + micro_batches_ - 1) / micro_batches_);
  for (size_t i = 0; i < running_.size() && plan.num_decode_tokens < cap; ++i) {
    Sequence& seq = *running_[i];
    if (!seq.is_decoding() || seq.in_flight) continue;
    bool preempted_self = false;
    while (!block_manager_.can_append_slot(seq)) {
      Sequence& victim = newest_preemptible();
      preempt(victim, plan);
      if (&victim == &seq) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;
    block_manager_.append_slot(seq);
    add_span(plan, seq, 1, /*decode=*/true);
  }
}

void Scheduler::schedule_waiting(StepPlan& plan, int32_t& budget, bool chunk) {
  // A step that preempted is short of blocks: readmitting now would only thrash. A swapped
  // sequence goes before every waiting one.
  if (!plan.preempted.empty() || !plan.swapped_out.empty() || !swapped_.empty()) return;
  while (!waiting_.empty() && budget > 0 && static_cast<int32_t>(running_.size()) < config_.max_seqs) {
    Sequence& seq = *waiting_.front();
    // An encoder-decoder's encoder runs whole in this step, before the decoder's first chunk.
    const int32_t encoder_tokens = seq.num_encoder_tokens();
    if (encoder_tokens >= budget) break;
    // Without chunking a prompt runs whole, unless it alone exceeds the budget.
    if (!chunk && encoder_tokens + seq.num_tokens() > budget && !plan.seqs.empty()) break;
    if (!block_manager_.can_allocate(seq)) break;
    block_manager_.allocate(seq);
    waiting_.pop_front();
    running_.push_back(&seq);
    seq.status = SequenceStatus::Running;
    const int32_t n = std::min(seq.num_uncomputed_tokens(), budget - encoder_tokens);
    add_span(plan, seq, n, /*decode=*/false);
    budget -= encoder_tokens + n;
  }
}

void Scheduler::continue_prompts(StepPlan& plan, int32_t& budget) {
  for (Sequence* seq : running_) {
    if (budget == 0) break;
    if (seq->is_decoding() || seq->in_flight) continue;
    const int32_t n = std::min(seq->num_uncomputed_tokens(), budget);
    add_span(plan, *seq, n, /*decode=*/false);
    budget -= n;
  }
}

void Scheduler::schedule_splitfuse(StepPlan& plan) {
  schedule_decodes(plan);
  int32_t budget = config_.max_batch_tokens - plan.num_decode_tokens;
  continue_prompts(plan, budget);
  schedule_waiting(plan, budget, /*chunk=*/true);
}

void Scheduler::schedule_prefill_first(StepPlan& plan) {
  int32_t budget = config_.max_batch_tokens;
  // Only a prompt longer than the budget is left partly computed; it continues first.
  continue_prompts(plan, budget);
  schedule_waiting(plan, budget, /*chunk=*/false);
  if (plan.empty()) schedule_decodes(plan);
}

bool Scheduler::reached_stop(const Sequence& seq, int32_t token) const {
  const auto& stops = seq.params.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), token) != stops.end()) return true;
  if (seq.params.ignore_eos) return false;
  return std::find(config_.eos_token_ids.begin(), config_.eos_token_ids.end(), token) != config_.eos_token_ids.end();
}

std::vector<Sequence*> Scheduler::postprocess(const StepPlan& plan, std::span<const int32_t> sampled_tokens) {
  SF_CHECK(static_cast<int32_t>(sampled_tokens.size()) == plan.num_sampled(),
           "scheduler: postprocess got {} sampled tokens for a step with {} sampled spans", sampled_tokens.size(),
           plan.num_sampled());
  std::vector<Sequence*> finished;
  size_t next_token = 0;
  for (size_t s = 0; s < plan.seqs.size(); ++s) {
    Sequence& seq = *plan.seqs[s];
    const SequenceSpan& span = plan.batch.spans[s];
    SF_CHECK(seq.status == SequenceStatus::Running && seq.num_computed_tokens == span.start_position,
             "scheduler: sequence {} changed between schedule() and postprocess()", seq.id);
    seq.in_flight = false;
    seq.num_computed_tokens += span.num_tokens;
    block_manager_.cache_computed_blocks(seq);
    if (!span.want_logits) continue;
    const int32_t token = sampled_tokens[next_token++];
    seq.token_ids.push_back(token);
    FinishReason reason = FinishReason::None;
    if (reached_stop(seq, token)) {
      reason = FinishReason::Stop;
    } else if (seq.num_output_tokens() >= seq.params.max_tokens || seq.num_tokens() > config_.max_model_len) {
      // Past max_model_len the token cannot be fed back: its position is outside the context.
      reason = FinishReason::Length;
    }
    if (reason != FinishReason::None) {
      finish(seq, reason);
      finished.push_back(&seq);
    }
  }
  return finished;
}

void Scheduler::finish(Sequence& seq, FinishReason reason) {
  SF_CHECK(!seq.is_finished(), "scheduler: sequence {} is already finished", seq.id);
  if (const auto it = std::find(running_.begin(), running_.end(), &seq); it != running_.end()) running_.erase(it);
  if (const auto it = std::find(waiting_.begin(), waiting_.end(), &seq); it != waiting_.end()) waiting_.erase(it);
  if (const auto it = std::find(swapped_.begin(), swapped_.end(), &seq); it != swapped_.end()) swapped_.erase(it);
  if (const auto it = std::find(admitted_.begin(), admitted_.end(), &seq); it != admitted_.end()) admitted_.erase(it);
  block_manager_.free(seq);
  seq.status = SequenceStatus::Finished;
  seq.finish_reason = reason;
}

}  // namespace splitflow
