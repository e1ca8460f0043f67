// tokenizer/pieces.h — small helpers on token pieces shared by the tokenizer implementations.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace splitflow {

// The byte of a SentencePiece byte-fallback piece "<0xNN>", -1 for any other piece.
inline int parse_byte_piece(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  const auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int high = hex(piece[3]), low = hex(piece[4]);
  return (high < 0 || low < 0) ? -1 : high * 16 + low;
}

// "<0xNN>" with upper-case hex, the form SentencePiece and HF tokenizers look up.
inline std::string byte_piece(uint8_t byte) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string{'<', '0', 'x', kHex[byte >> 4], kHex[byte & 15], '>'};
}

inline std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  for (size_t hit; (hit = text.find(from, pos)) != std::string_view::npos; pos = hit + from.size()) {
    out.append(text.substr(pos, hit - pos));
    out.append(to);
  }
  out.append(text.substr(pos));
  return out;
}

// "▁" (U+2581), SentencePiece's visible space.
inline constexpr std::string_view kSentencePieceSpace = "\xE2\x96\x81";

}  // namespace splitflow
