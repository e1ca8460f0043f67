// chat/jinja_budget.h — the running account of one render against its TemplateLimits. The
// interpreter creates a RenderBudget per render; the value type and the builtins charge it through
// the free functions below, checking sizes before they allocate. The budget is found through the
// thread (one render runs on a thread at a time) rather than passed along: charges come from Value
// copies and from deep inside the builtins, which would otherwise all take it as a parameter.
// Outside a render (values built from the request's JSON) nothing is charged.
#pragma once

#include "chat/template_limits.h"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace splitflow::jinja {

// A limit reached inside a render; the interpreter adds the template location and rethrows it as a
// TemplateLimitError.
class LimitExceeded : public std::runtime_error {
 public:
  explicit LimitExceeded(const std::string& message) : std::runtime_error(message) {}
};

class RenderBudget {
 public:
  // Becomes the budget of the render on this thread until destroyed.
  explicit RenderBudget(const TemplateLimits& limits);
  ~RenderBudget();
  RenderBudget(const RenderBudget&) = delete;
  RenderBudget& operator=(const RenderBudget&) = delete;

  const TemplateLimits& limits() const { return limits_; }
  void add_steps(int64_t steps);
  void add_built_bytes(size_t bytes);

 private:
  TemplateLimits limits_;
  int64_t steps_ = 0;
  size_t built_bytes_ = 0;
  RenderBudget* enclosing_;  // the thread's budget before this one (none in practice)
};

// The limits of the render on this thread; the defaults outside a render.
const TemplateLimits& current_limits();

// Work: statements, expressions, iterations, items visited.
void charge_steps(int64_t steps);
// A comparison that reads `bytes`, or a substring search that may compare every needle byte at
// every haystack position.
void charge_bytes_read(size_t bytes);
void charge_search(size_t haystack_bytes, size_t needle_bytes);

// Before building a string of `bytes` (or growing one to that size): throws past max_value_bytes.
// Charging happens when the string becomes a Value.
void check_string_size(size_t bytes);
// The same for `count` repetitions of `unit_bytes` (string * n, padding to a width), which may
// overflow when multiplied.
void check_repeated_string_size(int64_t count, size_t unit_bytes);
// Before building a `kind` ("list", "dict", ...) of `items` slots of `slot_bytes` each.
void check_container_size(std::string_view kind, size_t items, size_t slot_bytes);
// Before growing the rendered prompt to `bytes`: throws past max_output_bytes.
void check_output_size(size_t bytes);

// A string of `bytes` built or copied into a Value: checked against max_value_bytes, added to the
// built bytes. Strings short enough to live inside the Value allocate nothing and are not charged.
void charge_string(size_t bytes);
// A container of `items` slots built: checked like check_container_size, added to the built bytes.
void charge_container(std::string_view kind, size_t items, size_t slot_bytes);
// A list or dict built with `depth` levels of containers: throws past max_nesting_depth.
void check_nesting_depth(int depth);

}  // namespace splitflow::jinja
