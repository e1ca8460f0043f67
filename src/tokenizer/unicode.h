// tokenizer/unicode.h — the Unicode the tokenizers need beyond PCRE2: UTF-8 decoding with the
// same U+FFFD substitution as Rust's from_utf8_lossy (HF tokenizers) or llama.cpp, general
// categories, canonical normalization (NFD/NFC), lowercase mappings, and GPT-2's byte-level alphabet.
// Tables come from unicode_tables.cpp (generated; see gen_unicode_tables.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace splitflow::unicode {

constexpr char32_t kReplacementChar = 0xFFFD;

enum class Category : uint8_t {
  Lu, Ll, Lt, Lm, Lo, Mn, Mc, Me, Nd, Nl, No, Pc, Pd, Ps, Pe,
  Pi, Pf, Po, Sm, Sc, Sk, So, Zs, Zl, Zp, Cc, Cf, Cs, Co, Cn,
};

Category category(char32_t cp);
inline bool is_letter(char32_t cp) { return category(cp) <= Category::Lo; }
inline bool is_mark(char32_t cp) { auto c = category(cp); return c >= Category::Mn && c <= Category::Me; }
inline bool is_number(char32_t cp) { auto c = category(cp); return c >= Category::Nd && c <= Category::No; }
inline bool is_punctuation(char32_t cp) { auto c = category(cp); return c >= Category::Pc && c <= Category::Po; }
inline bool is_symbol(char32_t cp) { auto c = category(cp); return c >= Category::Sm && c <= Category::So; }
// Unicode White_Space (Rust's char::is_whitespace, llama.cpp's whitespace set).
bool is_white_space(char32_t cp);
uint8_t combining_class(char32_t cp);

// Decodes the code point at `offset` and advances past it. Invalid input yields U+FFFD and skips
// one maximal invalid subpart (Rust's from_utf8_lossy substitution).
char32_t decode_next(std::string_view text, size_t& offset);
std::u32string to_code_points(std::string_view text);
void append_utf8(std::string& out, char32_t cp);
std::string to_utf8(std::u32string_view code_points);
// Valid UTF-8 copy of `bytes`, invalid subparts replaced by U+FFFD.
std::string make_valid_utf8(std::string_view bytes);
bool is_valid_utf8(std::string_view bytes);

std::u32string nfd(std::u32string_view text);
std::u32string nfc(std::u32string_view text);
// First code point of the canonical decomposition (llama.cpp's approximate NFD for BERT vocabularies).
char32_t nfd_first(char32_t cp);
// Full context-free lowercase (may be several code points, e.g. U+0130).
void append_lowercase(std::u32string& out, char32_t cp);
// First code point of the lowercase mapping (llama.cpp's unicode_tolower).
char32_t simple_lowercase(char32_t cp);

// GPT-2 byte-level alphabet: every byte maps to one printable code point.
char32_t byte_to_char(uint8_t byte);
// The byte a byte-level code point stands for, -1 when `cp` is outside the alphabet.
int char_to_byte(char32_t cp);

}  // namespace splitflow::unicode
