// tokenizer/hf_components.h — the pipeline components of HF tokenizer.json (normalizers,
// pre-tokenizers, decoders), each built from its JSON spec as a function and each mirroring HF
// `tokenizers`; SentencePiece's precompiled charsmap behind the Precompiled normalizer. Internal to
// the tokenizer module (hf_tokenizer.cpp assembles them).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace splitflow::hf {

using json = nlohmann::json;

// A span of the input on its way through the pipeline. `token` >= 0 marks an added token matched
// in the text (final). `at_start`: the span begins at byte 0 of the input (Metaspace "first").
struct Piece {
  std::string text;
  bool at_start = false;
  int32_t token = -1;
};
using Pieces = std::vector<Piece>;

// Replaces every text piece by the pieces `split` makes of it; added-token pieces pass through.
template <typename SplitFn>
void split_text_pieces(Pieces& pieces, SplitFn split) {
  Pieces out;
  out.reserve(pieces.size() * 2);
  for (const Piece& piece : pieces) {
    if (piece.token >= 0) {
      out.push_back(piece);
    } else {
      split(piece, out);
    }
  }
  pieces = std::move(out);
}

using NormalizeFn = std::function<void(std::string&)>;  // one piece's text, in place
using PreTokenizeFn = std::function<void(Pieces&)>;
using DecodeFn = std::function<void(std::vector<std::string>&)>;  // token strings, in place

// What a decoder chain does to single pieces, so token_bytes() can mirror it per token.
struct DecoderTraits {
  bool byte_level = false;     // ByteLevel: pieces are GPT-2 byte-level strings
  bool sentencepiece = false;  // "▁" stands for a space (Replace / Metaspace), <0xNN> byte fallback
  bool wordpiece = false;      // "##" continues a word, other pieces start one
};

NormalizeFn parse_normalizer(const json& spec, const std::string& where);
PreTokenizeFn parse_pre_tokenizer(const json& spec, const std::string& where);
DecodeFn parse_decoder(const json& spec, const std::string& where, DecoderTraits& traits);

// JSON access with errors that say where.
const json& require(const json& object, const char* key, const std::string& where);
// The "type" of a component spec.
std::string type_of(const json& component, const std::string& where);
template <typename T>
T value_or(const json& object, const char* key, T fallback) {
  const auto it = object.find(key);
  return (it == object.end() || it->is_null()) ? fallback : it->get<T>();
}

// SentencePiece's precompiled normalization map (the Precompiled normalizer's blob, as HF's
// spm_precompiled reads it): a little-endian u32 byte size, a darts-clone double-array trie of
// that size keyed by UTF-8 input, then the NUL-terminated replacement strings its leaves point to.
class PrecompiledCharsmap {
 public:
  PrecompiledCharsmap(std::string_view blob, const std::string& where);
  // The replacement of the shortest key that is a prefix of `key`; nullopt when none is.
  std::optional<std::string_view> transform(std::string_view key) const;
  std::string normalize(std::string_view text) const;

 private:
  std::vector<uint32_t> units_;
  std::string normalized_;
};

std::string base64_decode(std::string_view text, const std::string& where);

// Bytes of a byte-level piece; false when a character is outside the alphabet.
bool byte_level_decode(std::string_view piece, std::string& bytes);
// Regex \w: letters, marks, decimal digits, connector punctuation (HF's single_word test).
bool is_word_char(char32_t cp);

}  // namespace splitflow::hf
