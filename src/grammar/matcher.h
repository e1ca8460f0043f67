// grammar/matcher.h — the incremental matcher of a Grammar over bytes, and the token trie it
// walks to find which tokens of a vocabulary may come next.
//
// The matcher is a pushdown recognizer in llama.cpp's style: its state is a set of stacks of
// grammar positions, each stack's top a byte class expected next, the entries below it where to
// return when a rule ends (a rule reference at the end of an alternative returns straight to its
// caller's caller, so right-recursive repetitions keep constant depth). After every committed
// byte the stacks are deduplicated and rebuilt, so the state is canonical: equal states have
// equal keys (`state_key`), which is what a mask cache is keyed by.
//
// The token mask walks the trie of the vocabulary's token bytes depth first, advancing a scratch
// copy of the stacks one byte per trie edge and pruning every edge whose byte no stack accepts:
// the cost is the number of trie nodes that stay viable, not vocabulary x token length.
#pragma once

#include "grammar/grammar.h"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace splitflow::grammar {

// The tokens of a vocabulary by their bytes, as a trie. Tokens with no bytes (and those left out
// by the caller, e.g. special tokens) are absent, so no mask ever allows them.
class TokenTrie {
 public:
  // token_bytes[id]: the bytes token id adds to the text; std::nullopt-like empty: left out.
  explicit TokenTrie(const std::vector<std::string>& token_bytes);

  struct Node {
    uint32_t first_edge = 0;
    uint32_t num_edges = 0;
    uint32_t first_token = 0;  // into tokens(): those whose bytes end here
    uint32_t num_tokens = 0;
  };
  struct Edge {
    uint8_t byte;
    uint32_t child;
  };
  const Node& node(uint32_t id) const { return nodes_[id]; }
  const Edge& edge(uint32_t id) const { return edges_[id]; }
  int32_t token(uint32_t index) const { return tokens_[index]; }
  size_t num_nodes() const { return nodes_.size(); }
  int32_t vocab_size() const { return vocab_size_; }

 private:
  std::vector<Node> nodes_;  // node 0 is the root
  std::vector<Edge> edges_;
  std::vector<int32_t> tokens_;
  int32_t vocab_size_;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  // Consumes one byte; false (and the state unchanged) when the grammar does not allow it here.
  bool advance(uint8_t byte);
  // Consumes every byte, all or nothing.
  bool advance(std::string_view bytes);
  // The bytes so far are a complete sentence of the grammar.
  bool can_end() const { return accepting_; }
  // Nothing more may follow: the sentence is complete and no stack expects another byte.
  bool is_finished() const { return heads_.empty(); }
  // Bytes that may come next.
  ByteSet next_bytes() const;

  // The canonical state: the sorted stacks (positions, top first, separated by -1) and whether
  // the sentence may end here. Equal keys mean equal futures.
  const std::vector<int32_t>& state_key() const { return key_; }

  // Sets bit t (word t / 32) of `mask_words` for every token of the trie whose bytes the grammar
  // accepts next (it does not clear the other bits). Leaves the state unchanged.
  void fill_token_mask(const TokenTrie& trie, std::span<uint32_t> mask_words);

  // Most stacks a state may hold before the grammar is reported too ambiguous.
  static constexpr size_t kMaxStacks = 4096;

 private:
  struct StackNode {
    int32_t pos;     // top: a Bytes symbol; below: where to continue once the rule above ends
    int32_t parent;  // -1: the bottom
  };
  int32_t new_node(int32_t pos, int32_t parent);
  // Expands position `pos` (over `parent`) to the stacks whose top is a byte class.
  void expand(int32_t pos, int32_t parent, std::vector<int32_t>& out, bool& accept);
  // The stacks after `byte` from `heads`; returns whether any stack or the end is reached.
  bool step(const std::vector<int32_t>& heads, uint8_t byte, std::vector<int32_t>& out, bool& accept);
  void dedup(std::vector<int32_t>& heads) const;
  // Rebuilds arena_ holding only the stacks of `heads`, deduplicated, and the key.
  void canonicalize(const std::vector<int32_t>& heads, bool accept);
  void walk(const TokenTrie& trie, uint32_t trie_node, size_t depth, std::span<uint32_t> mask_words);

  std::shared_ptr<const Grammar> grammar_;
  std::vector<StackNode> arena_;
  std::vector<int32_t> heads_;  // top nodes of the stacks
  bool accepting_ = false;
  std::vector<int32_t> key_;
  std::vector<std::vector<int32_t>> walk_heads_;  // per trie depth, reused
  std::vector<std::pair<int32_t, int32_t>> expand_work_;  // expand()'s stack, reused
};

}  // namespace splitflow::grammar
