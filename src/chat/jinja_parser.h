// chat/jinja_parser.h — tokens -> Program, following jinja2's grammar (jinja2/parser.py): the
// statements if/elif/else, for (with else, `if` filter), set (also `ns.attr` and block set),
// macro, call, filter, with, break/continue and transformers' generation block; expressions with
// jinja2's precedence (conditional, or, and, not, comparisons and in, + -, ~, * / // %, **, unary,
// postfix attribute/item/slice/call, filters and tests).
#pragma once

#include "chat/jinja_ast.h"

#include <string>

namespace splitflow::jinja {

// Throws splitflow::Error "chat template syntax error at line L, column C: ...".
Program parse(const std::string& source);

}  // namespace splitflow::jinja
