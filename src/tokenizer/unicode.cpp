#include "tokenizer/unicode.h"

#include "tokenizer/unicode_tables.h"

#include <algorithm>
#include <array>

namespace splitflow::unicode {
namespace {

constexpr char32_t kHangulSBase = 0xAC00, kHangulLBase = 0x1100, kHangulVBase = 0x1161, kHangulTBase = 0x11A7;
constexpr char32_t kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28;
constexpr char32_t kHangulNCount = kHangulVCount * kHangulTCount, kHangulSCount = kHangulLCount * kHangulNCount;

Category lookup_category(char32_t cp) {
  using tables::kCategoryRanges;
  const auto* end = kCategoryRanges + tables::kCategoryRangeCount;
  const auto* it = std::upper_bound(kCategoryRanges, end, cp,
                                    [](char32_t value, const tables::CategoryRange& r) { return value < r.first; });
  return static_cast<Category>((it - 1)->category);
}

const std::array<Category, 128>& ascii_categories() {
  static const auto table = [] {
    std::array<Category, 128> t{};
    for (char32_t cp = 0; cp < 128; ++cp) t[cp] = lookup_category(cp);
    return t;
  }();
  return table;
}

const tables::Mapping* find_mapping(const tables::Mapping* begin, size_t count, char32_t cp) {
  const auto* end = begin + count;
  const auto* it = std::lower_bound(begin, end, cp,
                                    [](const tables::Mapping& m, char32_t value) { return m.code_point < value; });
  return (it != end && it->code_point == cp) ? it : nullptr;
}

// Code points whose normalization data HF tokenizers (Unicode 9.0) does not have.
bool newer_than_hf(char32_t cp) {
  return std::binary_search(tables::kNormalizationNewerThanHf,
                            tables::kNormalizationNewerThanHf + tables::kNormalizationNewerThanHfCount, cp);
}

uint8_t hf_combining_class(char32_t cp) {
  const uint8_t value = combining_class(cp);
  return value != 0 && !newer_than_hf(cp) ? value : 0;
}

void append_decomposition(std::u32string& out, char32_t cp) {
  if (cp >= kHangulSBase && cp < kHangulSBase + kHangulSCount) {
    const char32_t index = cp - kHangulSBase;
    out.push_back(kHangulLBase + index / kHangulNCount);
    out.push_back(kHangulVBase + (index % kHangulNCount) / kHangulTCount);
    if (index % kHangulTCount != 0) out.push_back(kHangulTBase + index % kHangulTCount);
    return;
  }
  if (const auto* m = find_mapping(tables::kDecompositions, tables::kDecompositionCount, cp)) {
    out.append(tables::kDecompositionData + m->offset, m->length);
  } else {
    out.push_back(cp);
  }
}

// HF's full decomposition of one code point, canonical or (compatibility) canonical + compatibility.
void append_hf_decomposition(std::u32string& out, char32_t cp, bool compatibility) {
  if (cp < 0xA0) {
    out.push_back(cp);
    return;
  }
  if (newer_than_hf(cp)) {
    out.push_back(cp);
    return;
  }
  if (compatibility) {
    if (const auto* m = find_mapping(tables::kCompatibilityDecompositions, tables::kCompatibilityDecompositionCount, cp)) {
      // The data leaves Hangul syllables whole; everything else in it is already decomposed.
      for (uint32_t i = 0; i < m->length; ++i) append_decomposition(out, tables::kCompatibilityDecompositionData[m->offset + i]);
      return;
    }
  }
  append_decomposition(out, cp);
}

// Full decomposition, then canonical ordering: a stable sort of every run of non-starters by
// combining class.
std::u32string decompose(std::u32string_view text, bool compatibility) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t cp : text) append_hf_decomposition(out, cp, compatibility);
  for (size_t i = 0; i < out.size();) {
    if (hf_combining_class(out[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < out.size() && hf_combining_class(out[j]) != 0) ++j;
    std::stable_sort(out.begin() + i, out.begin() + j,
                     [](char32_t a, char32_t b) { return hf_combining_class(a) < hf_combining_class(b); });
    i = j;
  }
  return out;
}

// 0 when the pair has no primary composite.
char32_t compose(char32_t first, char32_t second) {
  if (first >= kHangulLBase && first < kHangulLBase + kHangulLCount && second >= kHangulVBase &&
      second < kHangulVBase + kHangulVCount) {
    return kHangulSBase + ((first - kHangulLBase) * kHangulVCount + (second - kHangulVBase)) * kHangulTCount;
  }
  if (first >= kHangulSBase && first < kHangulSBase + kHangulSCount && (first - kHangulSBase) % kHangulTCount == 0 &&
      second > kHangulTBase && second < kHangulTBase + kHangulTCount) {
    return first + (second - kHangulTBase);
  }
  const auto* begin = tables::kCompositions;
  const auto* end = begin + tables::kCompositionCount;
  const auto* it = std::lower_bound(begin, end, std::pair{first, second}, [](const tables::Composition& c, auto key) {
    return c.first != key.first ? c.first < key.first : c.second < key.second;
  });
  return (it != end && it->first == first && it->second == second) ? it->composite : 0;
}

struct ByteLevelAlphabet {
  std::array<char32_t, 256> byte_to_char{};
  std::array<int16_t, 324> char_to_byte{};  // the alphabet spans U+0021..U+0143
};

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet = [] {
    ByteLevelAlphabet a;
    a.char_to_byte.fill(-1);
    int next_extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? char32_t(b) : char32_t(256 + next_extra++);
      a.byte_to_char[b] = cp;
      a.char_to_byte[cp] = int16_t(b);
    }
    return a;
  }();
  return alphabet;
}

}  // namespace

Category category(char32_t cp) {
  if (cp < 128) return ascii_categories()[cp];
  if (cp > 0x10FFFF) return Category::Cn;
  return lookup_category(cp);
}

bool is_white_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  using tables::kCombiningClassRanges;
  const auto* end = kCombiningClassRanges + tables::kCombiningClassRangeCount;
  const auto* it = std::upper_bound(kCombiningClassRanges, end, cp,
                                    [](char32_t value, const tables::CombiningClassRange& r) { return value < r.first; });
  if (it == kCombiningClassRanges) return 0;
  --it;
  return cp <= it->last ? it->combining_class : 0;
}

char32_t decode_next(std::string_view text, size_t& offset) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(offset);
  if (lead < 0x80) {
    ++offset;
    return lead;
  }
  int length;
  char32_t cp;
  uint8_t low = 0x80, high = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, cp = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, cp = lead & 0x0F;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, cp = lead & 0x07;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    ++offset;
    return kReplacementChar;
  }
  size_t i = offset + 1;
  for (int k = 1; k < length; ++k, ++i) {
    const uint8_t lo = (k == 1) ? low : 0x80, hi = (k == 1) ? high : 0xBF;
    if (i >= text.size() || byte(i) < lo || byte(i) > hi) {
      offset = i;  // the maximal subpart ends before the first byte that cannot continue it
      return kReplacementChar;
    }
    cp = (cp << 6) | (byte(i) & 0x3F);
  }
  offset = i;
  return cp;
}

std::u32string to_code_points(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) out.push_back(decode_next(text, i));
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

std::string to_utf8(std::u32string_view code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (char32_t cp : code_points) append_utf8(out, cp);
  return out;
}

bool is_valid_utf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const size_t start = i;
    if (decode_next(bytes, i) == kReplacementChar && bytes.compare(start, 3, "\xEF\xBF\xBD") != 0) return false;
  }
  return true;
}

std::string make_valid_utf8(std::string_view bytes) {
  if (is_valid_utf8(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 8);
  for (size_t i = 0; i < bytes.size();) append_utf8(out, decode_next(bytes, i));
  return out;
}

std::u32string nfd(std::u32string_view text) { return decompose(text, false); }
std::u32string nfkd(std::u32string_view text) { return decompose(text, true); }

namespace {

// Canonical composition of a decomposed string, in place.
std::u32string compose_all(std::u32string s) {
  if (s.empty()) return s;
  size_t starter_pos = 0;
  int last_class = hf_combining_class(s[0]) == 0 ? 0 : 256;  // a leading non-starter blocks composition
  size_t out_pos = 1;
  for (size_t i = 1; i < s.size(); ++i) {
    const char32_t ch = s[i];
    const int ch_class = hf_combining_class(ch);
    char32_t composite = last_class == 256 ? 0 : compose(s[starter_pos], ch);
    if (composite != 0 && newer_than_hf(composite)) composite = 0;
    if (composite != 0 && (last_class < ch_class || last_class == 0)) {
      s[starter_pos] = composite;
      continue;
    }
    if (ch_class == 0) {
      starter_pos = out_pos;
    }
    last_class = ch_class;
    s[out_pos++] = ch;
  }
  s.resize(out_pos);
  return s;
}

}  // namespace

std::u32string nfc(std::u32string_view text) { return compose_all(decompose(text, false)); }
std::u32string nfkc(std::u32string_view text) { return compose_all(decompose(text, true)); }

namespace {

bool in_ranges(const tables::CodePointRange* ranges, size_t count, char32_t cp) {
  const auto* end = ranges + count;
  const auto* it = std::upper_bound(ranges, end, cp,
                                    [](char32_t value, const tables::CodePointRange& r) { return value < r.first; });
  return it != ranges && cp <= (it - 1)->last;
}

}  // namespace

bool is_hf_mark(char32_t cp) { return cp >= 0x300 && in_ranges(tables::kHfMarkRanges, tables::kHfMarkRangeCount, cp); }
bool is_hf_bert_nonspacing_mark(char32_t cp) {
  return cp >= 0x300 && in_ranges(tables::kHfBertNonspacingMarkRanges, tables::kHfBertNonspacingMarkRangeCount, cp);
}
bool is_hf_bert_other(char32_t cp) {
  return in_ranges(tables::kHfBertOtherRanges, tables::kHfBertOtherRangeCount, cp);
}

GraphemeBreak grapheme_break(char32_t cp) {
  if (cp >= 0x20 && cp < 0x7F) return GraphemeBreak::Other;
  if (cp > 0x10FFFF) return GraphemeBreak::Other;
  using tables::kGraphemeBreakRanges;
  const auto* end = kGraphemeBreakRanges + tables::kGraphemeBreakRangeCount;
  const auto* it = std::upper_bound(kGraphemeBreakRanges, end, cp,
                                    [](char32_t value, const tables::GraphemeBreakRange& r) { return value < r.first; });
  return static_cast<GraphemeBreak>((it - 1)->grapheme_break);
}

size_t grapheme_end(std::string_view text, size_t offset) {
  using enum GraphemeBreak;
  size_t pos = offset;
  if (pos >= text.size()) return text.size();
  GraphemeBreak previous = grapheme_break(decode_next(text, pos));
  // GB11 state: 1 after ExtPict Extend*, 2 after ExtPict Extend* ZWJ. GB12/13: regional
  // indicators in a row so far.
  int emoji = previous == ExtPict ? 1 : 0;
  int regional_indicators = previous == RegionalIndicator ? 1 : 0;
  const auto is_control = [](GraphemeBreak b) { return b == Control || b == CR || b == LF; };
  while (pos < text.size()) {
    size_t next_pos = pos;
    const GraphemeBreak next = grapheme_break(decode_next(text, next_pos));
    bool join;
    if (previous == CR && next == LF) {
      join = true;  // GB3
    } else if (is_control(previous) || is_control(next)) {
      join = false;  // GB4, GB5
    } else if (previous == L && (next == L || next == V || next == LV || next == LVT)) {
      join = true;  // GB6
    } else if ((previous == LV || previous == V) && (next == V || next == T)) {
      join = true;  // GB7
    } else if ((previous == LVT || previous == T) && next == T) {
      join = true;  // GB8
    } else if (next == Extend || next == ZWJ || next == SpacingMark || previous == Prepend) {
      join = true;  // GB9, GB9a, GB9b
    } else if (previous == ZWJ && next == ExtPict) {
      join = emoji == 2;  // GB11
    } else if (previous == RegionalIndicator && next == RegionalIndicator) {
      join = regional_indicators % 2 == 1;  // GB12, GB13
    } else {
      join = false;  // GB999
    }
    if (!join) break;
    if (next == ExtPict) {
      emoji = 1;
    } else if (next == Extend && emoji == 1) {
      emoji = 1;
    } else if (next == ZWJ && emoji == 1) {
      emoji = 2;
    } else {
      emoji = 0;
    }
    regional_indicators = next == RegionalIndicator ? regional_indicators + 1 : 0;
    previous = next;
    pos = next_pos;
  }
  return pos;
}

char32_t nfd_first(char32_t cp) {
  std::u32string decomposed;
  append_decomposition(decomposed, cp);
  return decomposed[0];
}

void append_lowercase(std::u32string& out, char32_t cp) {
  if (cp < 128) {
    out.push_back(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    return;
  }
  if (const auto* m = find_mapping(tables::kLowercase, tables::kLowercaseCount, cp)) {
    out.append(tables::kLowercaseData + m->offset, m->length);
  } else {
    out.push_back(cp);
  }
}

char32_t simple_lowercase(char32_t cp) {
  if (cp < 128) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
  const auto* m = find_mapping(tables::kLowercase, tables::kLowercaseCount, cp);
  return m ? tables::kLowercaseData[m->offset] : cp;
}

char32_t byte_to_char(uint8_t byte) { return byte_level_alphabet().byte_to_char[byte]; }

int char_to_byte(char32_t cp) {
  const auto& table = byte_level_alphabet().char_to_byte;
  return cp < table.size() ? table[cp] : -1;
}

}  // namespace splitflow::unicode
