// tokenizer/unicode.h — the Unicode the tokenizers need beyond PCRE2: UTF-8 decoding with the
// same U+FFFD substitution as Rust's from_utf8_lossy (HF tokenizers) or llama.cpp, general
// categories, normalization (NFD/NFC/NFKD/NFKC as HF tokenizers does it), extended grapheme
// clusters, lowercase mappings, and GPT-2's byte-level alphabet.
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

// The four normalization forms as HF tokenizers computes them: its data is Unicode 9.0, so a
// character assigned later neither decomposes, composes nor reorders (the tables are newer; the
// difference is listed in unicode_tables.h).
std::u32string nfd(std::u32string_view text);
std::u32string nfc(std::u32string_view text);
std::u32string nfkd(std::u32string_view text);
std::u32string nfkc(std::u32string_view text);

// Character classes as HF tokenizers' older Unicode data has them: General_Category M in Unicode
// 9.0 (what StripAccents drops), Mn in Unicode 8.0 and Cc/Cf/Co in Unicode 8.0 (what
// BertNormalizer's strip_accents and clean_text drop).
bool is_hf_mark(char32_t cp);
bool is_hf_bert_nonspacing_mark(char32_t cp);
bool is_hf_bert_other(char32_t cp);

// Grapheme_Cluster_Break values (UAX #29), Extended_Pictographic folded in.
enum class GraphemeBreak : uint8_t {
  Other, CR, LF, Control, Extend, ZWJ, RegionalIndicator, Prepend, SpacingMark, L, V, T, LV, LVT, ExtPict,
};
GraphemeBreak grapheme_break(char32_t cp);
// End (byte offset) of the extended grapheme cluster that starts at `offset` of valid UTF-8 text:
// UAX #29 rules GB3-GB13 with this table's properties (no GB9c, which Unicode 15.1 added).
size_t grapheme_end(std::string_view text, size_t offset);
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
