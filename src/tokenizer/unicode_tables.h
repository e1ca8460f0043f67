// tokenizer/unicode_tables.h — generated Unicode property tables (unicode_tables.cpp, written by
// gen_unicode_tables.py). Only tokenizer/unicode.cpp reads them; everything else goes through unicode.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace splitflow::unicode::tables {

struct CategoryRange {
  char32_t first;    // the range runs to the next entry's first
  uint8_t category;  // index into unicode::Category
};
struct CombiningClassRange {
  char32_t first;
  char32_t last;  // inclusive
  uint8_t combining_class;
};
// A code point mapped to `length` code points at `offset` of a data array.
struct Mapping {
  char32_t code_point;
  uint32_t offset;
  uint32_t length;
};
struct Composition {
  char32_t first;
  char32_t second;
  char32_t composite;
};
struct CodePointRange {
  char32_t first;
  char32_t last;  // inclusive
};
struct GraphemeBreakRange {
  char32_t first;         // the range runs to the next entry's first
  uint8_t grapheme_break;  // index into unicode::GraphemeBreak
};

extern const char* const kUnicodeVersion;
extern const CategoryRange kCategoryRanges[];
extern const size_t kCategoryRangeCount;
extern const CombiningClassRange kCombiningClassRanges[];
extern const size_t kCombiningClassRangeCount;
// Full canonical decompositions (already recursive), sorted by code point; Hangul is algorithmic.
extern const Mapping kDecompositions[];
extern const size_t kDecompositionCount;
extern const char32_t kDecompositionData[];
// Primary composites, sorted by (first, second).
extern const Composition kCompositions[];
extern const size_t kCompositionCount;
// Full compatibility decompositions (canonical and compatibility mappings applied recursively),
// only where they differ from the canonical one; Hangul syllables inside are left whole.
extern const Mapping kCompatibilityDecompositions[];
extern const size_t kCompatibilityDecompositionCount;
extern const char32_t kCompatibilityDecompositionData[];
// Sorted code points whose decomposition or combining class is newer than HF tokenizers'
// normalization data (Unicode 9.0).
extern const char32_t kNormalizationNewerThanHf[];
extern const size_t kNormalizationNewerThanHfCount;
// The character classes of HF tokenizers' older Unicode data, sorted ranges: General_Category M in
// Unicode 9.0 (StripAccents), Mn in Unicode 8.0 and Cc/Cf/Co in Unicode 8.0 (BertNormalizer).
extern const CodePointRange kHfMarkRanges[];
extern const size_t kHfMarkRangeCount;
extern const CodePointRange kHfBertNonspacingMarkRanges[];
extern const size_t kHfBertNonspacingMarkRangeCount;
extern const CodePointRange kHfBertOtherRanges[];
extern const size_t kHfBertOtherRangeCount;
// Grapheme_Cluster_Break with Extended_Pictographic folded in.
extern const GraphemeBreakRange kGraphemeBreakRanges[];
extern const size_t kGraphemeBreakRangeCount;
// Full (context-free) lowercase mappings, sorted by code point.
extern const Mapping kLowercase[];
extern const size_t kLowercaseCount;
extern const char32_t kLowercaseData[];

}  // namespace splitflow::unicode::tables
