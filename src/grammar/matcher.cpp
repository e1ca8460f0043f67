#include "grammar/matcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

namespace splitflow::grammar {

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes) : vocab_size_(static_cast<int32_t>(token_bytes.size())) {
  // Built through a map-based trie, then flattened: edges of a node contiguous and sorted.
  struct BuildNode {
    std::map<uint8_t, uint32_t> children;
    std::vector<int32_t> tokens;
  };
  std::vector<BuildNode> build(1);
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    const std::string& bytes = token_bytes[id];
    if (bytes.empty()) continue;
    uint32_t at = 0;
    for (const char c : bytes) {
      const uint8_t b = static_cast<uint8_t>(c);
      auto it = build[at].children.find(b);
      if (it == build[at].children.end()) {
        build.emplace_back();
        it = build[at].children.emplace(b, static_cast<uint32_t>(build.size() - 1)).first;
      }
      at = it->second;
    }
    build[at].tokens.push_back(static_cast<int32_t>(id));
  }
  nodes_.resize(build.size());
  for (size_t n = 0; n < build.size(); ++n) {
    nodes_[n].first_edge = static_cast<uint32_t>(edges_.size());
    nodes_[n].num_edges = static_cast<uint32_t>(build[n].children.size());
    for (const auto& [byte, child] : build[n].children) edges_.push_back({byte, child});
    nodes_[n].first_token = static_cast<uint32_t>(tokens_.size());
    nodes_[n].num_tokens = static_cast<uint32_t>(build[n].tokens.size());
    tokens_.insert(tokens_.end(), build[n].tokens.begin(), build[n].tokens.end());
  }
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  std::vector<int32_t> heads;
  bool accept = false;
  for (const int32_t alternative : grammar_->rule_alternatives[grammar_->root_rule]) expand(alternative, -1, heads, accept);
  dedup(heads);
  canonicalize(heads, accept);
}

int32_t GrammarMatcher::new_node(int32_t pos, int32_t parent) {
  arena_.push_back({pos, parent});
  return static_cast<int32_t>(arena_.size() - 1);
}

void GrammarMatcher::expand(int32_t pos, int32_t parent, std::vector<int32_t>& out, bool& accept) {
  // Depth first over a stack of its own (a long run of references that may match nothing would
  // otherwise recurse as deep as it is long), in the order a recursive expansion takes: a rule's
  // alternatives first to last, each fully, then the check of what they added.
  constexpr int32_t kCheck = -1;  // pos of the entry that follows a rule's alternatives
  std::vector<std::pair<int32_t, int32_t>>& work = expand_work_;
  const size_t base = work.size();
  work.emplace_back(pos, parent);
  const std::vector<Symbol>& symbols = grammar_->symbols;
  while (work.size() > base) {
    std::tie(pos, parent) = work.back();
    work.pop_back();
    if (pos == kCheck) {
      if (out.size() > kMaxStacks) {
        work.resize(base);
        throw GrammarError(fmt::format("the grammar is too ambiguous: more than {} parses are alive at once", kMaxStacks));
      }
      continue;
    }
    for (;;) {
      const Symbol symbol = symbols[pos];
      if (symbol.kind == SymbolKind::End) {
        if (parent < 0) {
          accept = true;
          break;
        }
        pos = arena_[parent].pos;
        parent = arena_[parent].parent;
        continue;
      }
      if (symbol.kind == SymbolKind::Bytes) {
        out.push_back(new_node(pos, parent));
        break;
      }
      // A reference last in its alternative returns straight to the caller's continuation.
      const int32_t return_to = symbols[pos + 1].kind == SymbolKind::End ? parent : new_node(pos + 1, parent);
      work.emplace_back(kCheck, 0);
      const std::vector<int32_t>& alternatives = grammar_->rule_alternatives[symbol.value];
      for (auto it = alternatives.rbegin(); it != alternatives.rend(); ++it) work.emplace_back(*it, return_to);
      break;
    }
  }
}

void GrammarMatcher::dedup(std::vector<int32_t>& heads) const {
  std::sort(heads.begin(), heads.end(), [&](int32_t a, int32_t b) {
    return std::pair(arena_[a].pos, arena_[a].parent) < std::pair(arena_[b].pos, arena_[b].parent);
  });
  heads.erase(std::unique(heads.begin(), heads.end(),
                          [&](int32_t a, int32_t b) {
                            return arena_[a].pos == arena_[b].pos && arena_[a].parent == arena_[b].parent;
                          }),
              heads.end());
}

bool GrammarMatcher::step(const std::vector<int32_t>& heads, uint8_t byte, std::vector<int32_t>& out, bool& accept) {
  out.clear();
  accept = false;
  const Grammar& g = *grammar_;
  for (const int32_t head : heads) {
    const StackNode node = arena_[head];
    if (!g.byte_classes[g.symbols[node.pos].value].test(byte)) continue;
    expand(node.pos + 1, node.parent, out, accept);
  }
  if (out.size() > 1) dedup(out);
  return accept || !out.empty();
}

void GrammarMatcher::canonicalize(const std::vector<int32_t>& heads, bool accept) {
  std::vector<std::vector<int32_t>> stacks;
  stacks.reserve(heads.size());
  for (const int32_t head : heads) {
    std::vector<int32_t> stack;
    for (int32_t n = head; n >= 0; n = arena_[n].parent) stack.push_back(arena_[n].pos);
    stacks.push_back(std::move(stack));
  }
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());

  // Shared bottoms become shared nodes: interned by (pos, parent) from the bottom up.
  std::vector<StackNode> arena;
  std::map<std::pair<int32_t, int32_t>, int32_t> interned;
  heads_.clear();
  key_.clear();
  for (const std::vector<int32_t>& stack : stacks) {
    int32_t parent = -1;
    for (size_t i = stack.size(); i-- > 0;) {
      const auto [it, inserted] = interned.try_emplace({stack[i], parent}, static_cast<int32_t>(arena.size()));
      if (inserted) arena.push_back({stack[i], parent});
      parent = it->second;
    }
    heads_.push_back(parent);
    key_.insert(key_.end(), stack.begin(), stack.end());
    key_.push_back(-1);
  }
  key_.push_back(accept ? 1 : 0);
  arena_ = std::move(arena);
  accepting_ = accept;
}

bool GrammarMatcher::advance(uint8_t byte) {
  std::vector<int32_t> next;
  bool accept = false;
  if (!step(heads_, byte, next, accept)) return false;
  canonicalize(next, accept);
  return true;
}

bool GrammarMatcher::advance(std::string_view bytes) {
  std::vector<int32_t> heads = heads_, next;
  bool accept = accepting_;
  const size_t saved = arena_.size();
  for (const char c : bytes) {
    if (!step(heads, static_cast<uint8_t>(c), next, accept)) {
      arena_.resize(saved);
      return false;
    }
    heads.swap(next);
  }
  canonicalize(heads, accept);
  return true;
}

ByteSet GrammarMatcher::next_bytes() const {
  ByteSet set;
  for (const int32_t head : heads_) set |= grammar_->byte_classes[grammar_->symbols[arena_[head].pos].value];
  return set;
}

void GrammarMatcher::fill_token_mask(const TokenTrie& trie, std::span<uint32_t> mask_words) {
  const size_t saved = arena_.size();
  if (walk_heads_.empty()) walk_heads_.resize(1);
  walk_heads_[0] = heads_;
  walk(trie, 0, 0, mask_words);
  arena_.resize(saved);
}

void GrammarMatcher::walk(const TokenTrie& trie, uint32_t trie_node, size_t depth, std::span<uint32_t> mask_words) {
  const Grammar& g = *grammar_;
  const TokenTrie::Node& node = trie.node(trie_node);
  ByteSet allowed;
  for (const int32_t head : walk_heads_[depth]) allowed |= g.byte_classes[g.symbols[arena_[head].pos].value];
  if (walk_heads_.size() < depth + 2) walk_heads_.resize(depth + 2);
  for (uint32_t e = 0; e < node.num_edges; ++e) {
    const TokenTrie::Edge& edge = trie.edge(node.first_edge + e);
    if (!allowed.test(edge.byte)) continue;
    const size_t mark = arena_.size();
    bool accept = false;
    if (!step(walk_heads_[depth], edge.byte, walk_heads_[depth + 1], accept)) continue;
    const TokenTrie::Node& child = trie.node(edge.child);
    for (uint32_t t = 0; t < child.num_tokens; ++t) {
      const uint32_t id = static_cast<uint32_t>(trie.token(child.first_token + t));
      if (id / 32 < mask_words.size()) mask_words[id / 32] |= 1u << (id % 32);
    }
    if (child.num_edges > 0 && !walk_heads_[depth + 1].empty()) walk(trie, edge.child, depth + 1, mask_words);
    arena_.resize(mark);  // the subtree's nodes are garbage now
  }
}

}  // namespace splitflow::grammar
