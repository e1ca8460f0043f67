// grammar/constraint_cache.h — the compiled constraints of a server, one per distinct source:
// requests that ask for the same schema, regex or grammar share one CompiledGrammar and so its
// mask cache. The vocabulary's token trie is built once, on the first constrained request.
#pragma once

#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace splitflow::grammar {

enum class ConstraintKind : uint8_t {
  JsonObject,  // response_format {"type": "json_object"}: text is ignored
  JsonSchema,  // text: the schema (JSON)
  Regex,       // text: the pattern
  Gbnf,        // text: the grammar
};

class ConstraintCache {
 public:
  // model_vocab_size: the logits' width (may exceed the tokenizer's vocabulary).
  ConstraintCache(const Tokenizer& tokenizer, int32_t model_vocab_size, size_t capacity = 256);

  // Compiles (or finds) the constraint; throws GrammarError naming what is wrong or unsupported.
  std::shared_ptr<const CompiledGrammar> get(ConstraintKind kind, const std::string& text);
  // A GBNF grammar built by the caller (tool calls), cached under `key`.
  std::shared_ptr<const CompiledGrammar> get_gbnf(const std::string& key, const std::string& gbnf);

  const std::shared_ptr<const TokenVocabulary>& vocabulary();

 private:
  std::shared_ptr<const CompiledGrammar> lookup(const std::string& key);
  void insert(const std::string& key, std::shared_ptr<const CompiledGrammar> compiled);

  const Tokenizer& tokenizer_;
  int32_t model_vocab_size_;
  size_t capacity_;
  std::mutex mutex_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::list<std::string> order_;  // most recently used first
  std::unordered_map<std::string, std::pair<std::shared_ptr<const CompiledGrammar>, std::list<std::string>::iterator>> entries_;
};

// The GBNF text of a constraint source (no vocabulary needed).
std::string constraint_gbnf(ConstraintKind kind, const std::string& text);

}  // namespace splitflow::grammar
