// grammar/grammar.h — the grammar module: structured outputs as a token-level constrained decoder.
//
// Owns: the byte-level context-free grammar every constraint compiles to (`Grammar`, below); its
// sources (llama.cpp's GBNF text: gbnf.h; a regular expression: regex.h; a JSON schema or
// "any JSON object": json_schema.h); the incremental matcher over bytes (matcher.h); the token
// mask over a vocabulary from the tokenizer's decoded token bytes and a token trie, with a mask
// cache per compiled grammar (token_mask.h); the cache of compiled grammars keyed by their source
// (constraint_cache.h), which is what the engine's TokenConstraint hook receives.
// Must never: run a model, sample, see logits or device memory (the engine applies the masks),
// or accept a schema feature it cannot enforce (it is refused by name instead).
//
// The grammar is over bytes, not code points: a character class of the source is compiled to the
// UTF-8 byte sequences of its code points, so a token that ends inside a multi-byte character is
// matched exactly as far as it goes.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace splitflow::grammar {

// A grammar that cannot be compiled (GBNF syntax, an undefined rule, left recursion, a schema
// feature or regex construct not supported). The message names the place or the feature.
class GrammarError : public std::runtime_error {
 public:
  explicit GrammarError(const std::string& message) : std::runtime_error(message) {}
};

// A set of bytes (bit b of word b / 64).
struct ByteSet {
  std::array<uint64_t, 4> words{};
  bool test(uint8_t b) const { return (words[b >> 6] >> (b & 63)) & 1; }
  void set(uint8_t b) { words[b >> 6] |= uint64_t{1} << (b & 63); }
  void set_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) set(static_cast<uint8_t>(b));
  }
  ByteSet& operator|=(const ByteSet& other) {
    for (int i = 0; i < 4; ++i) words[i] |= other.words[i];
    return *this;
  }
  bool operator==(const ByteSet&) const = default;
};

enum class SymbolKind : uint8_t {
  Bytes,  // one byte of byte_classes[value]
  Rule,   // the rule `value`
  End,    // end of an alternative
};

struct Symbol {
  SymbolKind kind;
  int32_t value;
};

// Every rule's alternatives are runs of `symbols` ending in an End symbol; a position is an index
// into `symbols`. No rule reaches itself without consuming a byte (checked by validate()), so a
// matcher's expansion of a position always terminates.
struct Grammar {
  std::vector<Symbol> symbols;
  std::vector<std::vector<int32_t>> rule_alternatives;  // (rules) start positions of its alternatives
  std::vector<std::string> rule_names;                  // (rules) for error messages
  std::vector<ByteSet> byte_classes;
  int32_t root_rule = -1;

  int32_t num_rules() const { return static_cast<int32_t>(rule_alternatives.size()); }
};

// Builds a Grammar rule by rule. Rules may be referenced before they are defined.
class GrammarBuilder {
 public:
  // The id of the rule named `name`, created (undefined) when new.
  int32_t rule(const std::string& name);
  // A new rule with a unique name derived from `base` (for groups and repetitions).
  int32_t fresh_rule(const std::string& base);
  bool defined(int32_t rule) const { return defined_[rule]; }
  const std::string& name(int32_t rule) const { return grammar_.rule_names[rule]; }

  // One alternative of a rule under construction: a sequence of symbols.
  using Sequence = std::vector<Symbol>;
  Symbol byte_class(const ByteSet& set);
  static Symbol ref(int32_t rule) { return {SymbolKind::Rule, rule}; }
  // Appends the bytes of `literal` to `sequence`, one class each.
  void append_literal(Sequence& sequence, const std::string& literal);
  // Appends a symbol matching one code point of `ranges` (inclusive pairs; negated: any code point
  // outside them), as its UTF-8 byte sequences (a rule of alternatives when it needs several).
  void append_code_points(Sequence& sequence, std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated);

  // Defines `rule` with these alternatives; a rule is defined once.
  void define(int32_t rule, const std::vector<Sequence>& alternatives);

  // Checks every referenced rule is defined and no rule can reach itself without consuming a
  // byte; throws GrammarError naming the rule. `root` names the start rule.
  Grammar finish(const std::string& root);

 private:
  Grammar grammar_;
  std::unordered_map<std::string, int32_t> rule_ids_;
  std::vector<bool> defined_;
  std::vector<std::vector<Sequence>> pending_;  // (rules) alternatives until finish()
};

// Every UTF-8 byte sequence of the code points in [lo, hi] (surrogates excluded), each as one
// byte range per byte position: the ranges of one sequence match exactly the encodings of a
// sub-range of code points. Exposed for tests.
std::vector<std::vector<std::pair<uint8_t, uint8_t>>> utf8_sequences(uint32_t lo, uint32_t hi);

}  // namespace splitflow::grammar
