// engine/constrained_step.h — the masks of one step's constrained sequences (structured
// outputs, engine/token_constraint.h). start() computes them on a helper thread while the
// step's forward runs, so a mask that is not cached costs the forward's time, not the step's;
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

#include <cstdint>
#include <future>
#include <optional>
#include <span>
#include <vector>

namespace splitflow {

class ConstrainedStep {
 public:
  ~ConstrainedStep();
  // constraints: (sampled rows) null for an unconstrained row. vocab_size: the logits' width.
  // accept_first (empty, or one per row): a token each row's constraint accepts before its mask
  // (the row's previous draw; nullopt: none). A token the constraint refuses is rethrown by the
  // first wait (apply, mask, all_masks).
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

 private:
  void compute();
  void wait();

  std::vector<TokenConstraint*> constraints_;
  std::vector<std::optional<int32_t>> accept_first_;
  std::vector<int32_t> eos_ids_;
  int32_t vocab_size_ = 0;
  size_t words_ = 0;
  std::vector<uint32_t> masks_;  // (rows, words_)
  bool any_ = false;
  std::future<void> pending_;
};

}  // namespace splitflow
