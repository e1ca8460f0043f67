// chat/jinja_interpreter.h — renders a Program with jinja2's scoping: a for loop body gets a fresh
// scope per iteration, macros and call/filter/set blocks get their own, if does not; `set` writes
// the innermost scope and `set ns.attr` mutates a namespace. Values, operators, filters and tests
// come from jinja_builtins.h. Rendering is bounded by TemplateLimits (output, value and built bytes,
// steps, call and nesting depth), charged through a RenderBudget (jinja_budget.h) that lives as long
// as the render: no template can run forever or take unbounded memory.
#pragma once

#include "chat/jinja_ast.h"
#include "chat/template_limits.h"

#include <string>
#include <utility>
#include <vector>

namespace splitflow::jinja {

// variables: the render context (messages, add_generation_prompt, bos_token, ...), looked up after
// the template's own variables and before the global functions.
// Throws splitflow::Error: the raise_exception message as is, other failures as
// "chat template error at line L, column C: ...", a TemplateLimitError when a limit is reached.
std::string render(const Program& program, const std::vector<std::pair<std::string, Value>>& variables,
                   const TemplateLimits& limits = {});

// Throws splitflow::Error naming the line and column of the first filter or test that jinja2
// would not know (jinja2 checks these when it compiles the template).
void check_filters_and_tests(const Program& program);

}  // namespace splitflow::jinja
