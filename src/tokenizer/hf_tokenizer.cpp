// tokenizer/hf_tokenizer.cpp — HF tokenizer.json. The pipeline and every component mirror HF
// `tokenizers` (0.2x), which is the reference the tests compare against:
//   added tokens (non-normalized) -> normalizer -> added tokens (normalized) -> pre-tokenizer ->
//   model (BPE / WordPiece) per pre-token -> post-processor (only with add_special).
// Decoding: ids -> pieces (special added tokens dropped on request) -> decoder chain.
#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "core/mapped_file.h"
#include "tokenizer/merges.h"
#include "tokenizer/pieces.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <functional>
#include <mutex>

namespace splitflow {
namespace {

using json = nlohmann::json;

// A span of the input on its way through the pipeline. `token` >= 0 marks an added token matched
// in the text (final). `at_start`: the span begins at byte 0 of the input (Metaspace "first").
struct Piece {
  std::string text;
  bool at_start = false;
  int32_t token = -1;
};
using Pieces = std::vector<Piece>;

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

bool is_word_char(char32_t cp) {
  return cp == '_' || unicode::is_letter(cp) || unicode::is_mark(cp) ||
         unicode::category(cp) == unicode::Category::Nd || unicode::category(cp) == unicode::Category::Pc;
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

using NormalizeFn = std::function<void(std::string&)>;
using PreTokenizeFn = std::function<void(Pieces&)>;
using DecodeFn = std::function<void(std::vector<std::string>&)>;

const json& require(const json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  SF_CHECK(it != object.end(), "{}: missing field '{}'", where, key);
  return *it;
}

template <typename T>
T value_or(const json& object, const char* key, T fallback) {
  const auto it = object.find(key);
  return (it == object.end() || it->is_null()) ? fallback : it->get<T>();
}

std::string type_of(const json& component, const std::string& where) {
  SF_CHECK(component.is_object() && component.contains("type") && component["type"].is_string(),
           "{}: component without a 'type': {}", where, component.dump().substr(0, 200));
  return component["type"].get<std::string>();
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
        if (!unicode::is_mark(cp)) out.push_back(cp);
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
          const auto c = unicode::category(cp);
          const bool control = !(cp == '\t' || cp == '\n' || cp == '\r') &&
                               (c == unicode::Category::Cc || c == unicode::Category::Cf ||
                                c == unicode::Category::Cn || c == unicode::Category::Co);
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
          if (unicode::category(cp) != unicode::Category::Mn) kept.push_back(cp);
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
  fail("{}: normalizer type '{}' is not supported (supported: Sequence, NFC, NFD, Lowercase, Prepend, Replace, "
       "Strip, StripAccents, ByteLevel, BertNormalizer)",
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
    const std::string replacement = value_or<std::string>(spec, "replacement", std::string(kSentencePieceSpace));
    std::string scheme = value_or<std::string>(spec, "prepend_scheme", "");
    if (scheme.empty()) scheme = value_or(spec, "add_prefix_space", true) ? "always" : "never";
    const bool split = value_or(spec, "split", true);
    SF_CHECK(scheme == "always" || scheme == "first" || scheme == "never", "{}: unknown prepend_scheme '{}'", here, scheme);
    const char32_t replacement_cp = unicode::to_code_points(replacement).at(0);
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
    const char32_t delimiter = unicode::to_code_points(require(spec, "delimiter", here).get<std::string>()).at(0);
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

DecodeFn parse_decoder(const json& spec, const std::string& where) {
  const std::string type = type_of(spec, where);
  const std::string here = where + " " + type;
  if (type == "Sequence") {
    std::vector<DecodeFn> steps;
    for (const auto& step : require(spec, "decoders", here)) steps.push_back(parse_decoder(step, where));
    return [steps](std::vector<std::string>& tokens) {
      for (const auto& step : steps) step(tokens);
    };
  }
  if (type == "ByteLevel") {
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
    return [regex, content](std::vector<std::string>& tokens) {
      for (auto& token : tokens) token = replace_matches(*regex, token, content);
    };
  }
  if (type == "ByteFallback") {
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
    const char32_t content = unicode::to_code_points(require(spec, "content", here).get<std::string>()).at(0);
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
    const std::string replacement = value_or<std::string>(spec, "replacement", std::string(kSentencePieceSpace));
    std::string scheme = value_or<std::string>(spec, "prepend_scheme", "");
    if (scheme.empty()) scheme = value_or(spec, "add_prefix_space", true) ? "always" : "never";
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

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
  bool single_word;
  bool lstrip;
  bool rstrip;
  bool normalized;
};

// Finds added tokens in text: leftmost match, longest at that position, non-overlapping (the
// aho-corasick LeftmostLongest search HF uses).
class AddedTokenMatcher {
 public:
  void add(std::string pattern, const AddedToken* token) {
    if (pattern.empty()) return;
    auto& bucket = by_first_byte_[static_cast<uint8_t>(pattern[0])];
    bucket.push_back({std::move(pattern), token});
    std::stable_sort(bucket.begin(), bucket.end(),
                     [](const Entry& a, const Entry& b) { return a.pattern.size() > b.pattern.size(); });
    empty_ = false;
  }
  bool empty() const { return empty_; }

  struct Match {
    size_t first;
    size_t last;
    const AddedToken* token;
  };
  std::vector<Match> find_all(std::string_view text) const {
    std::vector<Match> matches;
    for (size_t i = 0; i < text.size();) {
      const Entry* found = nullptr;
      for (const Entry& entry : by_first_byte_[static_cast<uint8_t>(text[i])]) {
        if (text.compare(i, entry.pattern.size(), entry.pattern) == 0) {
          found = &entry;
          break;
        }
      }
      if (found) {
        matches.push_back({i, i + found->pattern.size(), found->token});
        i += found->pattern.size();
      } else {
        ++i;
      }
    }
    return matches;
  }

 private:
  struct Entry {
    std::string pattern;
    const AddedToken* token;
  };
  std::array<std::vector<Entry>, 256> by_first_byte_;
  bool empty_ = true;
};

// HF AddedVocabulary::split_with_indices on one piece.
void split_added_tokens(const Piece& piece, const AddedTokenMatcher& matcher, Pieces& out) {
  const std::string& text = piece.text;
  size_t start_offset = 0;
  const auto emit_text = [&](size_t first, size_t last) {
    if (last > first) out.push_back({text.substr(first, last - first), piece.at_start && first == 0, -1});
  };
  for (const auto& match : matcher.find_all(text)) {
    size_t start = match.first, stop = match.last;
    const AddedToken& token = *match.token;
    if (token.single_word) {
      size_t before = start;
      bool word_before = false, word_after = false;
      if (start > 0) {
        while (before > 0 && (static_cast<uint8_t>(text[before - 1]) & 0xC0) == 0x80) --before;
        size_t i = before - 1;
        while (i > 0 && (static_cast<uint8_t>(text[i]) & 0xC0) == 0x80) --i;
        size_t probe = i;
        word_before = is_word_char(unicode::decode_next(text, probe));
      }
      if (stop < text.size()) {
        size_t probe = stop;
        word_after = is_word_char(unicode::decode_next(text, probe));
      }
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      // Whitespace right before the token joins it, unless an earlier match already took it.
      size_t new_start = start;
      while (new_start > 0) {
        size_t lead = new_start - 1;
        while (lead > 0 && (static_cast<uint8_t>(text[lead]) & 0xC0) == 0x80) --lead;
        size_t probe = lead;
        if (!unicode::is_white_space(unicode::decode_next(text, probe))) break;
        new_start = lead;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t probe = stop;
        if (!unicode::is_white_space(unicode::decode_next(text, probe))) break;
        stop = probe;
      }
    }
    if (start_offset < start) emit_text(start_offset, start);
    out.push_back({text.substr(start, stop - start), piece.at_start && start == 0, token.id});
    start_offset = stop;
  }
  emit_text(start_offset, text.size());
}

// tokenizer.json read with a SAX handler: the model's vocab and merges (the bulk of a 10 MB file)
// go straight into flat vectors instead of a JSON DOM; everything else becomes a DOM as usual.
struct TokenizerJson {
  json root;
  std::vector<std::pair<std::string, int64_t>> vocab;  // model.vocab when it is an object
  bool vocab_is_object = false;
  std::vector<std::string> merge_texts;                     // model.merges as "left right"
  std::vector<std::pair<std::string, std::string>> merge_pairs;  // model.merges as [left, right]
  bool merges_seen = false;
};

class TokenizerJsonReader : public nlohmann::json_sax<json> {
 public:
  explicit TokenizerJsonReader(TokenizerJson& out) : out_(out) {}

  bool null() override { return value(nullptr); }
  bool boolean(bool v) override { return value(v); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::Vocab) {
      out_.vocab.emplace_back(std::move(key_), v);
      return true;
    }
    return value(v);
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::Vocab) {
      out_.vocab.emplace_back(std::move(key_), int64_t(v));
      return true;
    }
    return value(v);
  }
  bool number_float(number_float_t v, const string_t&) override { return value(v); }
  bool string(string_t& v) override {
    if (mode_ == Mode::Merges) {
      out_.merge_texts.push_back(std::move(v));
      return true;
    }
    if (mode_ == Mode::MergePair) {
      pair_.push_back(std::move(v));
      return true;
    }
    return value(std::move(v));
  }
  bool binary(binary_t&) override { return false; }
  bool start_object(std::size_t) override {
    if (mode_ == Mode::None && in_model() && key_ == "vocab") {
      place(json::object());  // an empty placeholder; the entries go to `vocab`
      mode_ = Mode::Vocab;
      out_.vocab_is_object = true;
      return true;
    }
    if (mode_ != Mode::None) return false;  // unexpected structure inside vocab/merges
    json* slot = place(json::object());
    stack_.push_back(slot);
    return true;
  }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    if (mode_ == Mode::Vocab) {
      mode_ = Mode::None;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::None && in_model() && key_ == "merges") {
      place(json::array());
      mode_ = Mode::Merges;
      out_.merges_seen = true;
      return true;
    }
    if (mode_ == Mode::Merges) {
      mode_ = Mode::MergePair;
      pair_.clear();
      return true;
    }
    if (mode_ != Mode::None) return false;
    json* slot = place(json::array());
    stack_.push_back(slot);
    return true;
  }
  bool end_array() override {
    if (mode_ == Mode::MergePair) {
      if (pair_.size() != 2) return false;
      out_.merge_pairs.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      mode_ = Mode::Merges;
      return true;
    }
    if (mode_ == Mode::Merges) {
      mode_ = Mode::None;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& error) override {
    error_ = fmt::format("{} (byte {})", error.what(), position);
    return false;
  }
  const std::string& error() const { return error_; }

 private:
  enum class Mode { None, Vocab, Merges, MergePair };
  // Directly inside the top-level "model" object.
  bool in_model() const { return stack_.size() == 2 && model_ == stack_[1]; }
  json* place(json v) {
    json* slot;
    if (stack_.empty()) {
      out_.root = std::move(v);
      slot = &out_.root;
    } else if (stack_.back()->is_object()) {
      slot = &(*stack_.back())[key_];
      *slot = std::move(v);
      if (stack_.size() == 1 && key_ == "model") model_ = slot;
    } else {
      stack_.back()->push_back(std::move(v));
      slot = &stack_.back()->back();
    }
    return slot;
  }
  bool value(json v) {
    if (mode_ != Mode::None) return false;
    place(std::move(v));
    return true;
  }

  TokenizerJson& out_;
  std::vector<json*> stack_;
  const json* model_ = nullptr;
  std::string key_;
  Mode mode_ = Mode::None;
  std::vector<std::string> pair_;
  std::string error_;
};

enum class ModelType { Bpe, WordPiece };

// What the decoder makes of single pieces, for token_bytes().
enum class PieceStyle { ByteLevel, SentencePiece, WordPiece, Plain };

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(TokenizerJson& parsed, const std::string& path, const json& config, const json& generation_config);

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override;
  std::string token_bytes(int32_t id) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override;
  int32_t vocab_size() const override { return int32_t(id_to_piece_.size()); }
  bool is_special(int32_t id) const override {
    return id >= 0 && size_t(id) < special_.size() && special_[id];
  }
  int32_t bos_id() const override { return bos_id_; }
  std::vector<int32_t> eos_ids() const override { return eos_ids_; }
  int32_t token_id(std::string_view piece) const override {
    const int32_t added = find_id(added_by_content_, piece);
    return added >= 0 ? added : find_id(vocab_, piece);
  }

 private:
  void load_model(const json& model, TokenizerJson& parsed, const std::string& where);
  void load_post_processor(const json& spec, const std::string& where);
  void tokenize_word(const std::string& word, std::vector<int32_t>& out) const;
  void bpe_word(const std::string& word, std::vector<int32_t>& out) const;
  void wordpiece_word(const std::string& word, std::vector<int32_t>& out) const;
  int32_t config_token(const json& config, const char* key) const;

  std::string path_;
  ModelType model_type_ = ModelType::Bpe;
  PieceIdMap vocab_;                     // model vocabulary: piece -> id
  std::vector<std::string> id_to_piece_;  // model pieces and added-token contents, by id
  std::vector<bool> special_;            // by id: a special added token
  int32_t unk_id_ = -1;
  // BPE
  RankMerges merges_;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  std::array<int32_t, 256> byte_piece_ids_{};
  // WordPiece
  size_t max_input_chars_per_word_ = 100;
  // Added tokens.
  std::vector<AddedToken> added_tokens_;
  PieceIdMap added_by_content_;
  AddedTokenMatcher raw_matcher_;         // normalized: false — matched in the raw text
  AddedTokenMatcher normalized_matcher_;  // normalized: true — matched after normalization
  // Pipeline.
  NormalizeFn normalizer_;
  PreTokenizeFn pre_tokenizer_;
  DecodeFn decoder_;
  PieceStyle piece_style_ = PieceStyle::Plain;
  std::vector<int32_t> special_prefix_;  // what the post-processor puts around one sequence
  std::vector<int32_t> special_suffix_;
  int32_t bos_id_ = -1;
  std::vector<int32_t> eos_ids_;
  // Word cache: pre-token -> ids (HF caches the same way); bounded, cleared when full.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

constexpr size_t kCacheMaxEntries = 200000;
constexpr size_t kCacheMaxWordBytes = 64;

HfTokenizer::HfTokenizer(TokenizerJson& parsed, const std::string& path, const json& config,
                         const json& generation_config)
    : path_(path) {
  const json& root = parsed.root;
  SF_CHECK(root.is_object(), "'{}': the top level is not a JSON object", path);
  load_model(require(root, "model", "'" + path + "'"), parsed, "'" + path + "' model");

  const auto added = root.find("added_tokens");
  if (added != root.end() && added->is_array()) {
    added_tokens_.reserve(added->size());
    for (const auto& entry : *added) {
      const std::string where = fmt::format("'{}' added_tokens", path);
      AddedToken token{require(entry, "content", where).get<std::string>(), require(entry, "id", where).get<int32_t>(),
                       value_or(entry, "special", false), value_or(entry, "single_word", false),
                       value_or(entry, "lstrip", false), value_or(entry, "rstrip", false),
                       value_or(entry, "normalized", false)};
      SF_CHECK(token.id >= 0, "{}: token '{}' has negative id {}", where, token.content, token.id);
      added_tokens_.push_back(std::move(token));
    }
  }
  for (const AddedToken& token : added_tokens_) {
    if (size_t(token.id) >= id_to_piece_.size()) id_to_piece_.resize(token.id + 1);
    id_to_piece_[token.id] = token.content;
    added_by_content_.assign(token.content, token.id);
  }
  special_.assign(id_to_piece_.size(), false);
  for (const AddedToken& token : added_tokens_) special_[token.id] = special_[token.id] || token.special;

  const std::string where = "'" + path + "'";
  if (root.contains("normalizer") && !root["normalizer"].is_null()) {
    normalizer_ = parse_normalizer(root["normalizer"], where + " normalizer");
  }
  if (root.contains("pre_tokenizer") && !root["pre_tokenizer"].is_null()) {
    pre_tokenizer_ = parse_pre_tokenizer(root["pre_tokenizer"], where + " pre_tokenizer");
  }
  if (root.contains("decoder") && !root["decoder"].is_null()) {
    decoder_ = parse_decoder(root["decoder"], where + " decoder");
    const std::string dump = root["decoder"].dump();
    if (dump.find("\"ByteLevel\"") != std::string::npos) {
      piece_style_ = PieceStyle::ByteLevel;
    } else if (dump.find("\"WordPiece\"") != std::string::npos) {
      piece_style_ = PieceStyle::WordPiece;
    } else if (dump.find("\\u2581") != std::string::npos || dump.find(kSentencePieceSpace) != std::string::npos ||
               dump.find("\"Metaspace\"") != std::string::npos) {
      piece_style_ = PieceStyle::SentencePiece;
    }
  }
  // Added tokens are matched in the raw text, or (normalized: true) in normalized pieces, where
  // their pattern is their normalized content.
  for (const AddedToken& token : added_tokens_) {
    if (token.normalized && normalizer_) {
      std::string pattern = token.content;
      normalizer_(pattern);
      normalized_matcher_.add(std::move(pattern), &token);
    } else if (token.normalized) {
      normalized_matcher_.add(token.content, &token);
    } else {
      raw_matcher_.add(token.content, &token);
    }
  }

  if (root.contains("post_processor") && !root["post_processor"].is_null()) {
    load_post_processor(root["post_processor"], where + " post_processor");
  } else if (config.is_object()) {
    // No post-processor: transformers builds one from add_bos_token / add_eos_token.
    if (value_or(config, "add_bos_token", false)) {
      const int32_t bos = config_token(config, "bos_token");
      if (bos >= 0) special_prefix_.push_back(bos);
    }
    if (value_or(config, "add_eos_token", false)) {
      const int32_t eos = config_token(config, "eos_token");
      if (eos >= 0) special_suffix_.push_back(eos);
    }
  }

  bos_id_ = config_token(config, "bos_token");
  if (bos_id_ < 0 && !special_prefix_.empty()) bos_id_ = special_prefix_.front();
  if (const int32_t eos = config_token(config, "eos_token"); eos >= 0) eos_ids_.push_back(eos);
  if (generation_config.is_object() && generation_config.contains("eos_token_id")) {
    const json& ids = generation_config["eos_token_id"];
    const auto add_eos = [&](const json& id) {
      if (id.is_number_integer() && std::find(eos_ids_.begin(), eos_ids_.end(), id.get<int32_t>()) == eos_ids_.end()) {
        eos_ids_.push_back(id.get<int32_t>());
      }
    };
    if (ids.is_array()) {
      for (const auto& id : ids) add_eos(id);
    } else {
      add_eos(ids);
    }
  }
}

// tokenizer_config.json names special tokens as a string or as {"content": ...}; -1 when absent.
int32_t HfTokenizer::config_token(const json& config, const char* key) const {
  if (!config.is_object() || !config.contains(key)) return -1;
  const json& value = config[key];
  std::string content;
  if (value.is_string()) {
    content = value.get<std::string>();
  } else if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    content = value["content"].get<std::string>();
  } else {
    return -1;
  }
  return token_id(content);
}

void HfTokenizer::load_model(const json& model, TokenizerJson& parsed, const std::string& where) {
  SF_CHECK(model.is_object(), "{}: not an object", where);
  std::string type = value_or<std::string>(model, "type", "");
  if (type.empty()) {
    // Old files omit the type; BPE is the one with merges.
    type = model.contains("merges") ? "BPE" : model.contains("vocab") && model["vocab"].is_object() ? "WordPiece" : "";
  }
  SF_CHECK(model.contains("vocab"), "{}: missing field 'vocab'", where);
  if (type == "BPE" || type == "WordPiece") {
    SF_CHECK(parsed.vocab_is_object, "{}: 'vocab' must be an object of piece -> id", where);
    vocab_.reserve(parsed.vocab.size());
    int64_t max_id = -1;
    for (const auto& [piece, id] : parsed.vocab) {
      SF_CHECK(id >= 0 && id < (int64_t(1) << 31), "{}: vocab entry '{}' has a bad id {}", where, piece, id);
      vocab_.assign(piece, int32_t(id));
      max_id = std::max(max_id, id);
    }
    id_to_piece_.resize(size_t(max_id + 1));
    for (auto& [piece, id] : parsed.vocab) id_to_piece_[id] = std::move(piece);
    parsed.vocab.clear();
  }
  const auto unk = model.find("unk_token");
  if (unk != model.end() && unk->is_string()) unk_id_ = find_id(vocab_, unk->get<std::string>());

  if (type == "BPE") {
    model_type_ = ModelType::Bpe;
    byte_fallback_ = value_or(model, "byte_fallback", false);
    fuse_unk_ = value_or(model, "fuse_unk", false);
    ignore_merges_ = value_or(model, "ignore_merges", false);
    continuing_subword_prefix_ = value_or<std::string>(model, "continuing_subword_prefix", "");
    end_of_word_suffix_ = value_or<std::string>(model, "end_of_word_suffix", "");
    SF_CHECK(value_or(model, "dropout", 0.0) == 0.0, "{}: BPE dropout is not supported (it makes encoding random)",
             where);
    for (int b = 0; b < 256; ++b) byte_piece_ids_[b] = find_id(vocab_, byte_piece(uint8_t(b)));
    SF_CHECK(parsed.merges_seen, "{}: BPE model without 'merges'", where);
    const size_t merge_count = parsed.merge_texts.size() + parsed.merge_pairs.size();
    SF_CHECK(parsed.merge_texts.empty() || parsed.merge_pairs.empty(),
             "{}: 'merges' mixes \"a b\" strings and [a, b] pairs", where);
    std::string left, right;
    for (size_t i = 0; i < merge_count; ++i) {
      if (!parsed.merge_texts.empty()) {
        const std::string& text = parsed.merge_texts[i];
        const size_t space = text.find(' ', 1);
        SF_CHECK(space != std::string::npos, "{}: merge {} '{}' is not 'left right'", where, i, text);
        left.assign(text, 0, space);
        right.assign(text, space + 1);
      } else {
        left = std::move(parsed.merge_pairs[i].first);
        right = std::move(parsed.merge_pairs[i].second);
      }
      const int32_t left_id = find_id(vocab_, left), right_id = find_id(vocab_, right);
      // A right piece carries the continuing-subword prefix, which the merged piece does not repeat.
      std::string_view right_rest = right;
      if (!continuing_subword_prefix_.empty() && right_rest.starts_with(continuing_subword_prefix_)) {
        right_rest.remove_prefix(continuing_subword_prefix_.size());
      }
      const std::string merged = left + std::string(right_rest);
      const int32_t merged_id = find_id(vocab_, merged);
      SF_CHECK(left_id >= 0 && right_id >= 0, "{}: merge {} '{} {}' uses a piece missing from the vocab", where, i,
               left, right);
      SF_CHECK(merged_id >= 0, "{}: merge {} '{} {}' makes '{}', which is missing from the vocab", where, i, left,
               right, merged);
      merges_.add(left_id, right_id, merged_id);
    }
    parsed.merge_texts.clear();
    parsed.merge_pairs.clear();
  } else if (type == "WordPiece") {
    model_type_ = ModelType::WordPiece;
    continuing_subword_prefix_ = value_or<std::string>(model, "continuing_subword_prefix", "##");
    max_input_chars_per_word_ = value_or<size_t>(model, "max_input_chars_per_word", 100);
    SF_CHECK(unk_id_ >= 0, "{}: WordPiece needs an 'unk_token' that is in the vocab", where);
  } else {
    fail("{}: model type '{}' is not supported (supported: BPE, WordPiece)", where, type);
  }
}

void HfTokenizer::load_post_processor(const json& spec, const std::string& where) {
  const std::string type = type_of(spec, where);
  const auto special_id = [&](const json& pair) {
    SF_CHECK(pair.is_array() && pair.size() == 2 && pair[1].is_number_integer(),
             "{} {}: expected [token, id], got {}", where, type, pair.dump());
    return pair[1].get<int32_t>();
  };
  if (type == "Sequence") {
    for (const auto& step : require(spec, "processors", where)) load_post_processor(step, where);
  } else if (type == "TemplateProcessing") {
    const json& single = require(spec, "single", where);
    const json& specials = value_or<json>(spec, "special_tokens", json::object());
    std::vector<int32_t> prefix, suffix;
    bool seen_sequence = false;
    for (const auto& item : single) {
      if (item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      const std::string name = require(require(item, "SpecialToken", where), "id", where).get<std::string>();
      const auto it = specials.find(name);
      SF_CHECK(it != specials.end(), "{} TemplateProcessing: special token '{}' is not in special_tokens", where, name);
      for (const auto& id : require(*it, "ids", where)) (seen_sequence ? suffix : prefix).push_back(id.get<int32_t>());
    }
    special_prefix_.insert(special_prefix_.begin(), prefix.begin(), prefix.end());
    special_suffix_.insert(special_suffix_.end(), suffix.begin(), suffix.end());
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    special_prefix_.insert(special_prefix_.begin(), special_id(require(spec, "cls", where)));
    special_suffix_.push_back(special_id(require(spec, "sep", where)));
  } else if (type != "ByteLevel") {
    fail("{}: post-processor type '{}' is not supported (supported: TemplateProcessing, ByteLevel, RobertaProcessing, "
         "BertProcessing, Sequence)",
         where, type);
  }
}

void HfTokenizer::bpe_word(const std::string& word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    const int32_t id = find_id(vocab_, word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  // Unknown characters become one unk each, or one for a run when fuse_unk is set.
  bool pending_unk = false;
  std::string piece;
  for (size_t offset = 0; offset < word.size();) {
    const size_t start = offset;
    unicode::decode_next(word, offset);
    const std::string_view ch(word.data() + start, offset - start);
    int32_t id;
    if (continuing_subword_prefix_.empty() && end_of_word_suffix_.empty()) {
      id = find_id(vocab_, ch);
    } else {
      piece.clear();
      if (start != 0) piece += continuing_subword_prefix_;
      piece += ch;
      if (offset == word.size()) piece += end_of_word_suffix_;
      id = find_id(vocab_, piece);
    }
    if (id >= 0) {
      if (pending_unk) symbols.push_back(unk_id_), pending_unk = false;
      symbols.push_back(id);
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (char c : ch) all_bytes = all_bytes && byte_piece_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all_bytes) {
        if (pending_unk) symbols.push_back(unk_id_), pending_unk = false;
        for (char c : ch) symbols.push_back(byte_piece_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_ < 0) continue;  // no unk token: HF drops the character
    if (pending_unk && !fuse_unk_) symbols.push_back(unk_id_);
    pending_unk = true;
  }
  if (pending_unk) symbols.push_back(unk_id_);
  merges_.apply(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

void HfTokenizer::wordpiece_word(const std::string& word, std::vector<int32_t>& out) const {
  const std::u32string cps = unicode::to_code_points(word);
  if (cps.size() > max_input_chars_per_word_) {
    out.push_back(unk_id_);
    return;
  }
  std::vector<int32_t> pieces;
  std::string candidate;
  size_t start = 0;
  while (start < word.size()) {
    size_t end = word.size();
    int32_t found = -1;
    while (start < end) {
      candidate.assign(start > 0 ? continuing_subword_prefix_ : "");
      candidate.append(word, start, end - start);
      found = find_id(vocab_, candidate);
      if (found >= 0) break;
      do --end; while (end > start && (static_cast<uint8_t>(word[end]) & 0xC0) == 0x80);
    }
    if (found < 0) {
      out.push_back(unk_id_);
      return;
    }
    pieces.push_back(found);
    start = end;
  }
  out.insert(out.end(), pieces.begin(), pieces.end());
}

void HfTokenizer::tokenize_word(const std::string& word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    const auto it = cache_.find(std::string_view(word));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t before = out.size();
  if (model_type_ == ModelType::Bpe) {
    bpe_word(word, out);
  } else {
    wordpiece_word(word, out);
  }
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() >= kCacheMaxEntries) cache_.clear();
    cache_.emplace(word, std::vector<int32_t>(out.begin() + before, out.end()));
  }
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool add_special) const {
  Pieces pieces;
  {
    Piece whole{unicode::make_valid_utf8(text), true, -1};
    if (raw_matcher_.empty()) {
      if (!whole.text.empty()) pieces.push_back(std::move(whole));
    } else {
      split_added_tokens(whole, raw_matcher_, pieces);
    }
  }
  if (normalizer_ || !normalized_matcher_.empty()) {
    split_text_pieces(pieces, [&](const Piece& piece, Pieces& out) {
      Piece normalized = piece;
      if (normalizer_) normalizer_(normalized.text);
      if (normalized.text.empty()) return;
      if (normalized_matcher_.empty()) {
        out.push_back(std::move(normalized));
      } else {
        split_added_tokens(normalized, normalized_matcher_, out);
      }
    });
  }
  if (pre_tokenizer_) pre_tokenizer_(pieces);

  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + special_prefix_.size() + special_suffix_.size());
  if (add_special) ids.insert(ids.end(), special_prefix_.begin(), special_prefix_.end());
  for (const Piece& piece : pieces) {
    if (piece.token >= 0) {
      ids.push_back(piece.token);
    } else {
      tokenize_word(piece.text, ids);
    }
  }
  if (add_special) ids.insert(ids.end(), special_suffix_.begin(), special_suffix_.end());
  return ids;
}

std::string HfTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || size_t(id) >= id_to_piece_.size()) return "";
  const std::string& piece = id_to_piece_[id];
  if (special_[id]) return piece;
  switch (piece_style_) {
    case PieceStyle::ByteLevel: {
      std::string bytes;
      return byte_level_decode(piece, bytes) ? bytes : piece;
    }
    case PieceStyle::SentencePiece: {
      const int byte = parse_byte_piece(piece);
      if (byte >= 0) return std::string(1, char(byte));
      return replace_all(piece, kSentencePieceSpace, " ");
    }
    case PieceStyle::WordPiece:
      if (piece.compare(0, continuing_subword_prefix_.size(), continuing_subword_prefix_) == 0) {
        return piece.substr(continuing_subword_prefix_.size());
      }
      return " " + piece;
    case PieceStyle::Plain:
      break;
  }
  return piece;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= id_to_piece_.size()) continue;  // HF skips ids it does not know
    if (skip_special && special_[id]) continue;
    tokens.push_back(id_to_piece_[id]);
  }
  if (!decoder_) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  decoder_(tokens);
  std::string out;
  for (const auto& token : tokens) out += token;
  return out;
}

json read_optional_json(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) return json();
  try {
    return json::parse(read_text_file(path.string()));
  } catch (const json::exception& error) {
    fail("'{}': not valid JSON: {}", path.string(), error.what());
  }
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& tokenizer_json_path) {
  SF_CHECK(std::filesystem::exists(tokenizer_json_path), "tokenizer file '{}' does not exist", tokenizer_json_path);
  SF_CHECK(!std::filesystem::is_directory(tokenizer_json_path),
           "'{}' is a directory; expected the path of a tokenizer.json", tokenizer_json_path);
  TokenizerJson parsed;
  {
    const std::string text = read_text_file(tokenizer_json_path);
    TokenizerJsonReader reader(parsed);
    const bool ok = json::sax_parse(text, &reader);
    SF_CHECK(ok, "'{}': not valid JSON{}{}", tokenizer_json_path, reader.error().empty() ? "" : ": ", reader.error());
  }
  const auto directory = std::filesystem::path(tokenizer_json_path).parent_path();
  const json config = read_optional_json(directory / "tokenizer_config.json");
  const json generation_config = read_optional_json(directory / "generation_config.json");
  try {
    return std::make_unique<HfTokenizer>(parsed, tokenizer_json_path, config, generation_config);
  } catch (const json::exception& error) {
    fail("'{}': unexpected value in tokenizer.json: {}", tokenizer_json_path, error.what());
  }
}

}  // namespace splitflow
