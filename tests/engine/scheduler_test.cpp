#include "engine/scheduler.h"

#include "backend/backend.h"
#include "core/error.h"
#include "engine/generator.h"
#include "engine/model_loader.h"
#include "engine/sampler.h"
#include "runtime/model_runner.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>

namespace splitflow {
namespace {

constexpr int32_t kEos = 2;

// The stand-in model: the token sampled after a sequence's first n tokens depends only on the
// sequence and n, so a recomputed sequence continues exactly as it would have.
int32_t model_token(int64_t seq_id, int32_t num_tokens) {
  return 1000 + static_cast<int32_t>((seq_id * 7919 + int64_t{num_tokens} * 104729) % 5000);
}

std::vector<int32_t> iota_tokens(int32_t count, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(count));
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::unique_ptr<Sequence> make_seq(int64_t id, std::vector<int32_t> prompt, int32_t max_tokens) {
  SamplingParams params;
  params.max_tokens = max_tokens;
  return std::make_unique<Sequence>(id, std::move(prompt), params);
}

SchedulerConfig small_config(int32_t max_batch_tokens, int32_t num_blocks, bool splitfuse = true) {
  SchedulerConfig config;
  config.max_batch_tokens = max_batch_tokens;
  config.max_seqs = 4;
  config.max_model_len = 64;
  config.num_blocks = num_blocks;
  config.block_size = 4;
  config.splitfuse = splitfuse;
  config.eos_token_ids = {kEos};
  return config;
}

// The model's tokens for a plan's sampled spans, in span order.
std::vector<int32_t> sample(const StepPlan& plan) {
  std::vector<int32_t> tokens;
  for (size_t s = 0; s < plan.seqs.size(); ++s) {
    if (plan.batch.spans[s].want_logits) tokens.push_back(model_token(plan.seqs[s]->id, plan.seqs[s]->num_tokens()));
  }
  return tokens;
}

// What the sequence outputs when nothing but max_tokens and max_model_len stop it.
std::vector<int32_t> expected_output(const Sequence& seq, int32_t max_model_len) {
  std::vector<int32_t> out;
  int32_t n = seq.num_prompt_tokens;
  while (static_cast<int32_t>(out.size()) < seq.params.max_tokens && n <= max_model_len) {
    out.push_back(model_token(seq.id, n));
    ++n;
  }
  return out;
}

// Checks one step against the block tables, with a simulated KV cache holding the token id each
// slot was written with: every span writes its new tokens, then reads its whole prefix, which
// must be exactly the sequence's tokens (a clobbered shared block or a bad table shows here).
// The host swap area is simulated alike: the plan's copies run first, in the engine's order
// (swap-ins, swap-outs, then the forward), and a swapped sequence's host blocks must hold exactly
// its computed tokens.
class KvSimulator {
 public:
  explicit KvSimulator(const SchedulerConfig& config)
      : config_(config),
        kv_(static_cast<size_t>(config.num_blocks), std::vector<int32_t>(config.block_size, -1)),
        host_(static_cast<size_t>(config.num_host_blocks), std::vector<int32_t>(config.block_size, -1)) {}

  void check_step(const StepPlan& plan, const Scheduler& scheduler) {
    for (const BlockCopy& copy : plan.swap_in_copies) kv_[copy.device_block] = host_[copy.host_block];
    for (const BlockCopy& copy : plan.swap_out_copies) host_[copy.host_block] = kv_[copy.device_block];
    const ForwardBatch& batch = plan.batch;
    ASSERT_LE(batch.num_tokens(), config_.max_batch_tokens);
    ASSERT_LE(static_cast<int32_t>(batch.spans.size()), config_.max_seqs);
    ASSERT_EQ(plan.seqs.size(), batch.spans.size());
    check_ref_counts(scheduler);

    std::set<int32_t> written_blocks;
    int32_t offset = 0;
    for (size_t s = 0; s < batch.spans.size(); ++s) {
      const SequenceSpan& span = batch.spans[s];
      const Sequence& seq = *plan.seqs[s];
      ASSERT_EQ(seq.status, SequenceStatus::Running);
      ASSERT_GT(span.num_tokens, 0);
      ASSERT_EQ(span.start_position, seq.num_computed_tokens);
      const int32_t end = span.start_position + span.num_tokens;
      ASSERT_LE(end, seq.num_tokens());
      ASSERT_EQ(span.want_logits, end == seq.num_tokens());
      ASSERT_EQ(static_cast<int32_t>(span.block_table.size()), (end + config_.block_size - 1) / config_.block_size);
      for (int32_t p = span.start_position; p < end; ++p) {
        ASSERT_EQ(batch.token_ids[static_cast<size_t>(offset + p - span.start_position)], seq.token_ids[p]);
        const int32_t block = span.block_table[static_cast<size_t>(p / config_.block_size)];
        // A written block belongs to this sequence alone.
        ASSERT_EQ(holders_[block], 1) << "step writes block " << block << " shared by " << holders_[block];
        written_blocks.insert(block);
        kv_[block][p % config_.block_size] = seq.token_ids[p];
      }
      offset += span.num_tokens;
    }
    for (size_t s = 0; s < batch.spans.size(); ++s) {
      const SequenceSpan& span = batch.spans[s];
      const Sequence& seq = *plan.seqs[s];
      for (int32_t p = 0; p < span.start_position + span.num_tokens; ++p) {
        const int32_t block = span.block_table[static_cast<size_t>(p / config_.block_size)];
        ASSERT_EQ(kv_[block][p % config_.block_size], seq.token_ids[p])
            << "sequence " << seq.id << " position " << p << " block " << block;
      }
    }
  }

  // Reference counts recomputed from the running sequences' tables.
  void check_ref_counts(const Scheduler& scheduler) {
    holders_.assign(static_cast<size_t>(config_.num_blocks), 0);
    for (const Sequence* seq : scheduler.running()) {
      for (int32_t b : seq->block_table) ++holders_[b];
    }
    for (const Sequence* seq : scheduler.waiting()) {
      ASSERT_TRUE(seq->block_table.empty());
      ASSERT_TRUE(seq->host_block_table.empty());
    }
    int32_t free_blocks = 0;
    for (int32_t b = 0; b < config_.num_blocks; ++b) {
      ASSERT_EQ(scheduler.block_manager().ref_count(b), holders_[b]) << "block " << b;
      free_blocks += holders_[b] == 0;
    }
    ASSERT_EQ(scheduler.block_manager().num_free_blocks(), free_blocks);

    std::vector<int32_t> host_holders(static_cast<size_t>(config_.num_host_blocks), 0);
    for (const Sequence* seq : scheduler.running()) ASSERT_TRUE(seq->host_block_table.empty());
    for (const Sequence* seq : scheduler.swapped()) {
      ASSERT_EQ(seq->status, SequenceStatus::Swapped);
      ASSERT_TRUE(seq->block_table.empty());
      ASSERT_EQ(static_cast<int32_t>(seq->host_block_table.size()),
                (seq->num_computed_tokens + config_.block_size - 1) / config_.block_size);
      for (int32_t h : seq->host_block_table) ++host_holders[h];
      for (int32_t p = 0; p < seq->num_computed_tokens; ++p) {
        const int32_t h = seq->host_block_table[static_cast<size_t>(p / config_.block_size)];
        ASSERT_EQ(host_[h][p % config_.block_size], seq->token_ids[p])
            << "swapped sequence " << seq->id << " position " << p << " host block " << h;
      }
    }
    int32_t free_host_blocks = 0;
    for (int32_t h : host_holders) {
      ASSERT_LE(h, 1);
      free_host_blocks += h == 0;
    }
    ASSERT_EQ(scheduler.block_manager().num_free_host_blocks(), free_host_blocks);
  }

 private:
  SchedulerConfig config_;
  std::vector<std::vector<int32_t>> kv_;    // [num_blocks][block_size] token id written there
  std::vector<std::vector<int32_t>> host_;  // [num_host_blocks][block_size] likewise
  std::vector<int32_t> holders_;
};

std::vector<int32_t> span_lengths(const StepPlan& plan) {
  std::vector<int32_t> out;
  for (const SequenceSpan& span : plan.batch.spans) out.push_back(span.num_tokens);
  return out;
}

std::vector<int32_t> span_starts(const StepPlan& plan) {
  std::vector<int32_t> out;
  for (const SequenceSpan& span : plan.batch.spans) out.push_back(span.start_position);
  return out;
}

std::vector<int64_t> span_ids(const StepPlan& plan) {
  std::vector<int64_t> out;
  for (const Sequence* seq : plan.seqs) out.push_back(seq->id);
  return out;
}

StepPlan step(Scheduler& scheduler, KvSimulator& kv) {
  StepPlan plan = scheduler.schedule();
  kv.check_step(plan, scheduler);
  scheduler.postprocess(plan, sample(plan));
  return plan;
}

TEST(Scheduler, ChunksALongPromptAcrossStepsWithinTheBudget) {
  const SchedulerConfig config = small_config(8, 32);
  Scheduler scheduler(config);
  KvSimulator kv(config);
  auto a = make_seq(1, iota_tokens(20, 10), 3);
  scheduler.add(*a);

  StepPlan p1 = step(scheduler, kv);
  EXPECT_EQ(span_lengths(p1), std::vector<int32_t>{8});
  EXPECT_EQ(span_starts(p1), std::vector<int32_t>{0});
  EXPECT_EQ(p1.batch.token_ids, iota_tokens(8, 10));
  EXPECT_FALSE(p1.batch.spans[0].want_logits);
  EXPECT_EQ(p1.batch.spans[0].block_table, (std::vector<int32_t>{a->block_table[0], a->block_table[1]}));
  StepPlan p2 = step(scheduler, kv);
  EXPECT_EQ(span_starts(p2), std::vector<int32_t>{8});
  EXPECT_EQ(p2.batch.token_ids, iota_tokens(8, 18));
  StepPlan p3 = step(scheduler, kv);
  EXPECT_EQ(span_lengths(p3), std::vector<int32_t>{4});
  EXPECT_EQ(span_starts(p3), std::vector<int32_t>{16});
  EXPECT_TRUE(p3.batch.spans[0].want_logits);
  EXPECT_EQ(p3.batch.spans[0].block_table.size(), 5u);
  EXPECT_EQ(a->num_output_tokens(), 1);
  StepPlan p4 = step(scheduler, kv);
  EXPECT_EQ(span_starts(p4), std::vector<int32_t>{20});
  EXPECT_EQ(p4.batch.token_ids, std::vector<int32_t>{model_token(1, 20)});
  EXPECT_EQ(p4.num_decode_tokens, 1);
}

TEST(Scheduler, DecodesFirstThenFillsTheBudgetExactlyWithPromptChunksFcfs) {
  const SchedulerConfig config = small_config(8, 32);
  Scheduler scheduler(config);
  KvSimulator kv(config);
  auto a = make_seq(1, iota_tokens(3, 10), 10);
  auto b = make_seq(2, iota_tokens(20, 50), 10);
  auto c = make_seq(3, iota_tokens(5, 90), 10);
  scheduler.add(*a);
  scheduler.add(*b);
  scheduler.add(*c);

  StepPlan p1 = step(scheduler, kv);  // a whole, b's first 5 tokens; c waits for budget
  EXPECT_EQ(span_ids(p1), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(span_lengths(p1), (std::vector<int32_t>{3, 5}));
  EXPECT_EQ(p1.batch.num_tokens(), 8);
  EXPECT_EQ(scheduler.waiting().front(), c.get());

  StepPlan p2 = step(scheduler, kv);  // a decodes, b continues
  EXPECT_EQ(span_ids(p2), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(span_lengths(p2), (std::vector<int32_t>{1, 7}));
  EXPECT_EQ(span_starts(p2), (std::vector<int32_t>{3, 5}));
  EXPECT_EQ(p2.num_decode_tokens, 1);
  EXPECT_EQ(p2.num_prefill_tokens, 7);

  StepPlan p3 = step(scheduler, kv);
  EXPECT_EQ(span_lengths(p3), (std::vector<int32_t>{1, 7}));
  StepPlan p4 = step(scheduler, kv);  // a decodes, b's last prompt token, c admitted whole: 1 + 1 + 5
  EXPECT_EQ(span_ids(p4), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(span_lengths(p4), (std::vector<int32_t>{1, 1, 5}));
  EXPECT_EQ(span_starts(p4), (std::vector<int32_t>{5, 19, 0}));
  StepPlan p5 = step(scheduler, kv);  // three decodes
  EXPECT_EQ(span_lengths(p5), (std::vector<int32_t>{1, 1, 1}));
  EXPECT_EQ(p5.num_decode_tokens, 3);
}

TEST(Scheduler, AdmissionWaitsForFreeBlocksInFcfsOrder) {
  const SchedulerConfig config = small_config(64, 16);
  Scheduler scheduler(config);
  KvSimulator kv(config);
  auto a = make_seq(1, iota_tokens(40, 0), 1);   // 10 blocks
  auto b = make_seq(2, iota_tokens(40, 100), 1);  // 10 blocks: waits for a
  auto c = make_seq(3, iota_tokens(4, 200), 1);   // 1 block: would fit, but b is first
  scheduler.add(*a);
  scheduler.add(*b);
  scheduler.add(*c);
  StepPlan p1 = scheduler.schedule();
  kv.check_step(p1, scheduler);
  EXPECT_EQ(span_ids(p1), std::vector<int64_t>{1});
  EXPECT_EQ(scheduler.waiting().size(), 2u);
  const auto finished = scheduler.postprocess(p1, sample(p1));  // max_tokens 1: a finishes
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(a->finish_reason, FinishReason::Length);
  EXPECT_TRUE(a->block_table.empty());
  StepPlan p2 = step(scheduler, kv);
  EXPECT_EQ(span_ids(p2), (std::vector<int64_t>{2, 3}));
}

TEST(Scheduler, MaxSeqsLimitsRunningSequences) {
  SchedulerConfig config = small_config(64, 32);
  config.max_seqs = 2;
  Scheduler scheduler(config);
  KvSimulator kv(config);
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int i = 0; i < 3; ++i) {
    seqs.push_back(make_seq(i, iota_tokens(2, 10 * i), 5));
    scheduler.add(*seqs.back());
  }
  StepPlan p1 = step(scheduler, kv);
  EXPECT_EQ(span_ids(p1), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(scheduler.running().size(), 2u);
  EXPECT_EQ(scheduler.waiting().size(), 1u);
}

TEST(Scheduler, SharedPromptPrefixIsComputedOnce) {
  const SchedulerConfig config = small_config(64, 32);
  Scheduler scheduler(config);
  KvSimulator kv(config);
  std::vector<int32_t> system = iota_tokens(12, 300);  // 3 full blocks
  std::vector<int32_t> a_prompt = system, b_prompt = system;
  a_prompt.insert(a_prompt.end(), {1, 2, 3});
  b_prompt.insert(b_prompt.end(), {4, 5});
  auto a = make_seq(1, a_prompt, 4);
  auto b = make_seq(2, b_prompt, 4);
  scheduler.add(*a);
  step(scheduler, kv);
  scheduler.add(*b);
  StepPlan p2 = step(scheduler, kv);
  EXPECT_EQ(span_ids(p2), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(span_starts(p2), (std::vector<int32_t>{15, 12}));  // b starts after the cached prefix
  EXPECT_EQ(span_lengths(p2), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(b->num_cached_tokens, 12);
  EXPECT_EQ(scheduler.block_manager().stats().hit_blocks, 3);
}

TEST(Scheduler, PreemptsTheNewestByRecomputeAndResumesIt) {
  // 6 blocks of 4: a and b each hold 2 blocks after their 8-token prompts, then grow.
  SchedulerConfig config = small_config(16, 6);
  config.max_model_len = 24;
  Scheduler scheduler(config);
  KvSimulator kv(config);
  auto a = make_seq(1, iota_tokens(8, 0), 12);
  auto b = make_seq(2, iota_tokens(8, 100), 12);
  scheduler.add(*a);
  scheduler.add(*b);
  bool saw_preemption = false;
  int steps = 0;
  while (scheduler.has_unfinished()) {
    ASSERT_LT(++steps, 200);
    StepPlan plan = scheduler.schedule();
    kv.check_step(plan, scheduler);
    for (const Sequence* victim : plan.preempted) {
      saw_preemption = true;
      EXPECT_EQ(victim, b.get());  // the newest goes; the oldest keeps progressing
      EXPECT_EQ(victim->status, SequenceStatus::Waiting);
      EXPECT_TRUE(victim->block_table.empty());
      EXPECT_EQ(victim->num_computed_tokens, 0);
      EXPECT_EQ(scheduler.waiting().front(), victim);
    }
    if (!a->is_finished()) {
      EXPECT_NE(std::find(plan.seqs.begin(), plan.seqs.end(), a.get()), plan.seqs.end());
    }
    scheduler.postprocess(plan, sample(plan));
  }
  EXPECT_TRUE(saw_preemption);
  EXPECT_GE(scheduler.num_preemptions(), 1);
  // The recomputed sequence's output is what an unpreempted run gives.
  EXPECT_EQ(std::vector<int32_t>(a->output_ids().begin(), a->output_ids().end()),
            expected_output(*a, config.max_model_len));
  EXPECT_EQ(std::vector<int32_t>(b->output_ids().begin(), b->output_ids().end()),
            expected_output(*b, config.max_model_len));
  EXPECT_EQ(scheduler.block_manager().num_free_blocks(), config.num_blocks);
}

// Two 8-token prompts over 6 blocks of 4 (config of PreemptsTheNewestByRecompute...): at 13
// tokens each, a's fourth block is the last one, so b (12 computed tokens) is preempted.
SchedulerConfig swap_config(int32_t num_host_blocks, int32_t swap_min_tokens) {
  SchedulerConfig config = small_config(16, 6);
  config.max_model_len = 24;
  config.num_host_blocks = num_host_blocks;
  config.swap_min_tokens = swap_min_tokens;
  return config;
}

TEST(Scheduler, SwapsOutTheNewestAndSwapsItBackInWhenBlocksFree) {
  const SchedulerConfig config = swap_config(8, 8);
  Scheduler scheduler(config);
  KvSimulator kv(config);
  auto a = make_seq(1, iota_tokens(8, 0), 12);
  auto b = make_seq(2, iota_tokens(8, 100), 12);
  scheduler.add(*a);
  scheduler.add(*b);
  int swap_outs = 0, swap_ins = 0, steps = 0;
  std::vector<int32_t> host_table;
  while (scheduler.has_unfinished()) {
    ASSERT_LT(++steps, 200);
    const std::vector<int32_t> b_table = b->block_table;
    StepPlan plan = scheduler.schedule();
    kv.check_step(plan, scheduler);
    EXPECT_TRUE(plan.preempted.empty()) << "b was meant to be swapped, not recomputed";
    if (!plan.swapped_out.empty()) {
      ++swap_outs;
      ASSERT_EQ(plan.swapped_out, std::vector<Sequence*>{b.get()});  // the newest goes
      EXPECT_EQ(b->status, SequenceStatus::Swapped);
      EXPECT_TRUE(b->block_table.empty());
      EXPECT_EQ(b->num_computed_tokens, 12);  // kept: its KV is on the host
      ASSERT_EQ(b->host_block_table.size(), 3u);
      ASSERT_EQ(plan.swap_out_copies.size(), 3u);
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(plan.swap_out_copies[i].device_block, b_table[i]);
        EXPECT_EQ(plan.swap_out_copies[i].host_block, b->host_block_table[i]);
      }
      EXPECT_EQ(scheduler.swapped().front(), b.get());
      EXPECT_EQ(std::find(plan.seqs.begin(), plan.seqs.end(), b.get()), plan.seqs.end());
      host_table = b->host_block_table;
    }
    if (!plan.swapped_in.empty()) {
      ++swap_ins;
      ASSERT_EQ(plan.swapped_in, std::vector<Sequence*>{b.get()});
      EXPECT_TRUE(a->is_finished()) << "b needs 4 blocks: it returns once a is done";
      EXPECT_EQ(b->status, SequenceStatus::Running);
      ASSERT_EQ(plan.swap_in_copies.size(), 3u);
      ASSERT_EQ(b->block_table.size(), 4u);  // 13 tokens
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(plan.swap_in_copies[i].host_block, host_table[i]);
        EXPECT_EQ(plan.swap_in_copies[i].device_block, b->block_table[i]);
      }
      // It decodes in the same step, from where it stopped.
      const auto it = std::find(plan.seqs.begin(), plan.seqs.end(), b.get());
      ASSERT_NE(it, plan.seqs.end());
      EXPECT_EQ(plan.batch.spans[static_cast<size_t>(it - plan.seqs.begin())].start_position, 12);
    }
    if (!a->is_finished()) {
      EXPECT_NE(std::find(plan.seqs.begin(), plan.seqs.end(), a.get()), plan.seqs.end());
    }
    scheduler.postprocess(plan, sample(plan));
  }
  EXPECT_EQ(swap_outs, 1);
  EXPECT_EQ(swap_ins, 1);
  EXPECT_EQ(scheduler.num_swap_outs(), 1);
  EXPECT_EQ(scheduler.num_preemptions(), 1);
  EXPECT_EQ(std::vector<int32_t>(a->output_ids().begin(), a->output_ids().end()),
            expected_output(*a, config.max_model_len));
  EXPECT_EQ(std::vector<int32_t>(b->output_ids().begin(), b->output_ids().end()),
            expected_output(*b, config.max_model_len));
  EXPECT_EQ(scheduler.block_manager().num_free_blocks(), config.num_blocks);
  EXPECT_EQ(scheduler.block_manager().num_free_host_blocks(), config.num_host_blocks);
}

// Runs the two-sequence scenario to its first preemption; returns whether it swapped.
bool first_preemption_swaps(const SchedulerConfig& config) {
  Scheduler scheduler(config);
  KvSimulator kv(config);
  auto a = make_seq(1, iota_tokens(8, 0), 12);
  auto b = make_seq(2, iota_tokens(8, 100), 12);
  scheduler.add(*a);
  scheduler.add(*b);
  for (int steps = 0; steps < 100; ++steps) {
    StepPlan plan = scheduler.schedule();
    kv.check_step(plan, scheduler);
    if (!plan.preempted.empty() || !plan.swapped_out.empty()) {
      const bool swapped = !plan.swapped_out.empty();
      EXPECT_EQ(swapped ? plan.swapped_out : plan.preempted, std::vector<Sequence*>{b.get()});
      EXPECT_EQ(b->status, swapped ? SequenceStatus::Swapped : SequenceStatus::Waiting);
      EXPECT_EQ(b->num_computed_tokens, swapped ? 12 : 0);  // a swapped sequence keeps its KV
      return swapped;
    }
    scheduler.postprocess(plan, sample(plan));
  }
  ADD_FAILURE() << "no preemption";
  return false;
}

TEST(Scheduler, SwapsOnlyWhenRecomputeWouldRunSwapMinTokensAndTheHostHasRoom) {
  EXPECT_TRUE(first_preemption_swaps(swap_config(8, 12)));    // 12 computed tokens >= 12
  EXPECT_FALSE(first_preemption_swaps(swap_config(8, 13)));   // < 13: recompute is cheap enough
  EXPECT_TRUE(first_preemption_swaps(swap_config(3, 1)));     // 3 host blocks hold its 12 tokens
  EXPECT_FALSE(first_preemption_swaps(swap_config(2, 1)));    // 2 do not: recompute
  EXPECT_FALSE(first_preemption_swaps(swap_config(0, 1)));    // no swap space: recompute always
}

TEST(Scheduler, SharedPrefixBlocksAreCopiedAndDoNotCountAsRecomputeWork) {
  // a and b share an 8-token prefix (2 blocks, cached by a's first step) then one own token each;
  // 7 blocks of 4. At 17 tokens, b (16 computed, 8 of them in the shared blocks) is preempted.
  for (const int32_t swap_min_tokens : {8, 9}) {
    SCOPED_TRACE(swap_min_tokens);
    SchedulerConfig config = small_config(16, 7);
    config.max_model_len = 24;
    config.num_host_blocks = 8;
    config.swap_min_tokens = swap_min_tokens;
    Scheduler scheduler(config);
    KvSimulator kv(config);
    std::vector<int32_t> a_prompt = iota_tokens(8, 0), b_prompt = iota_tokens(8, 0);
    a_prompt.push_back(500);
    b_prompt.push_back(600);
    auto a = make_seq(1, a_prompt, 12);
    auto b = make_seq(2, b_prompt, 12);
    scheduler.add(*a);
    step(scheduler, kv);
    scheduler.add(*b);
    bool preempted = false;
    for (int steps = 0; scheduler.has_unfinished(); ++steps) {
      ASSERT_LT(steps, 200);
      const std::vector<int32_t> b_table = b->block_table;
      StepPlan plan = scheduler.schedule();
      ASSERT_NO_FATAL_FAILURE(kv.check_step(plan, scheduler));
      if (!plan.preempted.empty() || !plan.swapped_out.empty()) {
        ASSERT_FALSE(preempted) << "one preemption expected";
        preempted = true;
        EXPECT_EQ(b->num_cached_tokens, 8);
        ASSERT_EQ(b_table.size(), 4u);  // 16 tokens; the 17th needs a fifth block
        EXPECT_EQ(b_table[0], a->block_table[0]);
        EXPECT_EQ(b_table[1], a->block_table[1]);
        if (swap_min_tokens == 8) {  // 16 - 8 shared = 8 tokens to recompute: swap
          ASSERT_EQ(plan.swapped_out, std::vector<Sequence*>{b.get()});
          ASSERT_EQ(plan.swap_out_copies.size(), 4u);  // the shared blocks are copied too
          EXPECT_EQ(plan.swap_out_copies[0].device_block, b_table[0]);
          EXPECT_EQ(plan.swap_out_copies[1].device_block, b_table[1]);
          EXPECT_EQ(scheduler.block_manager().ref_count(b_table[0]), 1);  // a keeps them
          EXPECT_EQ(scheduler.block_manager().ref_count(b_table[1]), 1);
        } else {
          EXPECT_EQ(plan.preempted, std::vector<Sequence*>{b.get()});
          EXPECT_TRUE(plan.swap_out_copies.empty());
        }
      }
      if (!plan.swapped_in.empty()) {
        for (int32_t block : b->block_table) EXPECT_EQ(scheduler.block_manager().ref_count(block), 1);
      }
      scheduler.postprocess(plan, sample(plan));
    }
    EXPECT_TRUE(preempted);
    EXPECT_EQ(std::vector<int32_t>(b->output_ids().begin(), b->output_ids().end()),
              expected_output(*b, config.max_model_len));
    EXPECT_EQ(scheduler.block_manager().num_free_blocks(), config.num_blocks);
    EXPECT_EQ(scheduler.block_manager().num_free_host_blocks(), config.num_host_blocks);
  }
}

TEST(Scheduler, SwappedSequencesAreReadmittedBeforeWaitingOnes) {
  for (const bool splitfuse : {true, false}) {
    SCOPED_TRACE(splitfuse ? "splitfuse" : "prefill-first");
    SchedulerConfig config = swap_config(8, 8);
    config.splitfuse = splitfuse;
    Scheduler scheduler(config);
    KvSimulator kv(config);
    auto a = make_seq(1, iota_tokens(8, 0), 12);
    auto b = make_seq(2, iota_tokens(8, 100), 12);
    auto c = make_seq(3, iota_tokens(2, 200), 2);  // one block: fits beside a, but b is first
    scheduler.add(*a);
    scheduler.add(*b);
    int b_back_step = -1, c_first_step = -1;
    bool c_fit_while_b_swapped = false;
    for (int steps = 0; scheduler.has_unfinished(); ++steps) {
      ASSERT_LT(steps, 200);
      StepPlan plan = scheduler.schedule();
      ASSERT_NO_FATAL_FAILURE(kv.check_step(plan, scheduler));
      if (!plan.swapped_out.empty()) scheduler.add(*c);
      if (!plan.swapped_in.empty()) b_back_step = steps;
      if (c_first_step < 0 && std::find(plan.seqs.begin(), plan.seqs.end(), c.get()) != plan.seqs.end()) {
        c_first_step = steps;
      }
      if (!scheduler.swapped().empty() && c->status == SequenceStatus::Waiting &&
          scheduler.block_manager().can_allocate(*c)) {
        c_fit_while_b_swapped = true;
      }
      scheduler.postprocess(plan, sample(plan));
    }
    ASSERT_GE(b_back_step, 0) << "b was never swapped out and back";
    ASSERT_GE(c_first_step, b_back_step) << "c overtook the swapped b";
    EXPECT_TRUE(c_fit_while_b_swapped) << "the scenario was meant to leave room for c, not for b";
    EXPECT_EQ(std::vector<int32_t>(c->output_ids().begin(), c->output_ids().end()),
              expected_output(*c, config.max_model_len));
    EXPECT_EQ(scheduler.block_manager().num_free_blocks(), config.num_blocks);
    EXPECT_EQ(scheduler.block_manager().num_free_host_blocks(), config.num_host_blocks);
  }
}

TEST(Scheduler, PrefillFirstPausesDecodesWhilePromptsRun) {
  const SchedulerConfig config = small_config(8, 32, /*splitfuse=*/false);
  Scheduler scheduler(config);
  KvSimulator kv(config);
  auto a = make_seq(1, iota_tokens(3, 10), 10);
  auto b = make_seq(2, iota_tokens(6, 50), 10);
  auto c = make_seq(3, iota_tokens(12, 90), 10);
  scheduler.add(*a);
  scheduler.add(*b);
  StepPlan p1 = step(scheduler, kv);  // a whole; b (6) does not fit whole in the 5 left
  EXPECT_EQ(span_ids(p1), std::vector<int64_t>{1});
  StepPlan p2 = step(scheduler, kv);  // b's prompt; a's decode waits
  EXPECT_EQ(span_ids(p2), std::vector<int64_t>{2});
  EXPECT_EQ(p2.num_decode_tokens, 0);
  StepPlan p3 = step(scheduler, kv);  // no prompt left: decodes
  EXPECT_EQ(span_ids(p3), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(p3.num_prefill_tokens, 0);
  scheduler.add(*c);  // longer than the budget: alone, in chunks, decodes paused throughout
  StepPlan p4 = step(scheduler, kv);
  EXPECT_EQ(span_ids(p4), std::vector<int64_t>{3});
  EXPECT_EQ(span_lengths(p4), std::vector<int32_t>{8});
  StepPlan p5 = step(scheduler, kv);
  EXPECT_EQ(span_ids(p5), std::vector<int64_t>{3});
  EXPECT_EQ(span_starts(p5), std::vector<int32_t>{8});
  EXPECT_TRUE(p5.batch.spans[0].want_logits);
  StepPlan p6 = step(scheduler, kv);
  EXPECT_EQ(span_ids(p6), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(p6.num_decode_tokens, 3);
}

TEST(Scheduler, FinishesOnEosStopTokensMaxTokensAndContext) {
  SchedulerConfig config = small_config(64, 32);
  config.max_seqs = 8;
  config.max_model_len = 10;
  Scheduler scheduler(config);
  auto eos = make_seq(1, {5, 6}, 10);
  auto eos_ignored = make_seq(2, {5, 6}, 10);
  eos_ignored->params.ignore_eos = true;
  auto stop_token = make_seq(3, {5, 6}, 10);
  stop_token->params.stop_token_ids = {77};
  auto length = make_seq(4, {5, 6}, 1);
  auto context = make_seq(5, iota_tokens(10, 0), 10);  // fills the context: one token, then "length"
  for (Sequence* seq : {eos.get(), eos_ignored.get(), stop_token.get(), length.get(), context.get()}) {
    scheduler.add(*seq);
  }
  StepPlan plan = scheduler.schedule();
  ASSERT_EQ(plan.num_sampled(), 5);
  const auto finished = scheduler.postprocess(plan, std::vector<int32_t>{kEos, kEos, 77, 9, 9});
  EXPECT_EQ(finished.size(), 4u);
  EXPECT_EQ(eos->finish_reason, FinishReason::Stop);
  EXPECT_FALSE(eos_ignored->is_finished());
  EXPECT_EQ(stop_token->finish_reason, FinishReason::Stop);
  EXPECT_EQ(length->finish_reason, FinishReason::Length);
  EXPECT_EQ(context->finish_reason, FinishReason::Length);
  EXPECT_EQ(context->num_output_tokens(), 1);
  EXPECT_EQ(std::vector<int32_t>(eos->output_ids().begin(), eos->output_ids().end()), std::vector<int32_t>{kEos});
  EXPECT_EQ(scheduler.running().size(), 1u);
  EXPECT_EQ(scheduler.block_manager().num_free_blocks(), 31);
}

TEST(Scheduler, FinishFromOutsideReleasesBlocks) {
  const SchedulerConfig config = small_config(64, 32);
  Scheduler scheduler(config);
  auto a = make_seq(1, iota_tokens(9, 0), 10);
  auto b = make_seq(2, iota_tokens(9, 50), 10);
  scheduler.add(*a);
  StepPlan plan = scheduler.schedule();
  scheduler.postprocess(plan, sample(plan));
  scheduler.add(*b);
  scheduler.finish(*a, FinishReason::Stop);  // a stop string the engine matched
  scheduler.finish(*b, FinishReason::Stop);  // still waiting
  EXPECT_FALSE(scheduler.has_unfinished());
  EXPECT_EQ(a->finish_reason, FinishReason::Stop);
  EXPECT_EQ(scheduler.block_manager().num_free_blocks(), 32);
  EXPECT_THROW(scheduler.finish(*a, FinishReason::Stop), Error);
}

TEST(Scheduler, RejectsBadConfigAndRequests) {
  SchedulerConfig config = small_config(8, 32);
  config.max_seqs = 9;
  EXPECT_THROW(Scheduler{config}, Error);  // budget below max_seqs
  config = small_config(8, 15);
  EXPECT_THROW(Scheduler{config}, Error);  // 64 tokens need 16 blocks
  config = small_config(8, 16);
  config.max_seqs = 0;
  EXPECT_THROW(Scheduler{config}, Error);
  config = small_config(8, 16);
  config.max_model_len = 0;
  EXPECT_THROW(Scheduler{config}, Error);
  config = small_config(8, 16);
  config.swap_min_tokens = 0;
  EXPECT_THROW(Scheduler{config}, Error);
  config = small_config(8, 16);
  config.num_host_blocks = -1;
  EXPECT_THROW(Scheduler{config}, Error);

  Scheduler scheduler(small_config(8, 32));
  auto too_long = make_seq(1, iota_tokens(65, 0), 1);
  EXPECT_THROW(scheduler.add(*too_long), Error);
  auto seq = make_seq(2, iota_tokens(4, 0), 1);
  scheduler.add(*seq);
  StepPlan plan = scheduler.schedule();
  EXPECT_THROW(scheduler.add(*seq), Error);  // already running
  EXPECT_THROW(scheduler.postprocess(plan, std::vector<int32_t>{}), Error);  // one token expected
  EXPECT_THROW(Sequence(3, {}, SamplingParams{}), Error);
  // A sequence ended between schedule() and postprocess() cannot take the step's token.
  scheduler.finish(*seq, FinishReason::Stop);
  EXPECT_THROW(scheduler.postprocess(plan, sample(plan)), Error);
}

// Random arrivals, prompt lengths and output lengths (sharing prompt prefixes) on a cache small
// enough to force preemptions; every step is checked against the block tables and the simulated
// KV cache (and host swap area), every output must be the model's, and no block (device or host)
// may stay referenced at the end. No starvation: every request finishes; the oldest running
// sequence is in every SplitFuse step; without swapping, even the oldest unfinished request is
// (with it, a recomputed victim may wait behind a younger swapped one: swapped sequences are
// readmitted first).
void run_random_simulation(bool splitfuse, uint32_t seed, int32_t num_host_blocks = 0, int32_t swap_min_tokens = 256) {
  SchedulerConfig config;
  config.max_batch_tokens = 32;
  config.max_seqs = 8;
  config.max_model_len = 96;
  config.num_blocks = 40;
  config.block_size = 4;
  config.splitfuse = splitfuse;
  config.eos_token_ids = {kEos};
  config.num_host_blocks = num_host_blocks;
  config.swap_min_tokens = swap_min_tokens;
  Scheduler scheduler(config);
  KvSimulator kv(config);
  std::mt19937 rng(seed);
  const std::vector<int32_t> system_prompt = iota_tokens(10, 4000);

  constexpr int kRequests = 120;
  std::vector<std::unique_ptr<Sequence>> seqs;
  int64_t steps = 0;
  int32_t preemptions_seen = 0, swap_outs_seen = 0, swap_ins_seen = 0;
  while (static_cast<int>(seqs.size()) < kRequests || scheduler.has_unfinished()) {
    ASSERT_LT(++steps, 20000) << "no progress";
    if (static_cast<int>(seqs.size()) < kRequests && rng() % 3 == 0) {
      std::vector<int32_t> prompt = rng() % 2 ? system_prompt : std::vector<int32_t>{};
      const int32_t extra = 1 + static_cast<int32_t>(rng() % 50);
      for (int32_t i = 0; i < extra; ++i) prompt.push_back(10 + static_cast<int32_t>(rng() % 900));
      const int32_t max_tokens = 1 + static_cast<int32_t>(rng() % 40);
      seqs.push_back(make_seq(static_cast<int64_t>(seqs.size()), prompt, max_tokens));
      scheduler.add(*seqs.back());
    }
    StepPlan plan = scheduler.schedule();
    ASSERT_NO_FATAL_FAILURE(kv.check_step(plan, scheduler));
    preemptions_seen += static_cast<int32_t>(plan.preempted.size());
    swap_outs_seen += static_cast<int32_t>(plan.swapped_out.size());
    swap_ins_seen += static_cast<int32_t>(plan.swapped_in.size());
    if (splitfuse) {
      const auto oldest = std::find_if(seqs.begin(), seqs.end(), [](const auto& s) { return !s->is_finished(); });
      if (oldest != seqs.end() && num_host_blocks == 0) {
        ASSERT_NE(std::find(plan.seqs.begin(), plan.seqs.end(), oldest->get()), plan.seqs.end())
            << "step " << steps << ": the oldest request " << (*oldest)->id << " made no progress";
      }
      if (!scheduler.running().empty()) {
        ASSERT_NE(std::find(plan.seqs.begin(), plan.seqs.end(), scheduler.running().front()), plan.seqs.end())
            << "step " << steps << ": the oldest running sequence made no progress";
      }
    } else {
      ASSERT_TRUE(plan.num_decode_tokens == 0 || plan.num_prefill_tokens == 0) << "step " << steps;
    }
    scheduler.postprocess(plan, sample(plan));
  }
  EXPECT_GT(preemptions_seen, 0) << "the cache was meant to be too small to avoid preemption";
  if (num_host_blocks > 0) {
    EXPECT_GT(swap_outs_seen, 0) << "long victims were meant to be swapped";
    EXPECT_EQ(swap_ins_seen, swap_outs_seen);
    EXPECT_EQ(scheduler.num_swap_outs(), swap_outs_seen);
  }
  EXPECT_EQ(scheduler.num_preemptions(), preemptions_seen + swap_outs_seen);
  EXPECT_GT(scheduler.block_manager().stats().hit_blocks, 0);
  for (const auto& seq : seqs) {
    ASSERT_TRUE(seq->is_finished());
    EXPECT_EQ(std::vector<int32_t>(seq->output_ids().begin(), seq->output_ids().end()),
              expected_output(*seq, config.max_model_len))
        << "sequence " << seq->id;
  }
  EXPECT_EQ(scheduler.block_manager().num_free_blocks(), config.num_blocks);
  for (int32_t b = 0; b < config.num_blocks; ++b) EXPECT_EQ(scheduler.block_manager().ref_count(b), 0);
  EXPECT_EQ(scheduler.block_manager().num_free_host_blocks(), num_host_blocks);
  EXPECT_TRUE(scheduler.swapped().empty());
}

TEST(Scheduler, RandomizedSimulationSplitFuse) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    run_random_simulation(true, seed);
  }
}

TEST(Scheduler, RandomizedSimulationPrefillFirst) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    run_random_simulation(false, seed);
  }
}

// Swapping sequences of 12 computed tokens or more (others recompute) into 30 host blocks,
// which at times cannot hold a victim (then it recomputes too).
TEST(Scheduler, RandomizedSimulationWithSwapSplitFuse) {
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    SCOPED_TRACE(seed);
    run_random_simulation(true, seed, 30, 12);
  }
}

TEST(Scheduler, RandomizedSimulationWithSwapPrefillFirst) {
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    SCOPED_TRACE(seed);
    run_random_simulation(false, seed, 30, 12);
  }
}

// The engine loop over the real CPU ModelRunner: several stories260K requests batched by the
// scheduler (chunked prompts, a shared prompt prefix, preemption when the cache is small) must
// each produce exactly the greedy tokens the single-request Generator produces.
struct BatchedRun {
  std::vector<std::vector<int32_t>> outputs;
  int64_t preemptions = 0;
  int64_t prefix_hit_blocks = 0;
};

BatchedRun run_batched(ModelRunner& runner, const Tokenizer& tokenizer, const SchedulerConfig& config,
                       const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params) {
  Scheduler scheduler(config);
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<std::unique_ptr<Sampler>> samplers;
  for (size_t i = 0; i < prompts.size(); ++i) {
    seqs.push_back(std::make_unique<Sequence>(static_cast<int64_t>(i), prompts[i], params));
    samplers.push_back(std::make_unique<Sampler>(params, runner.spec().vocab_size));
    scheduler.add(*seqs.back());
  }
  const size_t vocab = static_cast<size_t>(runner.spec().vocab_size);
  for (int steps = 0; scheduler.has_unfinished(); ++steps) {
    SF_CHECK(steps < 10000, "batched run made no progress");
    const StepPlan plan = scheduler.schedule();
    SF_CHECK(!plan.empty(), "the scheduler planned an empty step with work pending");
    const Tensor logits = runner.forward(plan.batch);
    std::vector<int32_t> tokens;
    for (size_t s = 0; s < plan.seqs.size(); ++s) {
      if (!plan.batch.spans[s].want_logits) continue;
      const Sequence& seq = *plan.seqs[s];
      const auto row = std::span<const float>(logits.as<float>() + tokens.size() * vocab, vocab);
      tokens.push_back(samplers[static_cast<size_t>(seq.id)]->sample(row, seq.prompt_ids(), seq.output_ids()).token_id);
    }
    scheduler.postprocess(plan, tokens);
  }
  BatchedRun run;
  for (const auto& seq : seqs) run.outputs.emplace_back(seq->output_ids().begin(), seq->output_ids().end());
  run.preemptions = scheduler.num_preemptions();
  run.prefix_hit_blocks = scheduler.block_manager().stats().hit_blocks;
  return run;
}

TEST(SchedulerWithModelRunner, BatchedGreedyOutputsMatchSingleRequestGeneration) {
  ModelLoadOptions options;
  options.model_path = test::shared_path("models/stories260K/stories260K.bin");
  options.weight_dtype = DType::F32;
  LoadedModel model = load_model(options);
  std::unique_ptr<Backend> backend = make_cpu_backend(0);
  constexpr int32_t kBlockSize = 16;
  const KvCacheConfig kv{64, kBlockSize};
  RunnerLimits limits;
  limits.max_batch_tokens = 24;
  limits.max_seqs = 4;
  ModelRunner runner(model.spec, std::move(model.weights), *backend, kv, limits);
  const Tokenizer& tokenizer = *model.tokenizer;

  // Two prompts share a 2-block prefix; one prompt is longer than the token budget.
  const std::string shared =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her "
      "mom and dad every day";
  const std::vector<std::string> texts = {shared + " with her dog.", shared + " in the park with her friends.",
                                          "The sun was shining and the birds were singing in the tall green trees.",
                                          "Tom had a big red ball."};
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& text : texts) prompts.push_back(tokenizer.encode(text, true));
  ASSERT_GE(prompts[0].size(), 2u * kBlockSize + 1);
  ASSERT_GT(prompts[2].size(), static_cast<size_t>(limits.max_batch_tokens) / 2);
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 48;

  Generator generator(runner, &tokenizer);
  std::vector<std::vector<int32_t>> expected;
  for (const auto& prompt : prompts) {
    expected.push_back(generator.generate(prompt, params).output_ids);
    ASSERT_GT(expected.back().size(), 8u) << "a story this short would test little batching";
  }

  SchedulerConfig config;
  config.max_batch_tokens = limits.max_batch_tokens;
  config.max_seqs = limits.max_seqs;
  config.block_size = kBlockSize;
  config.max_model_len = 128;
  config.eos_token_ids = tokenizer.eos_ids();
  for (const bool splitfuse : {true, false}) {
    SCOPED_TRACE(splitfuse ? "splitfuse" : "prefill-first");
    config.splitfuse = splitfuse;
    config.num_blocks = kv.num_blocks;
    const BatchedRun roomy = run_batched(runner, tokenizer, config, prompts, params);
    EXPECT_EQ(roomy.outputs, expected);
    EXPECT_GT(roomy.prefix_hit_blocks, 0);
    // Together the 4 sequences outgrow 9 blocks (one fits: 128 tokens need 8), so some are preempted.
    config.num_blocks = 9;
    const BatchedRun tight = run_batched(runner, tokenizer, config, prompts, params);
    EXPECT_EQ(tight.outputs, expected);
    EXPECT_GT(tight.preemptions, 0);
  }
}

// Encoder-decoder sequences: the decoder's tokens from its start token, the encoder's cross K/V in
// the same blocks (engine/sequence.h).
std::unique_ptr<Sequence> make_encdec_seq(int64_t id, int32_t encoder_tokens, int32_t first_id, int32_t max_tokens) {
  auto seq = make_seq(id, {0}, max_tokens);
  seq->encoder_token_ids = iota_tokens(encoder_tokens, first_id);
  return seq;
}

TEST(Scheduler, EncoderDecoderSpansCoverTheEncoderAndChargeItToTheBudget) {
  Scheduler scheduler(small_config(32, 16));
  auto a = make_encdec_seq(0, 10, 100, 20);
  auto b = make_encdec_seq(1, 10, 200, 20);
  auto c = make_encdec_seq(2, 20, 300, 20);
  for (Sequence* seq : {a.get(), b.get(), c.get()}) scheduler.add(*seq);
  // a and b: 11 tokens each (the encoder's 10, the decoder's start token); c's 21 wait.
  StepPlan plan = scheduler.schedule();
  ASSERT_EQ(plan.seqs.size(), 2u);
  EXPECT_EQ(plan.num_encoder_tokens, 20);
  EXPECT_EQ(plan.num_prefill_tokens, 2);
  for (const SequenceSpan& span : plan.batch.spans) {
    EXPECT_EQ(span.num_tokens, 1);
    EXPECT_EQ(span.start_position, 0);
    EXPECT_EQ(span.encoder_tokens, 10);
    EXPECT_EQ(span.block_table.size(), 3u);  // positions [0, 10) of the cross K/V
  }
  EXPECT_EQ(plan.batch.token_ids, (std::vector<int32_t>{0, 0}));
  // Both decoders produce the same tokens: their blocks still never share (the cross K/V differ).
  const std::vector<int32_t> same = {7, 7};
  scheduler.postprocess(plan, same);
  plan = scheduler.schedule();  // two decodes, then c's encoder and start token
  ASSERT_EQ(plan.seqs.size(), 3u);
  EXPECT_EQ(plan.num_decode_tokens, 2);
  EXPECT_EQ(plan.num_encoder_tokens, 20);
  EXPECT_EQ(plan.batch.spans[0].encoder_tokens, 10);
  EXPECT_EQ(plan.batch.spans[0].start_position, 1);
  EXPECT_EQ(plan.batch.spans[2].block_table.size(), 5u);
  for (int step = 0; step < 12; ++step) {
    std::vector<int32_t> tokens(static_cast<size_t>(plan.num_sampled()), 7);
    scheduler.postprocess(plan, tokens);
    plan = scheduler.schedule();
  }
  // 14 decoder tokens now: four blocks each, all private.
  EXPECT_EQ(a->block_table.size(), 4u);
  std::set<int32_t> blocks(a->block_table.begin(), a->block_table.end());
  blocks.insert(b->block_table.begin(), b->block_table.end());
  EXPECT_EQ(blocks.size(), 8u);
  for (const int32_t block : a->block_table) EXPECT_EQ(scheduler.block_manager().ref_count(block), 1);
  EXPECT_EQ(scheduler.block_manager().stats().queried_blocks, 0);
}

TEST(Scheduler, EncoderDecoderSwapCopiesTheCrossKv) {
  BlockManager manager(16, 4, 8);
  auto seq = make_encdec_seq(0, 10, 100, 20);
  manager.allocate(*seq);
  EXPECT_EQ(seq->block_table.size(), 3u);
  seq->num_computed_tokens = 1;  // the start token ran, and with it the encoder
  EXPECT_EQ(manager.num_recompute_tokens(*seq), 11);
  const std::vector<BlockCopy> out = manager.swap_out(*seq);
  EXPECT_EQ(out.size(), 3u);
  const std::vector<BlockCopy> in = manager.swap_in(*seq);
  EXPECT_EQ(in.size(), 3u);
  EXPECT_EQ(seq->block_table.size(), 3u);
}

TEST(Scheduler, RefusesAnEncoderInputThatNeverFits) {
  Scheduler scheduler(small_config(32, 16));
  auto too_long = make_encdec_seq(0, 32, 100, 4);  // with the decoder's first token, 33 > 32
  EXPECT_THROW(scheduler.add(*too_long), Error);
  Scheduler small(small_config(64, 16));
  auto too_big = make_encdec_seq(1, 63, 100, 4);  // 16 blocks of 4 hold 64 positions: fits
  EXPECT_NO_THROW(small.add(*too_big));
  Scheduler tiny([] {
    SchedulerConfig config = small_config(64, 16);
    config.max_model_len = 32;
    config.num_blocks = 8;
    return config;
  }());
  auto over_cache = make_encdec_seq(2, 40, 100, 4);  // needs 10 blocks, the cache has 8
  EXPECT_THROW(tiny.add(*over_cache), Error);
}

}  // namespace
}  // namespace splitflow
