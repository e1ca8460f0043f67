// The Unicode pieces the tokenizers build on, against values from the Unicode standard and Rust's
// documented from_utf8_lossy behaviour.
#include "tokenizer/unicode.h"

#include <gtest/gtest.h>

namespace splitflow::unicode {
namespace {

TEST(Unicode, CanonicalDecompositionAndComposition) {
  EXPECT_EQ(nfd(U"\u00E9"), std::u32string(U"e\u0301"));                   // é
  EXPECT_EQ(nfd(U"\u1EE9"), std::u32string(U"u\u031B\u0301"));             // ứ: horn (216) before acute (230)
  EXPECT_EQ(nfd(U"\uD55C"), std::u32string(U"\u1112\u1161\u11AB"));        // 한 (algorithmic Hangul)
  EXPECT_EQ(nfd(U"a\u0301\u0328"), std::u32string(U"a\u0328\u0301"));      // canonical reordering
  EXPECT_EQ(nfc(U"e\u0301"), std::u32string(U"\u00E9"));
  EXPECT_EQ(nfc(U"\u1112\u1161\u11AB"), std::u32string(U"\uD55C"));
  EXPECT_EQ(nfc(U"\u212B"), std::u32string(U"\u00C5"));                    // Angstrom sign -> Å (singleton)
  EXPECT_EQ(nfc(U"\u0344"), std::u32string(U"\u0308\u0301"));              // excluded from composition
  EXPECT_EQ(nfc(U"\u0301e"), std::u32string(U"\u0301e"));                  // leading non-starter stays
}

TEST(Unicode, CategoriesAndCase) {
  EXPECT_TRUE(is_letter(U'ß'));
  EXPECT_TRUE(is_number(U'½'));
  EXPECT_TRUE(is_punctuation(U'、'));
  EXPECT_TRUE(is_symbol(U'€'));
  EXPECT_TRUE(is_mark(0x0301));
  EXPECT_TRUE(is_white_space(0x3000));
  EXPECT_FALSE(is_white_space(0x200B));  // zero width space is Cf, not White_Space
  std::u32string lower;
  append_lowercase(lower, 0x0130);  // İ -> i + combining dot above
  EXPECT_EQ(lower, std::u32string(U"i\u0307"));
  EXPECT_EQ(simple_lowercase(U'Σ'), U'σ');
}

TEST(Unicode, LossyDecodingReplacesMaximalSubparts) {
  // Rust docs: from_utf8_lossy(b"Hello \xF0\x90\x80World") == "Hello �World".
  EXPECT_EQ(make_valid_utf8("Hello \xF0\x90\x80World"), "Hello \xEF\xBF\xBDWorld");
  EXPECT_EQ(make_valid_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");      // overlong: two bad bytes
  EXPECT_EQ(make_valid_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(make_valid_utf8("ok \xE4\xB8"), "ok \xEF\xBF\xBD");
  EXPECT_TRUE(is_valid_utf8("\xEF\xBF\xBD literal replacement"));
  EXPECT_FALSE(is_valid_utf8("\x80"));
}

TEST(Unicode, ByteLevelAlphabet) {
  EXPECT_EQ(byte_to_char(' '), char32_t(0x120));   // Ġ
  EXPECT_EQ(byte_to_char('\n'), char32_t(0x10A));  // Ċ
  EXPECT_EQ(byte_to_char('A'), char32_t('A'));
  for (int b = 0; b < 256; ++b) EXPECT_EQ(char_to_byte(byte_to_char(uint8_t(b))), b);
  EXPECT_EQ(char_to_byte(U'中'), -1);
}

}  // namespace
}  // namespace splitflow::unicode
