#include "grammar/token_mask.h"

#include "core/error.h"

#include <algorithm>

namespace splitflow::grammar {

namespace {

bool complete_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t length = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (length == 0 || i + length > s.size()) return false;
    for (size_t k = 1; k < length; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += length;
  }
  return true;
}

}  // namespace

TokenVocabulary::TokenVocabulary(const Tokenizer& tokenizer) {
  const int32_t vocab = tokenizer.vocab_size();
  bytes_.resize(static_cast<size_t>(vocab));
  for (int32_t id = 0; id < vocab; ++id) {
    if (!tokenizer.is_special(id)) bytes_[id] = tokenizer.token_bytes(id);
  }
  // Whether a decode drops the leading space of its first piece: ask the tokenizer about a
  // token that is a space followed by complete text.
  for (int32_t id = 0; id < vocab; ++id) {
    const std::string& b = bytes_[id];
    if (b.size() < 2 || b[0] != ' ' || b[1] == ' ' || !complete_utf8(b)) continue;
    strips_first_leading_space_ = tokenizer.decode({id}, /*skip_special=*/true) == b.substr(1);
    break;
  }
  build();
}

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes, bool strips_first_leading_space)
    : bytes_(std::move(token_bytes)), strips_first_leading_space_(strips_first_leading_space) {
  build();
}

void TokenVocabulary::build() {
  trie_ = std::make_unique<TokenTrie>(bytes_);
  if (!strips_first_leading_space_) return;
  first_bytes_ = bytes_;
  for (std::string& b : first_bytes_) {
    if (!b.empty() && b[0] == ' ') b.erase(0, 1);
  }
  first_trie_ = std::make_unique<TokenTrie>(first_bytes_);
}

size_t CompiledGrammar::KeyHash::operator()(const std::vector<int32_t>& key) const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const int32_t v : key) h = (h ^ static_cast<uint32_t>(v)) * 0x100000001b3ull;
  return static_cast<size_t>(h);
}

CompiledGrammar::CompiledGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocabulary,
                                 int32_t model_vocab_size)
    : grammar_(std::move(grammar)),
      vocabulary_(std::move(vocabulary)),
      mask_words_(static_cast<size_t>(std::max(model_vocab_size, vocabulary_->vocab_size()) + 31) / 32) {}

std::unique_ptr<TokenConstraint> CompiledGrammar::start() const {
  return std::make_unique<GrammarConstraint>(shared_from_this());
}

MaskCacheStats CompiledGrammar::cache_stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CompiledGrammar::fill_mask(GrammarMatcher& matcher, bool first, std::span<uint32_t> mask_words) const {
  const bool first_differs = first && vocabulary_->strips_first_leading_space();
  std::vector<int32_t> key = matcher.state_key();
  key.push_back(first_differs ? 1 : 0);
  {
    std::lock_guard lock(mutex_);
    const auto it = masks_.find(key);
    if (it != masks_.end()) {
      ++stats_.hits;
      const std::vector<uint32_t>& mask = *it->second;
      std::copy_n(mask.begin(), std::min(mask.size(), mask_words.size()), mask_words.begin());
      return;
    }
    ++stats_.misses;
  }
  // Computed outside the lock: two sequences missing the same state compute it twice, which is
  // cheaper than making every other grammar user wait.
  auto mask = std::make_shared<std::vector<uint32_t>>(mask_words_, 0u);
  matcher.fill_token_mask(first_differs ? vocabulary_->first_trie() : vocabulary_->trie(), *mask);
  std::copy_n(mask->begin(), std::min(mask->size(), mask_words.size()), mask_words.begin());
  std::lock_guard lock(mutex_);
  if (masks_.size() >= kMaxCachedMasks) masks_.clear();  // a grammar with unbounded states: start over
  masks_.emplace(std::move(key), std::move(mask));
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<const CompiledGrammar> compiled)
    : compiled_(std::move(compiled)), matcher_(compiled_->grammar_ptr()) {}

void GrammarConstraint::fill_next_token_mask(std::span<uint32_t> mask_words) {
  std::fill(mask_words.begin(), mask_words.end(), 0u);
  compiled_->fill_mask(matcher_, tokens_accepted_ == 0, mask_words);
}

void GrammarConstraint::accept_token(int32_t token_id) {
  const TokenVocabulary& vocabulary = compiled_->vocabulary();
  SF_CHECK(token_id >= 0 && token_id < vocabulary.vocab_size(),
           "constrained decoding: token {} is outside the tokenizer's vocabulary", token_id);
  const std::string& bytes = tokens_accepted_ == 0 ? vocabulary.first_bytes(token_id) : vocabulary.bytes(token_id);
  SF_CHECK(!bytes.empty() && matcher_.advance(bytes),
           "constrained decoding: token {} does not continue the grammar here", token_id);
  ++tokens_accepted_;
}

}  // namespace splitflow::grammar
