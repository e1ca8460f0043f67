// grammar/gbnf.h — llama.cpp's GBNF grammar format -> Grammar.
//
// Accepted: `name ::= alternatives` rules (names of letters, digits and '-'), `|`, `( )` groups,
// "literals" (escapes \n \r \t \\ \" \' \[ \] \xHH \uHHHH \UHHHHHHHH), [character classes]
// (ranges, ^ negation, the same escapes), `.` (any character), and the postfix repetitions `*`,
// `+`, `?`, `{m}`, `{m,}`, `{m,n}`; `#` comments. Newlines are plain whitespace: a rule ends where
// the next `name ::=` starts (a superset of llama.cpp, which also ends rules at top-level newlines).
// The start rule is `root`. Errors are GrammarError naming line and column, or the rule at fault.
#pragma once

#include "grammar/grammar.h"

#include <string_view>

namespace splitflow::grammar {

inline constexpr int32_t kMaxGbnfRepetition = 1000;  // m and n of {m,n}
// Deepest nesting of ( ) groups: the parser recurses per level, so a hostile grammar cannot
// exhaust the stack.
inline constexpr int32_t kMaxGbnfNesting = 1000;

Grammar parse_gbnf(std::string_view text, const std::string& root = "root");

}  // namespace splitflow::grammar
