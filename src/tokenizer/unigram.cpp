#include "tokenizer/unigram.h"

#include "core/error.h"
#include "tokenizer/pieces.h"

#include <algorithm>
#include <limits>

namespace splitflow {
namespace {

constexpr double kUnknownPenalty = 10.0;  // HF's K_UNK_PENALTY

uint64_t edge_hash(uint64_t key) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdULL;
  key ^= key >> 33;
  return key;
}

size_t utf8_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;  // not reached on valid UTF-8
}

}  // namespace

UnigramModel::UnigramModel(const std::vector<std::pair<std::string, double>>& pieces, int32_t unk_id,
                           bool byte_fallback, const std::string& where)
    : unk_id_(unk_id), byte_fallback_(byte_fallback) {
  SF_CHECK(!pieces.empty(), "{}: Unigram model with an empty vocab", where);
  SF_CHECK(pieces.size() <= size_t(std::numeric_limits<int32_t>::max()), "{}: {} pieces are more than int32 ids number",
           where, pieces.size());
  SF_CHECK(unk_id < int64_t(pieces.size()), "{}: unk_id {} is outside the vocab of {} pieces", where, unk_id,
           pieces.size());
  scores_.reserve(pieces.size());
  ids_.reserve(pieces.size());
  node_token_.push_back(-1);
  min_score_ = std::numeric_limits<double>::infinity();
  for (size_t id = 0; id < pieces.size(); ++id) {
    scores_.push_back(pieces[id].second);
    ids_.assign(pieces[id].first, int32_t(id));
    min_score_ = std::min(min_score_, pieces[id].second);
  }
  // The trie gives each piece the id its string looks up to, as HF's trie + token_to_ids does.
  for (const auto& [piece, score] : pieces) insert(piece, ids_.find(piece));
  byte_ids_.resize(256);
  for (int b = 0; b < 256; ++b) byte_ids_[b] = ids_.find(byte_piece(uint8_t(b)));
}

int32_t UnigramModel::child(int32_t node, uint8_t byte) const {
  if (edges_.empty()) return -1;
  const uint64_t key = (uint64_t(node) << 8) | byte;
  const size_t mask = edges_.size() - 1;
  for (size_t i = edge_hash(key) & mask;; i = (i + 1) & mask) {
    if (edges_[i].key == key) return edges_[i].child;
    if (edges_[i].key == kNoEdge) return -1;
  }
}

void UnigramModel::add_edge(int32_t node, uint8_t byte, int32_t child_node) {
  if ((edge_count_ + 1) * 2 > edges_.size()) {
    std::vector<Edge> old = std::move(edges_);
    edges_.assign(std::max<size_t>(1024, old.size() * 2), Edge{});
    edge_count_ = 0;
    for (const Edge& edge : old) {
      if (edge.key != kNoEdge) add_edge(int32_t(edge.key >> 8), uint8_t(edge.key & 0xFF), edge.child);
    }
  }
  const uint64_t key = (uint64_t(node) << 8) | byte;
  const size_t mask = edges_.size() - 1;
  size_t i = edge_hash(key) & mask;
  while (edges_[i].key != kNoEdge) i = (i + 1) & mask;
  edges_[i] = Edge{key, child_node};
  ++edge_count_;
}

void UnigramModel::insert(std::string_view piece, int32_t id) {
  if (piece.empty()) return;  // HF's trie never reports the root
  int32_t node = 0;
  for (char c : piece) {
    const uint8_t byte = static_cast<uint8_t>(c);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = int32_t(node_token_.size());
      node_token_.push_back(-1);
      add_edge(node, byte, next);
    }
    node = next;
  }
  node_token_[node] = id;
}

void UnigramModel::encode(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  struct BestPath {
    int32_t id = -1;
    double score = 0;
    size_t starts_at = std::string_view::npos;  // npos: no path ends here yet
  };
  const size_t size = text.size();
  const double unknown_score = min_score_ - kUnknownPenalty;
  std::vector<BestPath> best(size + 1);
  for (size_t starts_at = 0; starts_at < size;) {
    const double score_here = best[starts_at].score;
    const size_t char_length = std::min(utf8_length(static_cast<uint8_t>(text[starts_at])), size - starts_at);
    bool has_single_node = false;
    int32_t node = 0;
    for (size_t i = starts_at; i < size; ++i) {
      node = child(node, static_cast<uint8_t>(text[i]));
      if (node < 0) break;
      const int32_t id = node_token_[node];
      if (id < 0) continue;
      BestPath& target = best[i + 1];
      const double score = scores_[id] + score_here;
      if (target.starts_at == std::string_view::npos || score > target.score) {
        target = BestPath{id, score, starts_at};
      }
      if (i + 1 - starts_at == char_length) has_single_node = true;
    }
    if (!has_single_node) {
      BestPath& target = best[starts_at + char_length];
      const double score = unknown_score + score_here;
      if (target.starts_at == std::string_view::npos || score > target.score) {
        SF_CHECK(unk_id_ >= 0, "Unigram: the text has a character no piece covers and the model has no unk_id");
        target = BestPath{unk_id_, score, starts_at};
      }
    }
    starts_at += char_length;
  }

  // Back from the end: the pieces of the best path, adjacent unknown nodes fused into one string.
  std::vector<std::string_view> strings;
  size_t fused_first = std::string_view::npos, fused_last = 0;
  for (size_t ends_at = size; ends_at > 0;) {
    const BestPath& node_path = best[ends_at];
    const size_t starts_at = node_path.starts_at;
    if (unk_id_ >= 0 && node_path.id == unk_id_) {
      if (fused_first == std::string_view::npos) fused_last = ends_at;
      fused_first = starts_at;
    } else {
      if (fused_first != std::string_view::npos) {
        strings.push_back(text.substr(fused_first, fused_last - fused_first));
        fused_first = std::string_view::npos;
      }
      strings.push_back(text.substr(starts_at, ends_at - starts_at));
    }
    ends_at = starts_at;
  }
  if (fused_first != std::string_view::npos) strings.push_back(text.substr(fused_first, fused_last - fused_first));

  for (auto it = strings.rbegin(); it != strings.rend(); ++it) {
    const int32_t id = ids_.find(*it);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    if (byte_fallback_ &&
        std::all_of(it->begin(), it->end(), [&](char c) { return byte_ids_[static_cast<uint8_t>(c)] >= 0; })) {
      for (char c : *it) out.push_back(byte_ids_[static_cast<uint8_t>(c)]);
      continue;
    }
    SF_CHECK(unk_id_ >= 0, "Unigram: piece '{}' is not in the vocab and the model has no unk_id", *it);
    out.push_back(unk_id_);
  }
}

}  // namespace splitflow
