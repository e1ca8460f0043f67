// tokenizer/unigram.h — the SentencePiece Unigram model as HF tokenizers implements it
// (models/unigram/model.rs, the "optimized" encoder): a Viterbi search over every vocabulary piece
// that starts at each character, scores summed in f64; a character no piece covers is an unknown
// node scored min_score - 10; adjacent unknown nodes fuse into one piece; a piece string missing
// from the vocabulary becomes its <0xNN> byte pieces when byte_fallback is set, else unk_id.
#pragma once

#include "tokenizer/merges.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace splitflow {

class UnigramModel {
 public:
  // `pieces` in id order with their scores; unk_id -1 when the model has none. Errors name `where`.
  UnigramModel(const std::vector<std::pair<std::string, double>>& pieces, int32_t unk_id, bool byte_fallback,
               const std::string& where);

  // Appends the ids of one pre-token. Fails (as HF does) when a character is unknown and there
  // is no unk_id.
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  // The id HF's token_to_ids gives a piece (a repeated piece keeps its last id), -1 when absent.
  int32_t find(std::string_view piece) const { return find_id(ids_, piece); }
  int32_t unk_id() const { return unk_id_; }

 private:
  // Byte trie over the pieces: node 0 is the root; edges in an open-addressing table.
  struct Edge {
    uint64_t key = kNoEdge;  // (node << 8) | byte
    int32_t child = 0;
  };
  static constexpr uint64_t kNoEdge = ~uint64_t(0);
  int32_t child(int32_t node, uint8_t byte) const;
  void add_edge(int32_t node, uint8_t byte, int32_t child);
  void insert(std::string_view piece, int32_t id);

  std::vector<double> scores_;      // by id
  PieceIdMap ids_;                  // piece -> id, the last of repeated pieces
  std::vector<int32_t> node_token_;  // by trie node: the id of the piece ending there, -1 if none
  std::vector<Edge> edges_;         // power-of-two size
  size_t edge_count_ = 0;
  double min_score_ = 0;
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  std::vector<int32_t> byte_ids_;  // <0xNN> piece ids, -1 where missing
};

}  // namespace splitflow
