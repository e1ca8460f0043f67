#include "tokenizer/merges.h"

#include <algorithm>
#include <queue>

namespace splitflow {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finalizer: spreads id pairs over the table
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

void PieceIdMap::reserve(size_t count) {
  size_t capacity = 16;
  while (capacity < count * 2) capacity *= 2;
  if (capacity <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  for (const Slot& slot : old) {
    if (slot.id < 0) continue;
    size_t i = slot.hash & (slots_.size() - 1);
    while (slots_[i].id >= 0) i = (i + 1) & (slots_.size() - 1);
    slots_[i] = slot;
  }
}

void PieceIdMap::grow() { reserve(std::max<size_t>(16, slots_.size())); }

size_t PieceIdMap::probe(std::string_view piece, uint64_t hash) const {
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& slot = slots_[i];
    if (slot.id < 0) return i;
    if (slot.hash == hash && slot.length == piece.size() &&
        std::string_view(arena_.data() + slot.offset, slot.length) == piece) {
      return i;
    }
  }
}

bool PieceIdMap::insert(std::string_view piece, int32_t id) {
  if ((count_ + 1) * 2 > slots_.size()) grow();
  const uint64_t hash = std::hash<std::string_view>{}(piece);
  Slot& slot = slots_[probe(piece, hash)];
  if (slot.id >= 0) return false;
  slot = Slot{hash, uint32_t(arena_.size()), uint32_t(piece.size()), id};
  arena_.append(piece);
  ++count_;
  return true;
}

void PieceIdMap::assign(std::string_view piece, int32_t id) {
  if (!insert(piece, id)) slots_[probe(piece, std::hash<std::string_view>{}(piece))].id = id;
}

int32_t PieceIdMap::find(std::string_view piece) const {
  if (slots_.empty()) return -1;
  return slots_[probe(piece, std::hash<std::string_view>{}(piece))].id;
}

void RankMerges::reserve(size_t count) {
  if (count * 2 > slots_.size()) grow(count * 2);
}

void RankMerges::grow(size_t min_slots) {
  size_t capacity = std::max<size_t>(16, slots_.size() * 2);
  while (capacity < min_slots) capacity *= 2;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  for (const Slot& slot : old) {
    if (slot.key == kEmpty) continue;
    size_t i = mix(slot.key) & (slots_.size() - 1);
    while (slots_[i].key != kEmpty) i = (i + 1) & (slots_.size() - 1);
    slots_[i] = slot;
  }
}

void RankMerges::add(int32_t left, int32_t right, int32_t merged) {
  if ((count_ + 1) * 2 > slots_.size()) grow(0);
  const uint64_t k = key(left, right);
  size_t i = mix(k) & (slots_.size() - 1);
  while (slots_[i].key != kEmpty && slots_[i].key != k) i = (i + 1) & (slots_.size() - 1);
  if (slots_[i].key == kEmpty) ++count_;
  slots_[i] = Slot{k, next_rank_++, merged};
}

const RankMerges::Slot* RankMerges::find(int32_t left, int32_t right) const {
  if (left < 0 || right < 0 || slots_.empty()) return nullptr;
  const uint64_t k = key(left, right);
  for (size_t i = mix(k) & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
    if (slots_[i].key == k) return &slots_[i];
    if (slots_[i].key == kEmpty) return nullptr;
  }
}

void RankMerges::apply(std::vector<int32_t>& symbols) const {
  const int n = int(symbols.size());
  if (n < 2) return;
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  std::vector<Candidate> storage;
  storage.reserve(n);
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue(std::greater<>{}, std::move(storage));
  for (int i = 0; i + 1 < n; ++i) {
    if (const Slot* m = find(symbols[i], symbols[i + 1])) queue.push({m->rank, i, m->merged});
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    const int right = next[top.pos];
    // Stale entry: the pair at this position changed since it was queued.
    const Slot* current = find(symbols[top.pos], symbols[right]);
    if (!current || current->merged != top.merged) continue;
    symbols[top.pos] = top.merged;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0) {
      if (const Slot* m = find(symbols[prev[top.pos]], symbols[top.pos])) queue.push({m->rank, prev[top.pos], m->merged});
    }
    if (next[top.pos] >= 0) {
      if (const Slot* m = find(symbols[top.pos], symbols[next[top.pos]])) queue.push({m->rank, top.pos, m->merged});
    }
  }
  int out = 0;
  for (int i = 0; i < n; ++i) {
    if (alive[i]) symbols[out++] = symbols[i];
  }
  symbols.resize(out);
}

std::vector<std::pair<size_t, size_t>> score_merge(std::string_view text, const PieceScore& score_of) {
  struct Symbol {
    size_t offset;
    size_t length;  // 0 once merged into its left neighbour
    int prev;
    int next;
  };
  std::vector<Symbol> symbols;
  for (size_t offset = 0; offset < text.size();) {
    const auto lead = static_cast<uint8_t>(text[offset]);
    const size_t char_length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    const size_t length = std::min(char_length, text.size() - offset);
    const int index = int(symbols.size());
    symbols.push_back({offset, length, index - 1, -1});
    if (index > 0) symbols[index - 1].next = index;
    offset += length;
  }
  struct Bigram {
    float score;
    int left;
    int right;
    size_t length;
    bool operator<(const Bigram& other) const {  // max-heap: highest score, then leftmost
      return score != other.score ? score < other.score : left > other.left;
    }
  };
  std::priority_queue<Bigram> queue;
  const auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t length = symbols[left].length + symbols[right].length;
    float score = 0;
    if (score_of(text.substr(symbols[left].offset, length), score)) queue.push({score, left, right, length});
  };
  for (int i = 1; i < int(symbols.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Bigram top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.left];
    Symbol& right = symbols[top.right];
    // Symbols only grow or vanish, so an unchanged total length means the pair is still current.
    if (left.length == 0 || right.length == 0 || left.length + right.length != top.length) continue;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    try_add(left.prev, top.left);
    try_add(top.left, left.next);
  }
  std::vector<std::pair<size_t, size_t>> out;
  for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) out.emplace_back(symbols[i].offset, symbols[i].length);
  return out;
}

}  // namespace splitflow
