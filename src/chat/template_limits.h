// chat/template_limits.h — what one render of a chat template may spend. Templates come with models
// and messages come from clients, so neither is trusted: every render is bounded in memory, work and
// depth, and reaching a bound fails that render with TemplateLimitError (the server answers 400),
// never the process. The defaults sit far above what real templates need for a prompt of a million
// tokens; docs/chat-templates.md lists them.
#pragma once

#include "core/error.h"

#include <cstddef>
#include <cstdint>

namespace splitflow {

struct TemplateLimits {
  // The rendered prompt: 8 MiB is ~2M tokens of English text, beyond any model's context.
  size_t max_output_bytes = size_t{8} << 20;
  // Any one string, list or dict the template builds (a list or dict counts the bytes of its item
  // slots; its strings are counted as strings of their own).
  size_t max_value_bytes = size_t{16} << 20;
  // The strings, lists and dicts a render builds or copies, summed: bounds the render's memory and
  // the time its string work takes. Real templates copy a message a few times; 256 MiB leaves room
  // for 30 copies of the largest prompt.
  size_t max_built_bytes = size_t{256} << 20;
  // Work, in steps: one per statement, expression, loop iteration and item a builtin visits, and one
  // per 256 bytes a comparison or substring search may read. Real templates take 30-200 steps a
  // message; 10M steps take up to about a second.
  int64_t max_steps = 10'000'000;
  int max_call_depth = 100;       // nested macro / caller calls
  int max_nesting_depth = 100;    // lists and dicts inside lists and dicts (requests nest JSON <= 64)
  int64_t max_range_items = 100000;  // range() length: jinja2's sandbox MAX_RANGE
};

// A render that reached one of its TemplateLimits. The message names the limit and its value, after
// the template location: "chat template error at line 3, column 8: a string of 20971520 bytes would
// exceed 16777216 bytes (limit max_value_bytes)".
class TemplateLimitError : public Error {
 public:
  using Error::Error;
};

}  // namespace splitflow
