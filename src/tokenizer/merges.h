// tokenizer/merges.h — the two merge loops every BPE flavour here reduces to:
//  - rank merges (HF BPE, llama.cpp's gpt2 vocabularies): repeatedly merge the adjacent pair with
//    the lowest merge rank, leftmost first (tokenizers' Word::merge_all);
//  - score merges (SentencePiece BPE in llama.cpp and llama2.c): repeatedly merge the adjacent pair
//    whose concatenation is the vocabulary entry with the highest score, leftmost first.
// Both use a priority queue with lazy invalidation: O(n log n) per word.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace splitflow {

// Heterogeneous-lookup hash so std::string-keyed maps can be queried with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// piece -> id for large vocabularies: the pieces live in one arena and the table is open
// addressing, so building 150k entries and looking them up stays cache-friendly.
class PieceIdMap {
 public:
  void reserve(size_t count);
  // Adds `piece` unless present; returns false (keeping the old id) when it was.
  bool insert(std::string_view piece, int32_t id);
  // Adds or replaces.
  void assign(std::string_view piece, int32_t id);
  int32_t find(std::string_view piece) const;  // -1 when absent
  size_t size() const { return count_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0;
    uint32_t length = 0;
    int32_t id = -1;  // -1: empty
  };
  size_t probe(std::string_view piece, uint64_t hash) const;
  void grow();
  std::string arena_;
  std::vector<Slot> slots_;
  size_t count_ = 0;
};

inline int32_t find_id(const PieceIdMap& map, std::string_view key) { return map.find(key); }

class RankMerges {
 public:
  // A merge of (left, right) into `merged`; earlier calls get lower (better) ranks. A pair given
  // twice keeps the later rank, as HF tokenizers' map construction does.
  void add(int32_t left, int32_t right, int32_t merged);
  void reserve(size_t count);
  size_t size() const { return count_; }
  // Merges `symbols` (token ids) in place.
  void apply(std::vector<int32_t>& symbols) const;

 private:
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  static uint64_t key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }
  const Slot* find(int32_t left, int32_t right) const;
  void grow(size_t min_slots);
  std::vector<Slot> slots_;  // open addressing, power-of-two size
  size_t count_ = 0;
  int32_t next_rank_ = 0;
};

// Splits `text` into UTF-8 characters and merges them by score. `score_of(piece)` returns the
// score of a vocabulary entry, or nullopt-like false through `found`. Returns the final symbols as
// byte ranges [offset, offset + length) of `text`.
using PieceScore = std::function<bool(std::string_view piece, float& score)>;
std::vector<std::pair<size_t, size_t>> score_merge(std::string_view text, const PieceScore& score_of);

}  // namespace splitflow
