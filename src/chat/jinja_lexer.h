// chat/jinja_lexer.h — template source -> tokens, with jinja2's whitespace rules as transformers
// configures them: trim_blocks (the first newline after a block or comment tag is dropped),
// lstrip_blocks (spaces and tabs from the start of a line up to a block or comment tag are
// dropped), `-` on a tag strips all whitespace on that side, `+` turns the block rules off, newlines
// are normalized to \n and one trailing newline of the source is dropped. Comments vanish here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace splitflow::jinja {

struct Location {
  int line = 1;    // 1-based, in the source after newline normalization (same line numbers)
  int column = 1;  // 1-based, in bytes
};

enum class TokenKind {
  Text,           // literal output between tags
  VariableBegin,  // {{
  VariableEnd,    // }}
  BlockBegin,     // {%
  BlockEnd,       // %}
  Name,           // identifiers and keywords (if, for, and, true, ...)
  String,         // value already unescaped
  Integer,
  Float,
  Operator,       // + - * / // % ** ~ ( ) [ ] { } == != < <= > >= = . : | , ;
  End,
};

struct Token {
  TokenKind kind;
  std::string text;  // Text content, name, unescaped string, number or operator spelling
  Location location;
  int64_t integer = 0;
  double number = 0.0;
};

// Throws splitflow::Error "chat template syntax error at line L, column C: ..." on a bad token or
// an unclosed tag.
std::vector<Token> tokenize(const std::string& source);

}  // namespace splitflow::jinja
