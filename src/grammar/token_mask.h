// grammar/token_mask.h — a Grammar joined to a vocabulary: the engine's TokenConstraintSpec.
//
// TokenVocabulary holds each token's bytes (Tokenizer::token_bytes; special tokens left out, so
// no mask allows them) in a trie, built once per tokenizer. SentencePiece-style tokenizers drop
// the leading space of the first piece of a decode; the engine's text of a sequence is such a
// decode, so the first generated token is matched by its bytes without that space (a second trie).
//
// CompiledGrammar caches masks by matcher state (GrammarMatcher::state_key): JSON and most
// grammars revisit a few states over and over (inside a string, after a comma), so after the
// first requests a step costs a hash lookup and a copy of ceil(vocab / 32) words.
#pragma once

#include "engine/token_constraint.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace splitflow::grammar {

class TokenVocabulary {
 public:
  explicit TokenVocabulary(const Tokenizer& tokenizer);
  // From token bytes directly (tests, benches); an empty string leaves a token out.
  TokenVocabulary(std::vector<std::string> token_bytes, bool strips_first_leading_space);

  int32_t vocab_size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  // The bytes a token adds when it is the first of the generated text.
  const std::string& first_bytes(int32_t id) const { return strips_first_leading_space_ ? first_bytes_[id] : bytes_[id]; }
  const TokenTrie& trie() const { return *trie_; }
  const TokenTrie& first_trie() const { return strips_first_leading_space_ ? *first_trie_ : *trie_; }
  bool strips_first_leading_space() const { return strips_first_leading_space_; }

 private:
  void build();

  std::vector<std::string> bytes_;
  std::vector<std::string> first_bytes_;
  bool strips_first_leading_space_ = false;
  std::unique_ptr<TokenTrie> trie_;
  std::unique_ptr<TokenTrie> first_trie_;
};

struct MaskCacheStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
};

class CompiledGrammar : public TokenConstraintSpec, public std::enable_shared_from_this<CompiledGrammar> {
 public:
  // mask_words: the engine's mask width, ceil(model vocab / 32) (the model's vocabulary may be
  // padded past the tokenizer's; those tokens are never allowed).
  CompiledGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocabulary,
                  int32_t model_vocab_size);

  std::unique_ptr<TokenConstraint> start() const override;

  const Grammar& grammar() const { return *grammar_; }
  const std::shared_ptr<const Grammar>& grammar_ptr() const { return grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  size_t mask_words() const { return mask_words_; }
  MaskCacheStats cache_stats() const;

  // The cached mask of a state (first: the first generated token), computing it on a miss.
  void fill_mask(GrammarMatcher& matcher, bool first, std::span<uint32_t> mask_words) const;

  static constexpr size_t kMaxCachedMasks = 8192;  // x 6 KiB for a 49k vocabulary

 private:
  struct KeyHash {
    size_t operator()(const std::vector<int32_t>& key) const;
  };
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  size_t mask_words_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::vector<int32_t>, std::shared_ptr<const std::vector<uint32_t>>, KeyHash> masks_;
  mutable MaskCacheStats stats_;
};

// One sequence's matcher over a CompiledGrammar.
class GrammarConstraint : public TokenConstraint {
 public:
  explicit GrammarConstraint(std::shared_ptr<const CompiledGrammar> compiled);
  void fill_next_token_mask(std::span<uint32_t> mask_words) override;
  bool can_end() const override { return matcher_.can_end(); }
  void accept_token(int32_t token_id) override;
  const GrammarMatcher& matcher() const { return matcher_; }

 private:
  std::shared_ptr<const CompiledGrammar> compiled_;
  GrammarMatcher matcher_;
  int64_t tokens_accepted_ = 0;
};

}  // namespace splitflow::grammar
