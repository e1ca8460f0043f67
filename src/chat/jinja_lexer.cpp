#include "chat/jinja_lexer.h"

#include "chat/jinja_value.h"
#include "core/error.h"
#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string_view>

namespace splitflow::jinja {
namespace {

// jinja2's tokeniter(): every \r\n, \r and \n becomes \n, and (keep_trailing_newline=False) one
// trailing newline is dropped.
std::string normalize_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// The code point that ends at `end` (exclusive), and where it starts.
char32_t decode_before(std::string_view text, size_t end, size_t& start) {
  start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  size_t offset = start;
  return unicode::decode_next(text, offset);
}

// Length of the run of Python whitespace (regex \s) at the end / start of `text`.
size_t trailing_space_bytes(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    size_t start;
    if (!is_python_space(decode_before(text, end, start))) break;
    end = start;
  }
  return text.size() - end;
}

size_t leading_space_bytes(std::string_view text) {
  size_t offset = 0;
  while (offset < text.size()) {
    size_t next = offset;
    if (!is_python_space(unicode::decode_next(text, next))) break;
    offset = next;
  }
  return offset;
}

constexpr std::array<std::string_view, 26> kOperators = {
    "//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(", ")", "{",
    "}",  ">",  "<",  "=",  ".",  ":",  "|", ",", ";"};

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t start = find_tag_start(pos);
      if (start == std::string::npos) {
        emit_text(pos, src_.substr(pos));
        break;
      }
      char kind = src_[start + 1];  // '{', '%' or '#'
      char sign = start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+')
                      ? src_[start + 2] : '\0';
      size_t raw_body = kind == '%' ? match_raw_begin(start) : std::string::npos;
      std::string text = strip_text(src_.substr(pos, start - pos), sign, kind != '{', line_starting);
      emit_text(pos, std::move(text));
      size_t after_open = start + 2 + (sign ? 1 : 0);
      if (raw_body != std::string::npos) {
        pos = lex_raw(start, raw_body, line_starting);
      } else if (kind == '#') {
        pos = lex_comment(start, after_open, line_starting);
      } else {
        pos = lex_tag(start, after_open, kind == '%', line_starting);
      }
    }
    tokens_.push_back(Token{TokenKind::End, "", location(src_.size())});
    return std::move(tokens_);
  }

 private:
  std::string_view rest(size_t offset) const {
    return offset < src_.size() ? std::string_view(src_).substr(offset) : std::string_view();
  }

  Location location(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    return Location{static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

  [[noreturn]] void fail_at(size_t offset, const std::string& message) const {
    Location loc = location(offset);
    fail("chat template syntax error at line {}, column {}: {}", loc.line, loc.column, message);
  }

  size_t find_tag_start(size_t pos) const {
    for (size_t i = src_.find('{', pos); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  // `text` is the data before a tag; jinja2's OptionalLStrip rule.
  std::string strip_text(std::string text, char sign, bool is_block_or_comment, bool line_starting) const {
    if (sign == '-') {
      text.resize(text.size() - trailing_space_bytes(text));
    } else if (sign != '+' && is_block_or_comment) {
      size_t line_pos = text.rfind('\n');
      line_pos = line_pos == std::string::npos ? 0 : line_pos + 1;
      if ((line_pos > 0 || line_starting) && line_pos < text.size() &&
          leading_space_bytes(std::string_view(text).substr(line_pos)) == text.size() - line_pos) {
        text.resize(line_pos);
      }
    }
    return text;
  }

  void emit_text(size_t offset, std::string text) {
    if (text.empty()) return;
    tokens_.push_back(Token{TokenKind::Text, std::move(text), location(offset)});
  }

  // End of `{%[-+]?\s*raw\s*(-%}\s*|%})` at `start`, or npos.
  size_t match_raw_begin(size_t start) const {
    size_t i = start + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    i += leading_space_bytes(rest(i));
    if (src_.compare(i, 3, "raw") != 0) return std::string::npos;
    i += 3;
    i += leading_space_bytes(rest(i));
    if (src_.compare(i, 3, "-%}") == 0) {
      i += 3;
      return i + leading_space_bytes(rest(i));
    }
    if (src_.compare(i, 2, "%}") == 0) return i + 2;
    return std::string::npos;
  }

  size_t lex_raw(size_t start, size_t body, bool& line_starting) {
    for (size_t i = src_.find("{%", body); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t j = i + 2;
      char sign = j < src_.size() && (src_[j] == '-' || src_[j] == '+') ? src_[j] : '\0';
      if (sign) ++j;
      j += leading_space_bytes(rest(j));
      if (src_.compare(j, 6, "endraw") != 0) continue;
      j += 6;
      j += leading_space_bytes(rest(j));
      size_t end = end_of_block_close(j, true);
      if (end == std::string::npos) continue;
      line_starting = src_[body - 1] == '\n';
      emit_text(body, strip_text(src_.substr(body, i - body), sign, true, line_starting));
      line_starting = src_[end - 1] == '\n';
      return end;
    }
    fail_at(start, "Missing end of raw directive");
  }

  // After `%}`-style closers: `+%}`, `-%}` + whitespace, or `%}` + one newline (trim_blocks).
  size_t end_of_block_close(size_t i, bool is_block) const {
    const char* close = is_block ? "%}" : "#}";
    if (src_.compare(i, 3, std::string("+") + close) == 0) return i + 3;
    if (src_.compare(i, 3, std::string("-") + close) == 0) {
      return i + 3 + leading_space_bytes(rest(i + 3));
    }
    if (src_.compare(i, 2, close) == 0) return i + 2 + (i + 2 < src_.size() && src_[i + 2] == '\n');
    return std::string::npos;
  }

  size_t lex_comment(size_t start, size_t body, bool& line_starting) {
    size_t close = src_.find("#}", body);
    if (close == std::string::npos) fail_at(start, "Missing end of comment tag");
    if (close > body && (src_[close - 1] == '-' || src_[close - 1] == '+')) --close;
    size_t end = end_of_block_close(close, false);
    line_starting = src_[end - 1] == '\n';
    return end;
  }

  size_t lex_tag(size_t start, size_t pos, bool is_block, bool& line_starting) {
    tokens_.push_back(Token{is_block ? TokenKind::BlockBegin : TokenKind::VariableBegin,
                            is_block ? "{%" : "{{", location(start)});
    std::vector<char> brackets;  // expected closers; tag ends only match when empty
    while (true) {
      if (pos >= src_.size()) {
        fail_at(start, is_block ? "unexpected end of template, block tag '{%' is never closed"
                                : "unexpected end of template, variable tag '{{' is never closed");
      }
      if (brackets.empty()) {
        size_t end = is_block ? end_of_block_close(pos, true) : end_of_variable_close(pos);
        if (end != std::string::npos) {
          tokens_.push_back(Token{is_block ? TokenKind::BlockEnd : TokenKind::VariableEnd,
                                  is_block ? "%}" : "}}", location(pos)});
          line_starting = src_[end - 1] == '\n';
          return end;
        }
      }
      size_t space = leading_space_bytes(rest(pos));
      if (space) {
        pos += space;
        continue;
      }
      pos = lex_expression_token(pos, brackets);
    }
  }

  size_t end_of_variable_close(size_t i) const {
    if (src_.compare(i, 3, "-}}") == 0) return i + 3 + leading_space_bytes(rest(i + 3));
    if (src_.compare(i, 2, "}}") == 0) return i + 2;
    return std::string::npos;
  }

  size_t lex_expression_token(size_t pos, std::vector<char>& brackets) {
    char c = src_[pos];
    if (is_digit(c) && (pos == 0 || src_[pos - 1] != '.')) {
      if (size_t end = match_float(pos); end != std::string::npos) {
        std::string digits;
        for (size_t i = pos; i < end; ++i) {
          if (src_[i] != '_') digits += src_[i];
        }
        Token token{TokenKind::Float, src_.substr(pos, end - pos), location(pos)};
        token.number = std::strtod(digits.c_str(), nullptr);
        tokens_.push_back(std::move(token));
        return end;
      }
    }
    if (is_digit(c)) return lex_integer(pos);
    if (is_name_start(c)) {
      size_t end = pos;
      while (end < src_.size() && is_name_char(src_[end])) ++end;
      tokens_.push_back(Token{TokenKind::Name, src_.substr(pos, end - pos), location(pos)});
      return end;
    }
    if (c == '\'' || c == '"') return lex_string(pos);
    for (std::string_view op : kOperators) {
      if (src_.compare(pos, op.size(), op) != 0) continue;
      if (op == "(" || op == "[" || op == "{") {
        brackets.push_back(op == "(" ? ')' : (op == "[" ? ']' : '}'));
      } else if (op == ")" || op == "]" || op == "}") {
        if (brackets.empty()) fail_at(pos, fmt::format("unexpected '{}'", op));
        if (brackets.back() != op[0]) fail_at(pos, fmt::format("unexpected '{}', expected '{}'", op, brackets.back()));
        brackets.pop_back();
      }
      tokens_.push_back(Token{TokenKind::Operator, std::string(op), location(pos)});
      return pos + op.size();
    }
    size_t next = pos;
    char32_t cp = unicode::decode_next(src_, next);
    std::string shown;
    unicode::append_utf8(shown, cp);
    fail_at(pos, fmt::format("unexpected char {}", python_string_repr(shown)));
  }

  // (\d+_)*\d+ ( (\.(\d+_)*\d+)? e[+-]?(\d+_)*\d+ | \.(\d+_)*\d+ ), case-insensitive.
  size_t match_digits(size_t i) const {
    if (i >= src_.size() || !is_digit(src_[i])) return std::string::npos;
    while (true) {
      while (i < src_.size() && is_digit(src_[i])) ++i;
      if (i + 1 < src_.size() && src_[i] == '_' && is_digit(src_[i + 1])) {
        ++i;
        continue;
      }
      return i;
    }
  }

  size_t match_float(size_t pos) const {
    size_t i = match_digits(pos);
    bool fraction = false;
    if (i < src_.size() && src_[i] == '.') {
      size_t f = match_digits(i + 1);
      if (f != std::string::npos) {
        i = f;
        fraction = true;
      }
    }
    if (i < src_.size() && (src_[i] == 'e' || src_[i] == 'E')) {
      size_t j = i + 1;
      if (j < src_.size() && (src_[j] == '+' || src_[j] == '-')) ++j;
      size_t e = match_digits(j);
      if (e != std::string::npos) return e;
    }
    return fraction ? i : std::string::npos;
  }

  size_t lex_integer(size_t pos) {
    int base = 10;
    size_t i = pos;
    if (src_[pos] == '0' && pos + 1 < src_.size()) {
      char p = static_cast<char>(src_[pos + 1] | 0x20);
      base = p == 'b' ? 2 : (p == 'o' ? 8 : (p == 'x' ? 16 : 10));
      if (base != 10) i += 2;
    }
    auto digit_value = [](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      c = static_cast<char>(c | 0x20);
      return c >= 'a' && c <= 'f' ? c - 'a' + 10 : 99;
    };
    uint64_t value = 0;
    size_t digits = 0;
    for (; i < src_.size(); ++i) {
      if (src_[i] == '_') continue;
      int d = digit_value(src_[i]);
      if (d >= base) break;
      if (value > (static_cast<uint64_t>(INT64_MAX) - d) / base) fail_at(pos, "integer literal too large");
      value = value * base + d;
      ++digits;
    }
    if (digits == 0) fail_at(pos, "invalid integer literal");
    Token token{TokenKind::Integer, src_.substr(pos, i - pos), location(pos)};
    token.integer = static_cast<int64_t>(value);
    tokens_.push_back(std::move(token));
    return i;
  }

  size_t lex_string(size_t pos) {
    char quote = src_[pos];
    size_t i = pos + 1;
    while (i < src_.size() && src_[i] != quote) i += src_[i] == '\\' ? 2 : 1;
    if (i >= src_.size()) fail_at(pos, fmt::format("unexpected char {}", python_string_repr(std::string(1, quote))));
    tokens_.push_back(Token{TokenKind::String, unescape(pos, src_.substr(pos + 1, i - pos - 1)), location(pos)});
    return i + 1;
  }

  // Python's "unicode-escape" decoding, as jinja2 applies it to string literals.
  std::string unescape(size_t pos, const std::string& body) const {
    std::string out;
    auto hex = [&](size_t& i, int count, const char* what) -> char32_t {
      uint32_t value = 0;
      for (int k = 0; k < count; ++k, ++i) {
        char c = i < body.size() ? static_cast<char>(body[i] | 0x20) : '\0';
        if (!is_digit(c) && !(c >= 'a' && c <= 'f')) fail_at(pos, fmt::format("truncated {} escape", what));
        value = value * 16 + (is_digit(c) ? c - '0' : c - 'a' + 10);
      }
      if (value > 0x10FFFF) fail_at(pos, "illegal Unicode character");
      return value;
    };
    for (size_t i = 0; i < body.size();) {
      if (body[i] != '\\' || i + 1 >= body.size()) {
        out += body[i++];
        continue;
      }
      char e = body[i + 1];
      i += 2;
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': unicode::append_utf8(out, hex(i, 2, "\\xXX")); break;
        case 'u': unicode::append_utf8(out, hex(i, 4, "\\uXXXX")); break;
        case 'U': unicode::append_utf8(out, hex(i, 8, "\\UXXXXXXXX")); break;
        case 'N': fail_at(pos, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t value = e - '0';
            for (int k = 0; k < 2 && i < body.size() && body[i] >= '0' && body[i] <= '7'; ++k, ++i) {
              value = value * 8 + (body[i] - '0');
            }
            unicode::append_utf8(out, value);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    return out;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(normalize_newlines(source)).run(); }

}  // namespace splitflow::jinja
