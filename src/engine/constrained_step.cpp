#include "engine/constrained_step.h"

#include "sampling/token_mask.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

namespace splitflow {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }
}  // namespace

ConstrainedStep::~ConstrainedStep() {
  {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [this] { return !job_; });
    stop_ = true;
  }
  changed_.notify_all();
  if (helper_.joinable()) helper_.join();
}

void ConstrainedStep::helper_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return job_ || stop_; });
    if (stop_) return;
    lock.unlock();
    const auto start = Clock::now();
    std::exception_ptr error;
    try {
      compute();
    } catch (...) {
      error = std::current_exception();
    }
    const double seconds = seconds_since(start);
    lock.lock();
    stats_.compute_s += seconds;
    error_ = error;
    job_ = false;
    changed_.notify_all();
  }
}

void ConstrainedStep::start(std::vector<TokenConstraint*> constraints, int32_t vocab_size,
                            std::span<const int32_t> eos_ids, std::vector<std::optional<int32_t>> accept_first) {
  {
    std::unique_lock lock(mutex_);  // a previous step's job, if no one waited for it
    changed_.wait(lock, [this] { return !job_; });
    error_ = nullptr;
  }
  constraints_ = std::move(constraints);
  accept_first_ = std::move(accept_first);
  accept_first_.resize(constraints_.size());
  any_ = std::any_of(constraints_.begin(), constraints_.end(), [](TokenConstraint* c) { return c != nullptr; });
  if (!any_) return;
  vocab_size_ = vocab_size;
  eos_ids_.assign(eos_ids.begin(), eos_ids.end());
  words_ = static_cast<size_t>(vocab_size + 31) / 32;
  if (!helper_.joinable()) helper_ = std::thread([this] { helper_loop(); });
  {
    std::lock_guard lock(mutex_);
    job_ = true;
    ++stats_.steps;
    stats_.rows += std::count_if(constraints_.begin(), constraints_.end(), [](TokenConstraint* c) { return c != nullptr; });
  }
  changed_.notify_all();
}

void ConstrainedStep::compute() {
  // Sized and filled here, not in start(): start() is on the step's critical path, before the
  // forward is issued (64 rows of a 49K vocabulary are 393 KB).
  masks_.resize(constraints_.size() * words_);
  for (size_t row = 0; row < constraints_.size(); ++row) {
    TokenConstraint* constraint = constraints_[row];
    const std::span<uint32_t> mask(masks_.data() + row * words_, words_);
    if (!constraint) {
      std::fill(mask.begin(), mask.end(), ~0u);
      continue;
    }
    if (accept_first_[row]) constraint->accept_token(*accept_first_[row]);
    constraint->fill_next_token_mask(mask);
    const bool none = std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; });
    if (constraint->can_end() || none) {
      for (const int32_t eos : eos_ids_) {
        if (eos >= 0 && eos < vocab_size_) mask[static_cast<size_t>(eos) / 32] |= 1u << (eos % 32);
      }
    }
  }
}

void ConstrainedStep::wait() {
  const auto start = Clock::now();
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return !job_; });
  stats_.wait_s += seconds_since(start);
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));  // a constraint's failure, here
}

void ConstrainedStep::settle() noexcept {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return !job_; });
  error_ = nullptr;
}

ConstrainedStepStats ConstrainedStep::stats() {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::span<const uint32_t> ConstrainedStep::mask(size_t row) {
  wait();
  return {masks_.data() + row * words_, words_};
}

std::span<const uint32_t> ConstrainedStep::all_masks() {
  wait();
  return masks_;
}

void ConstrainedStep::apply(size_t row, std::span<float> logits) {
  if (!constrained(row)) return;
  const std::span<const uint32_t> allowed = mask(row);
  const size_t n = std::min(logits.size(), static_cast<size_t>(vocab_size_));
  mask_logits_row(logits.data(), allowed.data(), static_cast<int64_t>(n));
  for (size_t t = n; t < logits.size(); ++t) logits[t] = -std::numeric_limits<float>::infinity();
}

}  // namespace splitflow
