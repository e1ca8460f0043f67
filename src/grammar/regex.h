// grammar/regex.h — a regular expression (the common subset of ECMAScript and Python `re`) as a
// GBNF expression, and as a Grammar the whole output must match.
//
// Supported: literals and escapes (\n \r \t \f \v \0 \xHH \uHHHH and escaped punctuation), `.`
// (any character but a newline), classes ([a-z], [^...], with \d \w \s inside), \d \D \w \W \s
// \S, groups ( ) and (?: ) and named groups (?P<n> ) / (?<n> ), alternation, the quantifiers * + ?
// {m} {m,} {m,n} (lazy and possessive forms match the same language), and ^ / $ at the ends (the
// output is always matched whole). Anything else (backreferences, lookaround, \b, inline flags)
// is a GrammarError naming it.
#pragma once

#include "grammar/grammar.h"

#include <string>
#include <string_view>

namespace splitflow::grammar {

std::string regex_to_gbnf(std::string_view pattern);
Grammar compile_regex(std::string_view pattern);

}  // namespace splitflow::grammar
