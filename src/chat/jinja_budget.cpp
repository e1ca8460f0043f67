#include "chat/jinja_budget.h"

#include <fmt/format.h>

#include <algorithm>

namespace splitflow::jinja {
namespace {

thread_local RenderBudget* current_budget = nullptr;

// A step is roughly the time of evaluating one expression; memcmp reads about this many bytes then.
constexpr size_t kBytesReadPerStep = 256;
// Strings up to this length live inside the std::string itself (libstdc++ 15, libc++ 22): they
// allocate nothing beyond their Value.
constexpr size_t kInlineStringBytes = 15;

[[noreturn]] void fail_value_size(std::string_view what, uint64_t amount, std::string_view unit) {
  throw LimitExceeded(fmt::format("a {} of {} {} would exceed {} bytes (limit max_value_bytes)", what, amount, unit,
                                  current_limits().max_value_bytes));
}

}  // namespace

RenderBudget::RenderBudget(const TemplateLimits& limits) : limits_(limits), enclosing_(current_budget) {
  current_budget = this;
}

RenderBudget::~RenderBudget() { current_budget = enclosing_; }

void RenderBudget::add_steps(int64_t steps) {
  steps_ += steps;
  if (steps_ > limits_.max_steps) {
    throw LimitExceeded(fmt::format("the template would take more than {} steps (limit max_steps)", limits_.max_steps));
  }
}

void RenderBudget::add_built_bytes(size_t bytes) {
  built_bytes_ += bytes;
  if (built_bytes_ > limits_.max_built_bytes) {
    throw LimitExceeded(fmt::format(
        "the template would build more than {} bytes of strings, lists and dicts (limit max_built_bytes)",
        limits_.max_built_bytes));
  }
}

const TemplateLimits& current_limits() {
  static const TemplateLimits defaults;
  return current_budget ? current_budget->limits() : defaults;
}

void charge_steps(int64_t steps) {
  if (current_budget) current_budget->add_steps(steps);
}

void charge_bytes_read(size_t bytes) {
  if (current_budget) current_budget->add_steps(1 + static_cast<int64_t>(bytes / kBytesReadPerStep));
}

void charge_search(size_t haystack_bytes, size_t needle_bytes) {
  if (!current_budget) return;
  // std::string::find compares up to the whole needle at every position of the haystack.
  uint64_t compared = 0;
  if (__builtin_mul_overflow(uint64_t{haystack_bytes}, uint64_t{std::max<size_t>(needle_bytes, 1)}, &compared)) {
    compared = UINT64_MAX;
  }
  current_budget->add_steps(1 + static_cast<int64_t>(std::min<uint64_t>(compared / kBytesReadPerStep, INT64_MAX / 2)));
}

void check_string_size(size_t bytes) {
  if (bytes > current_limits().max_value_bytes) fail_value_size("string", bytes, "bytes");
}

void check_repeated_string_size(int64_t count, size_t unit_bytes) {
  if (count <= 0) return;
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(count), uint64_t{unit_bytes}, &bytes)) {
    throw LimitExceeded(fmt::format("a string of {} times {} bytes would exceed {} bytes (limit max_value_bytes)",
                                    count, unit_bytes, current_limits().max_value_bytes));
  }
  check_string_size(bytes);
}

void check_container_size(std::string_view kind, size_t items, size_t slot_bytes) {
  if (items > current_limits().max_value_bytes / slot_bytes) fail_value_size(kind, items, "items");
}

void check_output_size(size_t bytes) {
  size_t limit = current_limits().max_output_bytes;
  if (bytes > limit) {
    throw LimitExceeded(fmt::format("the rendered prompt would exceed {} bytes (limit max_output_bytes)", limit));
  }
}

void charge_string(size_t bytes) {
  if (!current_budget || bytes <= kInlineStringBytes) return;
  check_string_size(bytes);
  current_budget->add_built_bytes(bytes);
}

void charge_container(std::string_view kind, size_t items, size_t slot_bytes) {
  if (!current_budget) return;
  check_container_size(kind, items, slot_bytes);
  current_budget->add_built_bytes(items * slot_bytes);
}

void check_nesting_depth(int depth) {
  if (!current_budget) return;
  int limit = current_budget->limits().max_nesting_depth;
  if (depth > limit) {
    throw LimitExceeded(
        fmt::format("lists and dicts nested more than {} deep (limit max_nesting_depth)", limit));
  }
}

}  // namespace splitflow::jinja
