#include "grammar/grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>

namespace splitflow::grammar {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// UTF-8 encoding of a scalar value.
std::vector<uint8_t> encode_utf8(uint32_t cp) {
  if (cp < 0x80) return {static_cast<uint8_t>(cp)};
  if (cp < 0x800) return {static_cast<uint8_t>(0xC0 | (cp >> 6)), static_cast<uint8_t>(0x80 | (cp & 0x3F))};
  if (cp < 0x10000) {
    return {static_cast<uint8_t>(0xE0 | (cp >> 12)), static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F)),
            static_cast<uint8_t>(0x80 | (cp & 0x3F))};
  }
  return {static_cast<uint8_t>(0xF0 | (cp >> 18)), static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F)),
          static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F)), static_cast<uint8_t>(0x80 | (cp & 0x3F))};
}

// The algorithm of Rust's regex-syntax utf8 module: split [lo, hi] until both ends encode to the
// same length and every continuation byte position spans its full range below the first one that
// differs, so the per-position byte ranges match exactly the range's encodings.
void split_utf8(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  if (lo > hi) return;
  if (lo <= 0xD7FF && hi >= 0xD800) {  // surrogates are not scalar values
    split_utf8(lo, 0xD7FF, out);
    split_utf8(0xE000, hi, out);
    return;
  }
  if (lo >= 0xD800 && hi <= 0xDFFF) return;
  if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
  if (hi >= 0xD800 && hi <= 0xDFFF) hi = 0xD7FF;
  if (lo > hi) return;
  for (const uint32_t boundary : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= boundary && hi > boundary) {
      split_utf8(lo, boundary, out);
      split_utf8(boundary + 1, hi, out);
      return;
    }
  }
  if (hi <= 0x7F) {
    out.push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t mask = (1u << (6 * i)) - 1;
    if ((lo & ~mask) != (hi & ~mask)) {
      if ((lo & mask) != 0) {
        split_utf8(lo, lo | mask, out);
        split_utf8((lo | mask) + 1, hi, out);
        return;
      }
      if ((hi & mask) != mask) {
        split_utf8(lo, (hi & ~mask) - 1, out);
        split_utf8(hi & ~mask, hi, out);
        return;
      }
    }
  }
  const std::vector<uint8_t> a = encode_utf8(lo), b = encode_utf8(hi);
  std::vector<std::pair<uint8_t, uint8_t>> sequence;
  for (size_t k = 0; k < a.size(); ++k) sequence.emplace_back(a[k], b[k]);
  out.push_back(std::move(sequence));
}

}  // namespace

std::vector<std::vector<std::pair<uint8_t, uint8_t>>> utf8_sequences(uint32_t lo, uint32_t hi) {
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> out;
  split_utf8(lo, std::min(hi, kMaxCodePoint), out);
  return out;
}

int32_t GrammarBuilder::rule(const std::string& name) {
  const auto it = rule_ids_.find(name);
  if (it != rule_ids_.end()) return it->second;
  rule_ids_.emplace(name, grammar_.num_rules());
  grammar_.rule_names.push_back(name);
  grammar_.rule_alternatives.emplace_back();
  defined_.push_back(false);
  pending_.emplace_back();
  return grammar_.num_rules() - 1;
}

int32_t GrammarBuilder::fresh_rule(const std::string& base) {
  for (int i = 1;; ++i) {
    const std::string name = fmt::format("{}-{}", base, i);
    if (!rule_ids_.contains(name)) return rule(name);
  }
}

Symbol GrammarBuilder::byte_class(const ByteSet& set) {
  const auto it = std::find(grammar_.byte_classes.begin(), grammar_.byte_classes.end(), set);
  if (it != grammar_.byte_classes.end()) return {SymbolKind::Bytes, static_cast<int32_t>(it - grammar_.byte_classes.begin())};
  grammar_.byte_classes.push_back(set);
  return {SymbolKind::Bytes, static_cast<int32_t>(grammar_.byte_classes.size() - 1)};
}

void GrammarBuilder::append_literal(Sequence& sequence, const std::string& literal) {
  for (const char c : literal) {
    ByteSet set;
    set.set(static_cast<uint8_t>(c));
    sequence.push_back(byte_class(set));
  }
}

void GrammarBuilder::append_code_points(Sequence& sequence, std::vector<std::pair<uint32_t, uint32_t>> ranges,
                                        bool negated) {
  for (auto& [lo, hi] : ranges) {
    if (lo > hi) std::swap(lo, hi);
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& range : ranges) {
    if (!merged.empty() && range.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, range.second);
    } else {
      merged.push_back(range);
    }
  }
  if (negated) {
    std::vector<std::pair<uint32_t, uint32_t>> complement;
    uint32_t next = 0;
    for (const auto& [lo, hi] : merged) {
      if (lo > next) complement.emplace_back(next, lo - 1);
      next = hi + 1;
    }
    if (next <= kMaxCodePoint) complement.emplace_back(next, kMaxCodePoint);
    merged = std::move(complement);
  }
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> byte_sequences;
  for (const auto& [lo, hi] : merged) split_utf8(lo, std::min(hi, kMaxCodePoint), byte_sequences);
  if (byte_sequences.empty()) throw GrammarError("a character class matches no character");

  // Sequences that differ only in their first byte range share it: [a-z] stays one byte class,
  // and so does any ASCII-only class.
  auto to_symbols = [&](const std::vector<std::pair<uint8_t, uint8_t>>& byte_ranges) {
    Sequence symbols;
    for (const auto& [lo, hi] : byte_ranges) {
      ByteSet set;
      set.set_range(lo, hi);
      symbols.push_back(byte_class(set));
    }
    return symbols;
  };
  ByteSet single_bytes;
  std::vector<Sequence> alternatives;
  for (const auto& byte_ranges : byte_sequences) {
    if (byte_ranges.size() == 1) {
      single_bytes.set_range(byte_ranges[0].first, byte_ranges[0].second);
    } else {
      alternatives.push_back(to_symbols(byte_ranges));
    }
  }
  if (single_bytes != ByteSet{}) alternatives.insert(alternatives.begin(), Sequence{byte_class(single_bytes)});
  if (alternatives.size() == 1) {
    sequence.insert(sequence.end(), alternatives[0].begin(), alternatives[0].end());
    return;
  }
  const int32_t rule_id = fresh_rule("char");
  define(rule_id, alternatives);
  sequence.push_back(ref(rule_id));
}

void GrammarBuilder::define(int32_t rule_id, const std::vector<Sequence>& alternatives) {
  if (defined_[rule_id]) throw GrammarError(fmt::format("rule '{}' is defined twice", grammar_.rule_names[rule_id]));
  defined_[rule_id] = true;
  pending_[rule_id] = alternatives;
}

Grammar GrammarBuilder::finish(const std::string& root) {
  const auto root_it = rule_ids_.find(root);
  if (root_it == rule_ids_.end() || !defined_[root_it->second]) {
    throw GrammarError(fmt::format("the grammar has no '{}' rule to start from", root));
  }
  grammar_.root_rule = root_it->second;
  const int32_t rules = grammar_.num_rules();
  for (int32_t r = 0; r < rules; ++r) {
    for (const Sequence& alternative : pending_[r]) {
      for (const Symbol& symbol : alternative) {
        if (symbol.kind == SymbolKind::Rule && !defined_[symbol.value]) {
          throw GrammarError(fmt::format("rule '{}' refers to undefined rule '{}'", grammar_.rule_names[r],
                                         grammar_.rule_names[symbol.value]));
        }
      }
    }
  }

  // Nullable rules (may match the empty string), to a fixed point.
  std::vector<bool> nullable(rules, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r = 0; r < rules; ++r) {
      if (nullable[r]) continue;
      for (const Sequence& alternative : pending_[r]) {
        const bool empty = std::all_of(alternative.begin(), alternative.end(), [&](const Symbol& s) {
          return s.kind == SymbolKind::Rule && nullable[s.value];
        });
        if (empty) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  // Rule r reaches rule s without consuming a byte when s starts an alternative of r after only
  // nullable rules. A cycle in that graph would make the matcher's expansion loop forever.
  std::vector<std::vector<int32_t>> reaches(rules);
  for (int32_t r = 0; r < rules; ++r) {
    for (const Sequence& alternative : pending_[r]) {
      for (const Symbol& symbol : alternative) {
        if (symbol.kind != SymbolKind::Rule) break;
        reaches[r].push_back(symbol.value);
        if (!nullable[symbol.value]) break;
      }
    }
  }
  // Depth first with a stack of its own: a chain of rules as long as the grammar is no deeper here.
  std::vector<int8_t> color(rules, 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<int32_t, size_t>> path;  // (rule, next edge of reaches[rule])
  for (int32_t start = 0; start < rules; ++start) {
    if (color[start] != 0) continue;
    color[start] = 1;
    path.emplace_back(start, 0);
    while (!path.empty()) {
      auto& [r, edge] = path.back();
      if (edge == reaches[r].size()) {
        color[r] = 2;
        path.pop_back();
        continue;
      }
      const int32_t s = reaches[r][edge++];
      if (color[s] == 1) {
        throw GrammarError(fmt::format(
            "rule '{}' can reach itself without matching a character (left recursion, or a repetition of something "
            "that may be empty); rewrite it right-recursively",
            grammar_.rule_names[s]));
      }
      if (color[s] == 0) {
        color[s] = 1;
        path.emplace_back(s, 0);
      }
    }
  }

  for (int32_t r = 0; r < rules; ++r) {
    for (const Sequence& alternative : pending_[r]) {
      grammar_.rule_alternatives[r].push_back(static_cast<int32_t>(grammar_.symbols.size()));
      grammar_.symbols.insert(grammar_.symbols.end(), alternative.begin(), alternative.end());
      grammar_.symbols.push_back({SymbolKind::End, 0});
    }
  }
  return std::move(grammar_);
}

}  // namespace splitflow::grammar
