#include "grammar/regex.h"

#include "grammar/gbnf.h"

#include <fmt/format.h>

#include <cctype>

namespace splitflow::grammar {

namespace {

// A code point written so that GBNF reads it back as itself, in a literal or a class.
std::string gbnf_char(uint32_t cp) {
  if (cp == '"' || cp == '\\' || cp == '[' || cp == ']' || cp == '-' || cp == '^') return fmt::format("\\{}", static_cast<char>(cp));
  if (cp >= 0x20 && cp < 0x7F) return std::string(1, static_cast<char>(cp));
  if (cp <= 0xFFFF) return fmt::format("\\u{:04X}", cp);
  return fmt::format("\\U{:08X}", cp);
}

constexpr const char* kDigit = "0-9";
constexpr const char* kWord = "a-zA-Z0-9_";
constexpr const char* kSpace = " \\t\\n\\r\\u000B\\u000C";

class RegexTranslator {
 public:
  explicit RegexTranslator(std::string_view pattern) : pattern_(pattern) {}

  std::string translate() {
    if (peek() == '^') ++pos_;
    std::string out = alternation();
    if (pos_ < pattern_.size()) error(peek() == ')' ? "unmatched ')'" : "unexpected character");
    return out;
  }

 private:
  [[noreturn]] void error(const std::string& message) const {
    throw GrammarError(fmt::format("regex, at offset {}: {}", pos_, message));
  }
  char peek(size_t ahead = 0) const { return pos_ + ahead < pattern_.size() ? pattern_[pos_ + ahead] : '\0'; }
  bool at_end() const { return pos_ >= pattern_.size(); }

  std::string alternation() {
    std::string out = "(" + sequence();
    while (peek() == '|') {
      ++pos_;
      out += " | " + sequence();
    }
    return out + ")";
  }

  std::string sequence() {
    std::string out;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$' && (pos_ + 1 == pattern_.size() || pattern_[pos_ + 1] == ')' || pattern_[pos_ + 1] == '|')) {
        ++pos_;  // an end anchor: the output is matched whole anyway
        continue;
      }
      std::string atom_text = atom();
      atom_text += quantifier();
      out += (out.empty() ? "" : " ") + atom_text;
    }
    return out.empty() ? "\"\"" : out;
  }

  std::string quantifier() {
    std::string q;
    const char c = peek();
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      q = std::string(1, c);
    } else if (c == '{' && std::isdigit(static_cast<unsigned char>(peek(1)))) {
      const size_t start = pos_;
      while (!at_end() && peek() != '}') ++pos_;
      if (at_end()) error("unterminated {m,n} quantifier");
      ++pos_;
      q = std::string(pattern_.substr(start, pos_ - start));
      for (const char d : q.substr(1, q.size() - 2)) {
        if (!std::isdigit(static_cast<unsigned char>(d)) && d != ',' && d != ' ') error("malformed {m,n} quantifier");
      }
    } else {
      return "";
    }
    if (peek() == '?' || peek() == '+') ++pos_;  // lazy / possessive: the same language
    if (peek() == '*' || peek() == '+' || peek() == '?' || (peek() == '{' && std::isdigit(static_cast<unsigned char>(peek(1))))) {
      error("a quantifier follows a quantifier");
    }
    return q;
  }

  std::string atom() {
    const char c = peek();
    if (c == '(') {
      ++pos_;
      if (peek() == '?') {
        ++pos_;
        if (peek() == ':') {
          ++pos_;
        } else if (peek() == 'P' && peek(1) == '<') {
          pos_ += 2;
          skip_group_name();
        } else if (peek() == '<' && peek(1) != '=' && peek(1) != '!') {
          ++pos_;
          skip_group_name();
        } else if (peek() == '=' || peek() == '!' || peek() == '<') {
          error("lookahead and lookbehind are not supported");
        } else {
          error("inline flags and other (?...) groups are not supported");
        }
      }
      // Each level recurses here, and its GBNF twice as deep in parse_gbnf: a cap keeps both off the
      // end of the stack.
      if (++depth_ > kMaxNesting) error(fmt::format("groups nest deeper than {} levels", kMaxNesting));
      std::string inner = alternation();
      --depth_;
      if (peek() != ')') error("missing ')'");
      ++pos_;
      return inner;
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++pos_;
      return "[^\\n]";
    }
    if (c == '^') error("'^' is only supported at the start");
    if (c == '$') error("'$' is only supported at the end");
    if (c == '*' || c == '+' || c == '?') error(fmt::format("'{}' repeats nothing", c));
    if (c == '\\') {
      ++pos_;
      const char e = peek();
      ++pos_;
      switch (e) {
        case 'd': return fmt::format("[{}]", kDigit);
        case 'D': return fmt::format("[^{}]", kDigit);
        case 'w': return fmt::format("[{}]", kWord);
        case 'W': return fmt::format("[^{}]", kWord);
        case 's': return fmt::format("[{}]", kSpace);
        case 'S': return fmt::format("[^{}]", kSpace);
        default: --pos_; --pos_; break;
      }
      return "\"" + gbnf_char(escaped_char()) + "\"";
    }
    return "\"" + gbnf_char(literal_char()) + "\"";
  }

  void skip_group_name() {
    while (!at_end() && peek() != '>') ++pos_;
    if (at_end()) error("unterminated group name");
    ++pos_;
  }

  // A code point at pos_ (UTF-8).
  uint32_t literal_char() {
    const unsigned char c = static_cast<unsigned char>(peek());
    const int length = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (length == 0 || pos_ + static_cast<size_t>(length) > pattern_.size()) error("invalid UTF-8");
    uint32_t cp = length == 1 ? c : c & (0x7F >> length);
    for (int i = 1; i < length; ++i) cp = (cp << 6) | (static_cast<unsigned char>(pattern_[pos_ + static_cast<size_t>(i)]) & 0x3F);
    pos_ += static_cast<size_t>(length);
    return cp;
  }

  // An escape at pos_ ('\\' included) that stands for one code point.
  uint32_t escaped_char() {
    ++pos_;  // '\\'
    if (at_end()) error("trailing backslash");
    const char e = peek();
    ++pos_;
    switch (e) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'b': error("word boundaries (\\b) are not supported");
      case 'B': error("\\B is not supported");
      case 'A': case 'Z': case 'z': error(fmt::format("\\{} anchors are not supported", e));
      default: break;
    }
    if (std::isdigit(static_cast<unsigned char>(e))) error("backreferences are not supported");
    if (std::isalnum(static_cast<unsigned char>(e))) error(fmt::format("unknown escape '\\{}'", e));
    --pos_;
    return literal_char();
  }

  uint32_t hex(int digits) {
    uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = peek();
      if (!std::isxdigit(static_cast<unsigned char>(h))) error(fmt::format("expected {} hex digits", digits));
      value = value * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
      ++pos_;
    }
    return value;
  }

  std::string char_class() {
    ++pos_;  // '['
    std::string out = "[";
    if (peek() == '^') {
      out += "^";
      ++pos_;
    }
    bool first = true;
    while (first || peek() != ']') {
      if (at_end()) error("unterminated character class");
      first = false;
      if (peek() == '\\' && (peek(1) == 'd' || peek(1) == 'w' || peek(1) == 's')) {
        out += peek(1) == 'd' ? kDigit : peek(1) == 'w' ? kWord : kSpace;
        pos_ += 2;
        continue;
      }
      if (peek() == '\\' && (peek(1) == 'D' || peek(1) == 'W' || peek(1) == 'S')) {
        error(fmt::format("\\{} inside a character class is not supported", peek(1)));
      }
      if (peek() == '[' && peek(1) == ':') error("POSIX classes ([:alpha:]) are not supported");
      const uint32_t lo = peek() == '\\' ? escaped_char() : literal_char();
      out += gbnf_char(lo);
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < pattern_.size()) {
        ++pos_;
        const uint32_t hi = peek() == '\\' ? escaped_char() : literal_char();
        if (hi < lo) error("character range is out of order");
        out += "-" + gbnf_char(hi);
      }
    }
    ++pos_;
    return out + "]";
  }

  std::string_view pattern_;
  size_t pos_ = 0;
  static constexpr int kMaxNesting = 200;
  int depth_ = 0;  // groups open at pos_
};

}  // namespace

std::string regex_to_gbnf(std::string_view pattern) { return RegexTranslator(pattern).translate(); }

Grammar compile_regex(std::string_view pattern) { return parse_gbnf("root ::= " + regex_to_gbnf(pattern) + "\n"); }

}  // namespace splitflow::grammar
