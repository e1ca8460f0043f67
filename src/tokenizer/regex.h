// tokenizer/regex.h — pre-tokenizer regexes on PCRE2 (UTF + UCP, JIT-compiled where the platform
// has a JIT). Patterns come from tokenizer.json files (written for Oniguruma) and llama.cpp's
// pre-tokenizer table; both use the PCRE-compatible subset.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace splitflow {

class Regex {
 public:
  // `origin` names where the pattern came from, for error messages.
  Regex(const std::string& pattern, const std::string& origin);
  // Non-overlapping matches, left to right, as byte ranges [first, second). `text` must be valid
  // UTF-8. Lookarounds and anchors see only `text`.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Compiled;
  std::string pattern_;
  std::string origin_;
  std::shared_ptr<const Compiled> compiled_;
};

// A regex that matches `literal` exactly (every metacharacter escaped).
std::string regex_escape(std::string_view literal);

}  // namespace splitflow
