// tokenizer/llama2c_tokenizer.cpp — llama2.c's tokenizer.bin, encoded as run.c's encode() does:
// a dummy-prefix " " before non-empty text, one symbol per UTF-8 character (bytes + 3 when the
// character is not a piece), then repeatedly the highest-scoring merge (leftmost on ties).
// File layout: int32 max_token_length, then per token: f32 score, int32 byte length, bytes.
// Ids 0/1/2 are <unk>/BOS/EOS (stored as "<unk>", "\n<s>\n", "\n</s>\n"); 3..258 are <0x00>..<0xFF>.
#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "core/mapped_file.h"
#include "tokenizer/merges.h"
#include "tokenizer/pieces.h"
#include "tokenizer/unicode.h"

#include <cstring>

namespace splitflow {
namespace {

constexpr int32_t kUnkId = 0, kBosId = 1, kEosId = 2, kFirstByteId = 3;

class Llama2cTokenizer final : public Tokenizer {
 public:
  Llama2cTokenizer(const std::string& path, int32_t vocab_size);

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override;
  std::string token_bytes(int32_t id) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override;
  int32_t vocab_size() const override { return int32_t(pieces_.size()); }
  bool is_special(int32_t id) const override { return id == kUnkId || id == kBosId || id == kEosId; }
  int32_t bos_id() const override { return kBosId; }
  std::vector<int32_t> eos_ids() const override { return {kEosId}; }
  int32_t token_id(std::string_view piece) const override {
    if (piece == "<s>") return kBosId;
    if (piece == "</s>") return kEosId;
    return find_id(piece_to_id_, piece);
  }

 private:
  std::vector<std::string> pieces_;  // as stored: "▁" is a plain space
  std::vector<float> scores_;
  PieceIdMap piece_to_id_;
};

Llama2cTokenizer::Llama2cTokenizer(const std::string& path, int32_t vocab_size) {
  const auto file = MappedFile::open(path);
  const uint8_t* data = file->data();
  const size_t size = file->size();
  size_t offset = 0;
  const auto read_i32 = [&](const char* what, size_t index) {
    SF_CHECK(offset + 4 <= size, "'{}': truncated at byte {} reading the {} of token {}", path, offset, what, index);
    int32_t value;
    std::memcpy(&value, data + offset, 4);
    offset += 4;
    return value;
  };
  SF_CHECK(size >= 4, "'{}': {} bytes is too short for a llama2.c tokenizer (needs the max_token_length header)",
           path, size);
  const int32_t max_token_length = read_i32("header", 0);
  SF_CHECK(max_token_length > 0 && max_token_length < (1 << 20), "'{}': max_token_length {} is not plausible", path,
           max_token_length);
  // vocab_size <= 0: read every entry up to the end of the file.
  for (size_t i = 0; vocab_size > 0 ? i < size_t(vocab_size) : offset < size; ++i) {
    float score;
    {
      const int32_t bits = read_i32("score", i);
      std::memcpy(&score, &bits, 4);
    }
    const int32_t length = read_i32("length", i);
    SF_CHECK(length >= 0 && size_t(length) <= size - offset,
             "'{}': token {} claims {} bytes but {} remain at offset {} (vocab size {}?)", path, i, length,
             size - offset, offset, vocab_size);
    pieces_.emplace_back(reinterpret_cast<const char*>(data + offset), size_t(length));
    scores_.push_back(score);
    offset += size_t(length);
  }
  SF_CHECK(pieces_.size() > kFirstByteId + 255, "'{}': {} tokens; a llama2.c vocabulary has at least 259", path,
           pieces_.size());
  piece_to_id_.reserve(pieces_.size());
  for (size_t i = 0; i < pieces_.size(); ++i) piece_to_id_.insert(pieces_[i], int32_t(i));
}

std::vector<int32_t> Llama2cTokenizer::encode(std::string_view raw_text, bool add_special) const {
  std::vector<int32_t> ids;
  if (add_special) ids.push_back(kBosId);
  if (raw_text.empty()) return ids;
  std::string text(1, ' ');  // llama2.c's dummy prefix
  text += unicode::make_valid_utf8(raw_text);
  const auto score_of = [&](std::string_view piece, float& score) {
    const int32_t id = find_id(piece_to_id_, piece);
    if (id < 0) return false;
    score = scores_[id];
    return true;
  };
  for (const auto& [offset, length] : score_merge(text, score_of)) {
    const std::string_view symbol(text.data() + offset, length);
    const int32_t id = find_id(piece_to_id_, symbol);
    if (id >= 0) {
      ids.push_back(id);
    } else {
      for (char c : symbol) ids.push_back(kFirstByteId + static_cast<uint8_t>(c));
    }
  }
  return ids;
}

std::string Llama2cTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || size_t(id) >= pieces_.size()) return "";
  if (id == kBosId) return "<s>";
  if (id == kEosId) return "</s>";
  const int byte = parse_byte_piece(pieces_[id]);
  return byte >= 0 ? std::string(1, char(byte)) : pieces_[id];
}

std::string Llama2cTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    bytes += token_bytes(id);
  }
  // The dummy prefix space of the first piece is not part of the text.
  if (!bytes.empty() && bytes[0] == ' ') bytes.erase(0, 1);
  return unicode::make_valid_utf8(bytes);
}

}  // namespace

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, int32_t vocab_size) {
  return std::make_unique<Llama2cTokenizer>(path, vocab_size);
}

}  // namespace splitflow
