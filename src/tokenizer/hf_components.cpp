// tokenizer/hf_components.cpp — normalizers, pre-tokenizers and decoders of tokenizer.json.
#include "tokenizer/hf_components.h"

#include "core/error.h"
#include "tokenizer/pieces.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <memory>
#include <optional>

namespace splitflow::hf {
namespace {

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct Segment {
  size_t first;
  size_t last;
  bool is_match;
};

// Matches (sorted, non-overlapping) and the gaps between them, covering [0, size).
std::vector<Segment> segments_from_ranges(size_t size, const std::vector<std::pair<size_t, size_t>>& ranges) {
  if (size == 0) return {{0, 0, false}};
  std::vector<Segment> out;
  size_t previous = 0;
  for (const auto& [first, last] : ranges) {
    if (first == last) continue;
    if (previous != first) out.push_back({previous, first, false});
    out.push_back({first, last, true});
    previous = last;
  }
  if (previous != size) out.push_back({previous, size, false});
  return out;
}

// Every character for which `matches` holds is its own match (HF's char-predicate patterns).
template <typename Predicate>
std::vector<Segment> segments_from_chars(std::string_view text, Predicate matches) {
  if (text.empty()) return {{0, 0, false}};
  std::vector<Segment> out;
  size_t gap_start = 0, offset = 0;
  while (offset < text.size()) {
    const size_t start = offset;
    if (matches(unicode::decode_next(text, offset))) {
      if (gap_start < start) out.push_back({gap_start, start, false});
      out.push_back({start, offset, true});
      gap_start = offset;
    }
  }
  if (offset > gap_start) out.push_back({gap_start, offset, false});
  return out;
}

// HF NormalizedString::split: applies the behavior and appends the non-empty results to `out`.
void split_piece(const Piece& piece, std::vector<Segment> segments, SplitBehavior behavior, bool invert, Pieces& out) {
  if (invert) {
    for (auto& s : segments) s.is_match = !s.is_match;
  }
  std::vector<std::pair<size_t, size_t>> kept;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::Removed:
      for (const auto& s : segments) {
        if (!s.is_match) kept.emplace_back(s.first, s.last);
      }
      break;
    case SplitBehavior::Isolated:
      for (const auto& s : segments) kept.emplace_back(s.first, s.last);
      break;
    case SplitBehavior::MergedWithPrevious:
      for (const auto& s : segments) {
        if (s.is_match && !previous_match && !kept.empty()) {
          kept.back().second = s.last;
        } else {
          kept.emplace_back(s.first, s.last);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::MergedWithNext:
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty()) {
          kept.back().first = it->first;
        } else {
          kept.emplace_back(it->first, it->last);
        }
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case SplitBehavior::Contiguous:
      for (const auto& s : segments) {
        if (s.is_match == previous_match && !kept.empty()) {
          kept.back().second = s.last;
        } else {
          kept.emplace_back(s.first, s.last);
        }
        previous_match = s.is_match;
      }
      break;
  }
  for (const auto& [first, last] : kept) {
    if (last > first) out.push_back({piece.text.substr(first, last - first), piece.at_start && first == 0, -1});
  }
}

SplitBehavior parse_behavior(const json& value, const std::string& where) {
  const std::string name = value.is_string() ? value.get<std::string>() : "";
  if (name == "Removed") return SplitBehavior::Removed;
  if (name == "Isolated") return SplitBehavior::Isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (name == "Contiguous") return SplitBehavior::Contiguous;
  fail("{}: unknown split behavior {}", where, value.dump());
}

// HF patterns are {"String": literal} or {"Regex": pattern}; both become a Regex here.
Regex parse_pattern(const json& pattern, const std::string& where) {
  SF_CHECK(pattern.is_object(), "{}: 'pattern' must be an object with 'String' or 'Regex'", where);
  if (pattern.contains("Regex")) return Regex(pattern["Regex"].get<std::string>(), where);
  if (pattern.contains("String")) return Regex(regex_escape(pattern["String"].get<std::string>()), where);
  fail("{}: 'pattern' has neither 'String' nor 'Regex': {}", where, pattern.dump());
}

std::string replace_matches(const Regex& regex, std::string_view text, std::string_view content) {
  std::string out;
  size_t previous = 0;
  for (const auto& [first, last] : regex.find_all(text)) {
    out.append(text.substr(previous, first - previous));
    out.append(content);
    previous = last;
  }
  out.append(text.substr(previous));
  return out;
}

bool is_bert_punctuation(char32_t cp) {
  const bool ascii_punctuation = (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
                                 (cp >= 123 && cp <= 126);
  return ascii_punctuation || unicode::is_punctuation(cp);
}

bool is_chinese_char(char32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

// Maps every code point of `text` through `fn(cp, out)`.
template <typename Fn>
std::string map_code_points(std::string_view text, Fn fn) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) fn(unicode::decode_next(text, i), out);
  return unicode::to_utf8(out);
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) unicode::append_utf8(out, unicode::byte_to_char(static_cast<uint8_t>(c)));
  return out;
}

// A field HF deserializes into a Rust char (Metaspace replacement, CharDelimiterSplit delimiter, Strip
// content): exactly one character, or HF would refuse the file too.
char32_t single_char(const std::string& text, const char* key, const std::string& here) {
  const std::u32string code_points = unicode::to_code_points(text);
  SF_CHECK(code_points.size() == 1, "{}: '{}' must be exactly one character, got '{}'", here, key, text);
  return code_points[0];
}

// Metaspace's replacement (pre-tokenizer and decoder alike), "▁" when absent.
std::string metaspace_replacement(const json& spec, const std::string& here) {
  std::string replacement = value_or<std::string>(spec, "replacement", std::string(kSentencePieceSpace));
  single_char(replacement, "replacement", here);
  return replacement;
}

}  // namespace

std::string base64_decode(std::string_view text, const std::string& where) {
  const auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  std::string out;
  out.reserve(text.size() * 3 / 4);
  uint32_t bits = 0;
  int bit_count = 0;
  for (char c : text) {
    const int v = value(c);
    SF_CHECK(v >= 0, "{}: not base64 (character '{}')", where, c);
    bits = (bits << 6) | uint32_t(v);
    bit_count += 6;
    if (bit_count >= 8) {
      bit_count -= 8;
      out.push_back(char((bits >> bit_count) & 0xFF));
    }
  }
  SF_CHECK(bit_count < 6, "{}: base64 text of a bad length", where);
  return out;
}

PrecompiledCharsmap::PrecompiledCharsmap(std::string_view blob, const std::string& where) {
  SF_CHECK(blob.size() >= 4, "{}: the precompiled charsmap has {} bytes, fewer than its 4-byte header", where,
           blob.size());
  const auto read_u32 = [&](size_t offset) {
    return uint32_t(uint8_t(blob[offset])) | uint32_t(uint8_t(blob[offset + 1])) << 8 |
           uint32_t(uint8_t(blob[offset + 2])) << 16 | uint32_t(uint8_t(blob[offset + 3])) << 24;
  };
  const uint32_t trie_bytes = read_u32(0);
  SF_CHECK(trie_bytes <= blob.size() - 4, "{}: the precompiled charsmap's trie claims {} bytes of {}", where,
           trie_bytes, blob.size() - 4);
  units_.resize(trie_bytes / 4);
  for (size_t i = 0; i < units_.size(); ++i) units_[i] = read_u32(4 + 4 * i);
  normalized_.assign(blob.substr(4 + trie_bytes / 4 * 4));
  SF_CHECK(unicode::is_valid_utf8(normalized_), "{}: the precompiled charsmap's replacement strings are not UTF-8",
           where);
}

// Darts-clone's commonPrefixSearch, keeping the first (shortest) match as spm_precompiled does.
// Units: bit 8 has-leaf, bits 0-7 + bit 31 the label, bits 10-30 the offset (shifted by 8 when
// bit 9 is set), a leaf's low 31 bits the value. An index outside the array ends the search.
std::optional<std::string_view> PrecompiledCharsmap::transform(std::string_view key) const {
  const auto offset = [](uint32_t unit) { return size_t(unit >> 10) << ((unit & (1u << 9)) >> 6); };
  if (units_.empty()) return std::nullopt;
  size_t node = offset(units_[0]);
  for (char c : key) {
    const uint8_t byte = static_cast<uint8_t>(c);
    if (byte == 0) break;
    node ^= byte;
    if (node >= units_.size()) return std::nullopt;
    const uint32_t unit = units_[node];
    if ((unit & ((1u << 31) | 0xFF)) != byte) return std::nullopt;
    node ^= offset(unit);
    if ((unit >> 8) & 1) {
      if (node >= units_.size()) return std::nullopt;
      const size_t first = units_[node] & ((1u << 31) - 1);
      if (first >= normalized_.size()) return std::nullopt;
      const size_t last = normalized_.find('\0', first);
      const std::string_view replacement =
          std::string_view(normalized_).substr(first, (last == std::string::npos ? normalized_.size() : last) - first);
      // A value pointing inside a character would make Rust panic; here it is no match.
      if (!unicode::is_valid_utf8(replacement)) return std::nullopt;
      return replacement;
    }
  }
  return std::nullopt;
}

// spm_precompiled's normalize_string: a grapheme cluster shorter than 6 bytes is looked up whole
// (its shortest mapped prefix replaces all of it), otherwise each character is looked up alone.
std::string PrecompiledCharsmap::normalize(std::string_view text) const {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = unicode::grapheme_end(text, pos);
    const std::string_view grapheme = text.substr(pos, end - pos);
    pos = end;
    if (grapheme.size() < 6) {
      if (const auto replacement = transform(grapheme)) {
        out += *replacement;
        continue;
      }
    }
    for (size_t i = 0; i < grapheme.size();) {
      const size_t start = i;
      unicode::decode_next(grapheme, i);
      const std::string_view character = grapheme.substr(start, i - start);
      const auto replacement = transform(character);
      out += replacement ? *replacement : character;
    }
  }
  return out;
}

std::string type_of(const json& component, const std::string& where) {
  SF_CHECK(component.is_object() && component.contains("type") && component["type"].is_string(),
           "{}: component without a 'type': {}", where, component.dump().substr(0, 200));
  return component["type"].get<std::string>();
}

const json& require(const json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  SF_CHECK(it != object.end(), "{}: missing field '{}'", where, key);
  return *it;
}

bool is_word_char(char32_t cp) {
  return cp == '_' || unicode::is_letter(cp) || unicode::is_mark(cp) ||
         unicode::category(cp) == unicode::Category::Nd || unicode::category(cp) == unicode::Category::Pc;
}

// Bytes of a byte-level piece, or nullopt-like false when a character is outside the alphabet.
bool byte_level_decode(std::string_view piece, std::string& bytes) {
  bytes.clear();
  for (size_t i = 0; i < piece.size();) {
    const int b = unicode::char_to_byte(unicode::decode_next(piece, i));
    if (b < 0) return false;
    bytes.push_back(char(b));
  }
  return true;
}

NormalizeFn parse_normalizer(const json& spec, const std::string& where) {
  const std::string type = type_of(spec, where);
  const std::string here = where + " " + type;
  if (type == "Sequence") {
    std::vector<NormalizeFn> steps;
    for (const auto& step : require(spec, "normalizers", here)) steps.push_back(parse_normalizer(step, where));
    return [steps](std::string& s) {
      for (const auto& step : steps) step(s);
    };
  }
  if (type == "NFC") return [](std::string& s) { s = unicode::to_utf8(unicode::nfc(unicode::to_code_points(s))); };
  if (type == "NFD") return [](std::string& s) { s = unicode::to_utf8(unicode::nfd(unicode::to_code_points(s))); };
  if (type == "NFKC") return [](std::string& s) { s = unicode::to_utf8(unicode::nfkc(unicode::to_code_points(s))); };
  if (type == "NFKD") return [](std::string& s) { s = unicode::to_utf8(unicode::nfkd(unicode::to_code_points(s))); };
  if (type == "Precompiled") {
    const json& charsmap = require(spec, "precompiled_charsmap", here);
    SF_CHECK(charsmap.is_string() || charsmap.is_null(), "{}: 'precompiled_charsmap' must be a base64 string", here);
    const std::string encoded = charsmap.is_string() ? charsmap.get<std::string>() : "";
    if (encoded.empty()) return [](std::string&) {};  // no map: SentencePiece's identity rule
    auto map = std::make_shared<const PrecompiledCharsmap>(base64_decode(encoded, here), here);
    return [map](std::string& s) { s = map->normalize(s); };
  }
  if (type == "Lowercase") {
    return [](std::string& s) { s = map_code_points(s, [](char32_t cp, std::u32string& out) { unicode::append_lowercase(out, cp); }); };
  }
  if (type == "Prepend") {
    const std::string prefix = require(spec, "prepend", here).get<std::string>();
    return [prefix](std::string& s) {
      if (!s.empty()) s.insert(0, prefix);
    };
  }
  if (type == "Replace") {
    auto regex = std::make_shared<Regex>(parse_pattern(require(spec, "pattern", here), here));
    const std::string content = require(spec, "content", here).get<std::string>();
    return [regex, content](std::string& s) { s = replace_matches(*regex, s, content); };
  }
  if (type == "Strip") {
    const bool left = value_or(spec, "strip_left", true), right = value_or(spec, "strip_right", true);
    return [left, right](std::string& s) {
      const std::u32string cps = unicode::to_code_points(s);
      size_t first = 0, last = cps.size();
      while (left && first < last && unicode::is_white_space(cps[first])) ++first;
      while (right && last > first && unicode::is_white_space(cps[last - 1])) --last;
      s = unicode::to_utf8(std::u32string_view(cps).substr(first, last - first));
    };
  }
  if (type == "StripAccents") {
    return [](std::string& s) {
      s = map_code_points(s, [](char32_t cp, std::u32string& out) {
        if (!unicode::is_hf_mark(cp)) out.push_back(cp);
      });
    };
  }
  if (type == "ByteLevel") return [](std::string& s) { s = byte_level_encode(s); };
  if (type == "BertNormalizer") {
    const bool clean_text = value_or(spec, "clean_text", true);
    const bool chinese = value_or(spec, "handle_chinese_chars", true);
    const bool lowercase = value_or(spec, "lowercase", true);
    const bool strip_accents = value_or(spec, "strip_accents", lowercase);
    return [=](std::string& s) {
      std::u32string cps = unicode::to_code_points(s);
      std::u32string out;
      out.reserve(cps.size());
      for (char32_t cp : cps) {
        if (clean_text) {
          const bool whitespace = cp == '\t' || cp == '\n' || cp == '\r' || unicode::is_white_space(cp);
          // HF's is_other() (unicode_categories crate, Unicode 8.0) covers Cc, Cf and Co;
          // unassigned code points are kept.
          const bool control = !(cp == '\t' || cp == '\n' || cp == '\r') && unicode::is_hf_bert_other(cp);
          if (cp == 0 || cp == unicode::kReplacementChar || control) continue;
          if (whitespace) cp = ' ';
        }
        if (chinese && is_chinese_char(cp)) {
          out.push_back(' ');
          out.push_back(cp);
          out.push_back(' ');
        } else {
          out.push_back(cp);
        }
      }
      if (strip_accents) {
        std::u32string kept;
        for (char32_t cp : unicode::nfd(out)) {
          if (!unicode::is_hf_bert_nonspacing_mark(cp)) kept.push_back(cp);
        }
        out = std::move(kept);
      }
      if (lowercase) {
        std::u32string lowered;
        for (char32_t cp : out) unicode::append_lowercase(lowered, cp);
        out = std::move(lowered);
      }
      s = unicode::to_utf8(out);
    };
  }
  fail("{}: normalizer type '{}' is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, Precompiled, Lowercase, "
       "Prepend, Replace, Strip, StripAccents, ByteLevel, BertNormalizer)",
       where, type);
}

const std::string kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

PreTokenizeFn parse_pre_tokenizer(const json& spec, const std::string& where) {
  const std::string type = type_of(spec, where);
  const std::string here = where + " " + type;
  if (type == "Sequence") {
    std::vector<PreTokenizeFn> steps;
    for (const auto& step : require(spec, "pretokenizers", here)) steps.push_back(parse_pre_tokenizer(step, where));
    return [steps](Pieces& pieces) {
      for (const auto& step : steps) step(pieces);
    };
  }
  if (type == "ByteLevel") {
    const bool add_prefix_space = value_or(spec, "add_prefix_space", true);
    const bool use_regex = value_or(spec, "use_regex", true);
    auto regex = std::make_shared<Regex>(kGpt2Pattern, here);
    return [=](Pieces& pieces) {
      split_text_pieces(pieces, [&](const Piece& piece, Pieces& out) {
        Piece p = piece;
        if (add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, " ");
        if (use_regex) {
          split_piece(p, segments_from_ranges(p.text.size(), regex->find_all(p.text)), SplitBehavior::Isolated, false, out);
        } else if (!p.text.empty()) {
          out.push_back(std::move(p));
        }
      });
      for (Piece& p : pieces) {
        if (p.token < 0) p.text = byte_level_encode(p.text);
      }
    };
  }
  if (type == "Split") {
    auto regex = std::make_shared<Regex>(parse_pattern(require(spec, "pattern", here), here));
    const SplitBehavior behavior = parse_behavior(require(spec, "behavior", here), here);
    const bool invert = value_or(spec, "invert", false);
    return [=](Pieces& pieces) {
      split_text_pieces(pieces, [&](const Piece& piece, Pieces& out) {
        split_piece(piece, segments_from_ranges(piece.text.size(), regex->find_all(piece.text)), behavior, invert, out);
      });
    };
  }
  if (type == "Digits") {
    const bool individual = value_or(spec, "individual_digits", false);
    return [=](Pieces& pieces) {
      split_text_pieces(pieces, [&](const Piece& piece, Pieces& out) {
        // Rust's char::is_numeric: any Nd, Nl or No character, not only ASCII digits.
        split_piece(piece, segments_from_chars(piece.text, unicode::is_number),
                    individual ? SplitBehavior::Isolated : SplitBehavior::Contiguous, false, out);
      });
    };
  }
  if (type == "Metaspace") {
    const std::string replacement = metaspace_replacement(spec, here);
    std::string scheme = value_or<std::string>(spec, "prepend_scheme", "");
    if (scheme.empty()) scheme = value_or(spec, "add_prefix_space", true) ? "always" : "never";
    const bool split = value_or(spec, "split", true);
    SF_CHECK(scheme == "always" || scheme == "first" || scheme == "never", "{}: unknown prepend_scheme '{}'", here, scheme);
    const char32_t replacement_cp = unicode::to_code_points(replacement)[0];
    return [=](Pieces& pieces) {
      split_text_pieces(pieces, [&](const Piece& piece, Pieces& out) {
        Piece p{replace_all(piece.text, " ", replacement), piece.at_start, -1};
        const bool starts_with_replacement = p.text.compare(0, replacement.size(), replacement) == 0;
        if (!starts_with_replacement && (scheme == "always" || (scheme == "first" && p.at_start))) {
          p.text.insert(0, replacement);
        }
        if (split) {
          split_piece(p, segments_from_chars(p.text, [&](char32_t cp) { return cp == replacement_cp; }),
                      SplitBehavior::MergedWithNext, false, out);
        } else if (!p.text.empty()) {
          out.push_back(std::move(p));
        }
      });
    };
  }
  if (type == "Whitespace") {
    auto regex = std::make_shared<Regex>(R"(\w+|[^\w\s]+)", here);
    return [=](Pieces& pieces) {
      split_text_pieces(pieces, [&](const Piece& piece, Pieces& out) {
        split_piece(piece, segments_from_ranges(piece.text.size(), regex->find_all(piece.text)), SplitBehavior::Removed,
                    true, out);
      });
    };
  }
  if (type == "WhitespaceSplit") {
    return [](Pieces& pieces) {
      split_text_pieces(pieces, [](const Piece& piece, Pieces& out) {
        split_piece(piece, segments_from_chars(piece.text, unicode::is_white_space), SplitBehavior::Removed, false, out);
      });
    };
  }
  if (type == "BertPreTokenizer") {
    return [](Pieces& pieces) {
      split_text_pieces(pieces, [](const Piece& piece, Pieces& out) {
        split_piece(piece, segments_from_chars(piece.text, unicode::is_white_space), SplitBehavior::Removed, false, out);
      });
      split_text_pieces(pieces, [](const Piece& piece, Pieces& out) {
        split_piece(piece, segments_from_chars(piece.text, is_bert_punctuation), SplitBehavior::Isolated, false, out);
      });
    };
  }
  if (type == "Punctuation") {
    const SplitBehavior behavior =
        spec.contains("behavior") ? parse_behavior(spec["behavior"], here) : SplitBehavior::Isolated;
    return [=](Pieces& pieces) {
      split_text_pieces(pieces, [&](const Piece& piece, Pieces& out) {
        split_piece(piece, segments_from_chars(piece.text, is_bert_punctuation), behavior, false, out);
      });
    };
  }
  if (type == "CharDelimiterSplit") {
    const char32_t delimiter = single_char(require(spec, "delimiter", here).get<std::string>(), "delimiter", here);
    return [=](Pieces& pieces) {
      split_text_pieces(pieces, [&](const Piece& piece, Pieces& out) {
        split_piece(piece, segments_from_chars(piece.text, [&](char32_t cp) { return cp == delimiter; }),
                    SplitBehavior::Removed, false, out);
      });
    };
  }
  fail("{}: pre-tokenizer type '{}' is not supported (supported: Sequence, ByteLevel, Split, Digits, Metaspace, "
       "Whitespace, WhitespaceSplit, BertPreTokenizer, Punctuation, CharDelimiterSplit)",
       where, type);
}

DecodeFn parse_decoder(const json& spec, const std::string& where, DecoderTraits& traits) {
  const std::string type = type_of(spec, where);
  const std::string here = where + " " + type;
  if (type == "Sequence") {
    std::vector<DecodeFn> steps;
    for (const auto& step : require(spec, "decoders", here)) steps.push_back(parse_decoder(step, where, traits));
    return [steps](std::vector<std::string>& tokens) {
      for (const auto& step : steps) step(tokens);
    };
  }
  if (type == "ByteLevel") {
    traits.byte_level = true;
    return [](std::vector<std::string>& tokens) {
      std::string bytes, token_bytes;
      for (const std::string& token : tokens) {
        // A piece with a character outside the alphabet (an added token) contributes its UTF-8.
        bytes += byte_level_decode(token, token_bytes) ? token_bytes : token;
      }
      tokens = {unicode::make_valid_utf8(bytes)};
    };
  }
  if (type == "Replace") {
    auto regex = std::make_shared<Regex>(parse_pattern(require(spec, "pattern", here), here));
    const std::string content = require(spec, "content", here).get<std::string>();
    if (content == " " && spec["pattern"].value("String", "") == kSentencePieceSpace) traits.sentencepiece = true;
    return [regex, content](std::vector<std::string>& tokens) {
      for (auto& token : tokens) token = replace_matches(*regex, token, content);
    };
  }
  if (type == "ByteFallback") {
    traits.sentencepiece = true;
    return [](std::vector<std::string>& tokens) {
      std::vector<std::string> out;
      std::string pending;
      const auto flush = [&] {
        if (pending.empty()) return;
        if (unicode::is_valid_utf8(pending)) {
          out.push_back(pending);
        } else {
          for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
        }
        pending.clear();
      };
      for (auto& token : tokens) {
        const int byte = parse_byte_piece(token);
        if (byte >= 0) {
          pending.push_back(char(byte));
        } else {
          flush();
          out.push_back(std::move(token));
        }
      }
      flush();
      tokens = std::move(out);
    };
  }
  if (type == "Fuse") {
    return [](std::vector<std::string>& tokens) {
      std::string joined;
      for (const auto& token : tokens) joined += token;
      tokens = {joined};
    };
  }
  if (type == "Strip") {
    const char32_t content = single_char(require(spec, "content", here).get<std::string>(), "content", here);
    const size_t start = value_or<size_t>(spec, "start", 0), stop = value_or<size_t>(spec, "stop", 0);
    return [=](std::vector<std::string>& tokens) {
      for (auto& token : tokens) {
        std::u32string cps = unicode::to_code_points(token);
        size_t first = 0, last = cps.size();
        while (first < std::min(start, cps.size()) && cps[first] == content) ++first;
        size_t stripped = 0;
        while (stripped < stop && last > first && cps[last - 1] == content) --last, ++stripped;
        token = unicode::to_utf8(std::u32string_view(cps).substr(first, last - first));
      }
    };
  }
  if (type == "Metaspace") {
    const std::string replacement = metaspace_replacement(spec, here);
    std::string scheme = value_or<std::string>(spec, "prepend_scheme", "");
    if (scheme.empty()) scheme = value_or(spec, "add_prefix_space", true) ? "always" : "never";
    traits.sentencepiece = true;
    return [=](std::vector<std::string>& tokens) {
      for (size_t i = 0; i < tokens.size(); ++i) {
        std::string& token = tokens[i];
        token = replace_all(token, replacement, " ");
        if (i == 0 && scheme != "never" && !token.empty() && token[0] == ' ') token.erase(0, 1);
      }
    };
  }
  if (type == "WordPiece") {
    const std::string prefix = value_or<std::string>(spec, "prefix", "##");
    const bool cleanup = value_or(spec, "cleanup", true);
    traits.wordpiece = true;
    return [=](std::vector<std::string>& tokens) {
      for (size_t i = 0; i < tokens.size(); ++i) {
        std::string& token = tokens[i];
        if (i != 0) {
          if (token.compare(0, prefix.size(), prefix) == 0) {
            token.erase(0, prefix.size());
          } else {
            token.insert(0, " ");
          }
        }
        if (cleanup) {
          static const std::array<std::pair<const char*, const char*>, 11> kCleanups = {{
              {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
              {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
          }};
          for (const auto& [from, to] : kCleanups) token = replace_all(token, from, to);
        }
      }
    };
  }
  if (type == "BPEDecoder") {
    const std::string suffix = value_or<std::string>(spec, "suffix", "</w>");
    return [=](std::vector<std::string>& tokens) {
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = replace_all(tokens[i], suffix, i + 1 == tokens.size() ? "" : " ");
    };
  }
  fail("{}: decoder type '{}' is not supported (supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, "
       "Metaspace, WordPiece, BPEDecoder)",
       where, type);
}

}  // namespace splitflow::hf
