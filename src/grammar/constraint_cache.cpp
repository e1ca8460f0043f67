#include "grammar/constraint_cache.h"

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace splitflow::grammar {

std::string constraint_gbnf(ConstraintKind kind, const std::string& text) {
  switch (kind) {
    case ConstraintKind::JsonObject: return json_object_gbnf();
    case ConstraintKind::JsonSchema: return json_schema_to_gbnf(nlohmann::ordered_json::parse(text));
    case ConstraintKind::Regex: return "root ::= " + regex_to_gbnf(text) + "\n";
    case ConstraintKind::Gbnf: return text;
  }
  return text;
}

ConstraintCache::ConstraintCache(const Tokenizer& tokenizer, int32_t model_vocab_size, size_t capacity)
    : tokenizer_(tokenizer), model_vocab_size_(model_vocab_size), capacity_(capacity) {}

const std::shared_ptr<const TokenVocabulary>& ConstraintCache::vocabulary() {
  std::lock_guard lock(mutex_);
  if (!vocabulary_) vocabulary_ = std::make_shared<TokenVocabulary>(tokenizer_);
  return vocabulary_;
}

std::shared_ptr<const CompiledGrammar> ConstraintCache::lookup(const std::string& key) {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  order_.splice(order_.begin(), order_, it->second.second);
  return it->second.first;
}

void ConstraintCache::insert(const std::string& key, std::shared_ptr<const CompiledGrammar> compiled) {
  std::lock_guard lock(mutex_);
  if (entries_.contains(key)) return;
  order_.push_front(key);
  entries_.emplace(key, std::pair(std::move(compiled), order_.begin()));
  while (entries_.size() > capacity_) {
    entries_.erase(order_.back());
    order_.pop_back();
  }
}

std::shared_ptr<const CompiledGrammar> ConstraintCache::get(ConstraintKind kind, const std::string& text) {
  const std::string key = std::to_string(static_cast<int>(kind)) + ":" + text;
  if (auto found = lookup(key)) return found;
  auto grammar = std::make_shared<const Grammar>(parse_gbnf(constraint_gbnf(kind, text)));
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(grammar), vocabulary(), model_vocab_size_);
  insert(key, compiled);
  return compiled;
}

std::shared_ptr<const CompiledGrammar> ConstraintCache::get_gbnf(const std::string& key, const std::string& gbnf) {
  const std::string full_key = "tools:" + key;
  if (auto found = lookup(full_key)) return found;
  auto grammar = std::make_shared<const Grammar>(parse_gbnf(gbnf));
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(grammar), vocabulary(), model_vocab_size_);
  insert(full_key, compiled);
  return compiled;
}

}  // namespace splitflow::grammar
