#include "grammar/gbnf.h"

#include <fmt/format.h>

#include <cctype>

namespace splitflow::grammar {

namespace {

using Sequence = GrammarBuilder::Sequence;

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : text_(text) {}

  Grammar parse(const std::string& root) {
    skip_space();
    if (at_end()) throw GrammarError("the GBNF grammar is empty");
    while (!at_end()) {
      const size_t name_at = pos_;
      const std::string name = parse_name("a rule name");
      skip_space();
      if (!consume("::=")) error("expected '::=' after rule name '" + name + "'");
      const int32_t rule = builder_.rule(name);
      if (builder_.defined(rule)) error_at(name_at, "rule '" + name + "' is defined twice");
      skip_space();
      builder_.define(rule, parse_alternatives(/*nested=*/false));
    }
    return builder_.finish(root);
  }

 private:
  [[noreturn]] void error_at(size_t at, const std::string& message) const {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    throw GrammarError(fmt::format("GBNF grammar, line {}, column {}: {}", line, column, message));
  }
  [[noreturn]] void error(const std::string& message) const { error_at(pos_, message); }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }
  bool consume(std::string_view token) {
    if (text_.substr(pos_, token.size()) != token) return false;
    pos_ += token.size();
    return true;
  }
  static bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; }

  void skip_space() {
    while (!at_end()) {
      const char c = peek();
      if (c == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name(const char* what) {
    const size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    if (pos_ == start) error(fmt::format("expected {}", what));
    return std::string(text_.substr(start, pos_ - start));
  }

  // Whether the text at pos_ starts the next rule (`name ::=`).
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < text_.size() && is_name_char(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
    return text_.substr(p, 3) == "::=";
  }

  std::vector<Sequence> parse_alternatives(bool nested) {
    std::vector<Sequence> alternatives;
    alternatives.push_back(parse_sequence(nested));
    while (peek() == '|') {
      ++pos_;
      skip_space();
      alternatives.push_back(parse_sequence(nested));
    }
    return alternatives;
  }

  Sequence parse_sequence(bool nested) {
    Sequence sequence;
    size_t last_start = 0;  // where the last element's symbols start, for a repetition
    while (!at_end()) {
      const char c = peek();
      if (c == '|' || (c == ')' && nested)) break;
      if (!nested && at_rule_start()) break;
      if (c == ')') error("unmatched ')'");
      if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (sequence.size() == last_start) error(fmt::format("'{}' repeats nothing", c));
        apply_repetition(sequence, last_start);
        skip_space();
        continue;
      }
      last_start = sequence.size();
      if (c == '"') {
        ++pos_;
        std::string literal;
        while (peek() != '"') {
          if (at_end()) error("unterminated string literal");
          append_utf8(literal, parse_char());
        }
        ++pos_;
        builder_.append_literal(sequence, literal);
        if (literal.empty()) last_start = sequence.size();  // "" matches nothing to repeat
      } else if (c == '[') {
        parse_class(sequence);
      } else if (c == '.') {
        ++pos_;
        builder_.append_code_points(sequence, {}, /*negated=*/true);
      } else if (c == '(') {
        if (++depth_ > kMaxGbnfNesting) error(fmt::format("groups nest deeper than {} levels", kMaxGbnfNesting));
        ++pos_;
        skip_space();
        const int32_t group = builder_.fresh_rule("group");
        builder_.define(group, parse_alternatives(/*nested=*/true));
        --depth_;
        if (peek() != ')') error("expected ')'");
        ++pos_;
        sequence.push_back(GrammarBuilder::ref(group));
      } else if (is_name_char(c)) {
        sequence.push_back(GrammarBuilder::ref(builder_.rule(parse_name("a rule name"))));
      } else {
        error(fmt::format("unexpected character '{}'", c));
      }
      skip_space();
    }
    return sequence;
  }

  // sequence[from, end) is the element the repetition at pos_ applies to.
  void apply_repetition(Sequence& sequence, size_t from) {
    const Sequence element(sequence.begin() + static_cast<ptrdiff_t>(from), sequence.end());
    sequence.resize(from);
    const char c = peek();
    ++pos_;
    int32_t min_count = 0, max_count = -1;  // -1: unbounded
    if (c == '+') {
      min_count = 1;
    } else if (c == '?') {
      max_count = 1;
    } else if (c == '{') {
      skip_space();
      min_count = parse_count();
      skip_space();
      max_count = min_count;
      if (peek() == ',') {
        ++pos_;
        skip_space();
        max_count = peek() == '}' ? -1 : parse_count();
        skip_space();
      }
      if (peek() != '}') error("expected '}' closing a repetition");
      ++pos_;
      if (max_count >= 0 && max_count < min_count) error(fmt::format("repetition {{{},{}}} has max < min", min_count, max_count));
    }
    for (int32_t i = 0; i < min_count; ++i) sequence.insert(sequence.end(), element.begin(), element.end());
    if (max_count == -1) {
      // star ::= element star | (empty)
      const int32_t star = builder_.fresh_rule("star");
      Sequence repeat = element;
      repeat.push_back(GrammarBuilder::ref(star));
      builder_.define(star, {repeat, Sequence{}});
      sequence.push_back(GrammarBuilder::ref(star));
      return;
    }
    // At most n more: opt_k ::= element opt_{k-1} | (empty), nested so no prefix is ambiguous.
    int32_t tail = -1;
    for (int32_t k = 0; k < max_count - min_count; ++k) {
      const int32_t optional = builder_.fresh_rule("opt");
      Sequence present = element;
      if (tail >= 0) present.push_back(GrammarBuilder::ref(tail));
      builder_.define(optional, {present, Sequence{}});
      tail = optional;
    }
    if (tail >= 0) sequence.push_back(GrammarBuilder::ref(tail));
  }

  int32_t parse_count() {
    const size_t start = pos_;
    int64_t value = 0;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      value = value * 10 + (peek() - '0');
      if (value > kMaxGbnfRepetition) error_at(start, fmt::format("repetition count beyond {}", kMaxGbnfRepetition));
      ++pos_;
    }
    if (pos_ == start) error("expected a repetition count");
    return static_cast<int32_t>(value);
  }

  void parse_class(Sequence& sequence) {
    ++pos_;  // '['
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    while (peek() != ']') {
      if (at_end()) error("unterminated character class");
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < text_.size()) {
        ++pos_;
        hi = parse_char();
        if (hi < lo) error("character range is out of order");
      }
      ranges.emplace_back(lo, hi);
    }
    ++pos_;
    if (ranges.empty() && !negated) error("empty character class");
    builder_.append_code_points(sequence, ranges, negated);
  }

  // One code point of a literal or class: UTF-8 or an escape.
  uint32_t parse_char() {
    const unsigned char c = static_cast<unsigned char>(peek());
    if (c == '\\') {
      ++pos_;
      const char e = peek();
      ++pos_;
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': return static_cast<uint8_t>(e);
        case 'x': return parse_hex(2);
        case 'u': return parse_hex(4);
        case 'U': return parse_hex(8);
        default: error_at(pos_ - 2, fmt::format("unknown escape '\\{}'", e));
      }
    }
    // UTF-8 decode.
    int length = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (length == 0 || pos_ + static_cast<size_t>(length) > text_.size()) error("invalid UTF-8 in the grammar");
    uint32_t cp = length == 1 ? c : c & (0x7F >> length);
    for (int i = 1; i < length; ++i) {
      const unsigned char next = static_cast<unsigned char>(text_[pos_ + static_cast<size_t>(i)]);
      if ((next & 0xC0) != 0x80) error("invalid UTF-8 in the grammar");
      cp = (cp << 6) | (next & 0x3F);
    }
    pos_ += static_cast<size_t>(length);
    return cp;
  }

  uint32_t parse_hex(int digits) {
    uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = peek();
      if (!std::isxdigit(static_cast<unsigned char>(h))) error(fmt::format("expected {} hex digits", digits));
      value = value * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      ++pos_;
    }
    if (value > 0x10FFFF) error("code point beyond U+10FFFF");
    return value;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
  int32_t depth_ = 0;  // ( ) groups open at pos_
  GrammarBuilder builder_;
};

}  // namespace

Grammar parse_gbnf(std::string_view text, const std::string& root) { return GbnfParser(text).parse(root); }

}  // namespace splitflow::grammar
