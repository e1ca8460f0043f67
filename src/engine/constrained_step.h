// engine/constrained_step.h — the masks of each step's constrained sequences (structured
// outputs, engine/token_constraint.h). The engine keeps one for its life; each step's start()
// hands the masks to its helper thread (one thread, started at the first constrained step and
// kept: a thread made per step cost the step's critical path its creation), which computes them
// while the step's forward runs, so a mask that is not cached costs the forward's time, not the step's;
// apply() waits for them and sets each disallowed logit of a row to -inf before sampling on the
// host; all_masks() hands them to the device path (ModelRunner::forward_sample), which applies
// them there.
// End-of-sequence tokens are allowed once a constraint can end, and when it allows nothing (a
// vocabulary that cannot spell what the grammar needs) so that the sequence still finishes.
// A row's token drawn by the previous step is accepted by its constraint on the helper thread too,
// just before its mask, so that parse step overlaps the forward instead of following the draw on
// the engine thread (at batch 64 on an H100 a step is 1.5 ms; host work after the draw is not
// hidden behind it).
#pragma once

#include "engine/token_constraint.h"

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

namespace splitflow {

// Where a constrained step's host time goes: `compute_s` on the helper (accepts and masks),
// `wait_s` on the caller, blocked for the masks after issuing the forward. The device runs the
// forward meanwhile, so either costs the step only what outlasts the forward.
struct ConstrainedStepStats {
  int64_t steps = 0;  // steps with a constrained row
  int64_t rows = 0;   // constrained rows over those steps
  double compute_s = 0;
  double wait_s = 0;
};

class ConstrainedStep {
 public:
  ConstrainedStep() = default;
  ConstrainedStep(const ConstrainedStep&) = delete;
  ConstrainedStep& operator=(const ConstrainedStep&) = delete;
  ~ConstrainedStep();  // waits for the step's masks, then stops the helper
  // constraints: (sampled rows) null for an unconstrained row. vocab_size: the logits' width.
  // accept_first (empty, or one per row): a token each row's constraint accepts before its mask
  // (the row's previous draw; nullopt: none). A token the constraint refuses is rethrown by the
  // first wait (apply, mask, all_masks). A step's masks are the previous start()'s until then.
  void start(std::vector<TokenConstraint*> constraints, int32_t vocab_size, std::span<const int32_t> eos_ids,
             std::vector<std::optional<int32_t>> accept_first = {});
  bool any() const { return any_; }
  bool constrained(size_t row) const { return row < constraints_.size() && constraints_[row] != nullptr; }
  // Waits for the masks; -inf on every logit of `logits` (row `row`'s) that its mask disallows.
  void apply(size_t row, std::span<float> logits);
  // The mask of a row (bit t of word t / 32), after the masks are ready.
  std::span<const uint32_t> mask(size_t row);
  // Every row's mask, (rows, ceil(vocab / 32)) words, unconstrained rows all ones: what
  // ModelRunner::forward_sample applies on the device.
  std::span<const uint32_t> all_masks();
  // Waits for the step's masks without rethrowing their failure: the end of every step, however
  // it ends, so the helper never outlives the constraints it reads.
  void settle() noexcept;
  // Totals since construction (a moment's copy; settle() first for the last step's compute).
  ConstrainedStepStats stats();

 private:
  void compute();
  void wait();
  void helper_loop();

  std::vector<TokenConstraint*> constraints_;
  std::vector<std::optional<int32_t>> accept_first_;
  std::vector<int32_t> eos_ids_;
  int32_t vocab_size_ = 0;
  size_t words_ = 0;
  std::vector<uint32_t> masks_;  // (rows, words_)
  bool any_ = false;

  // The helper: `job_` is set by start() and cleared by the helper when the masks are done.
  std::thread helper_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool job_ = false;
  bool stop_ = false;
  std::exception_ptr error_;  // the job's failure, rethrown by wait()
  ConstrainedStepStats stats_;  // under mutex_
};

}  // namespace splitflow
