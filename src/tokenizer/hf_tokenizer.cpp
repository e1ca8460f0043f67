// tokenizer/hf_tokenizer.cpp — HF tokenizer.json. The pipeline and every component mirror HF
// `tokenizers` (0.2x), which is the reference the tests compare against:
//   added tokens (non-normalized) -> normalizer -> added tokens (normalized) -> pre-tokenizer ->
//   model (BPE / WordPiece / Unigram) per pre-token -> post-processor (only with add_special).
// Decoding: ids -> pieces (special added tokens dropped on request) -> decoder chain.
#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "core/mapped_file.h"
#include "tokenizer/hf_components.h"
#include "tokenizer/merges.h"
#include "tokenizer/pieces.h"
#include "tokenizer/unicode.h"
#include "tokenizer/unigram.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <functional>
#include <mutex>

namespace splitflow {
namespace {

using hf::json;
using hf::Piece;
using hf::Pieces;
using hf::require;
using hf::type_of;
using hf::value_or;

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
        word_before = hf::is_word_char(unicode::decode_next(text, probe));
      }
      if (stop < text.size()) {
        size_t probe = stop;
        word_after = hf::is_word_char(unicode::decode_next(text, probe));
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

enum class ModelType { Bpe, WordPiece, Unigram };


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
  void load_model(const json& model, TokenizerJson& parsed, int64_t id_limit, const std::string& where);
  void load_post_processor(const json& spec, const std::string& where);
  void tokenize_word(const std::string& word, std::vector<int32_t>& out) const;
  void bpe_word(const std::string& word, std::vector<int32_t>& out) const;
  void wordpiece_word(const std::string& word, std::vector<int32_t>& out) const;
  void load_unigram(const json& model, const std::string& where);
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
  // Unigram
  std::unique_ptr<UnigramModel> unigram_;
  // Added tokens.
  std::vector<AddedToken> added_tokens_;
  PieceIdMap added_by_content_;
  AddedTokenMatcher raw_matcher_;         // normalized: false — matched in the raw text
  AddedTokenMatcher normalized_matcher_;  // normalized: true — matched after normalization
  // Pipeline.
  hf::NormalizeFn normalizer_;
  hf::PreTokenizeFn pre_tokenizer_;
  hf::DecodeFn decoder_;
  hf::DecoderTraits decoder_traits_;
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
  // Ids index tables sized by the largest id, so every id must lie below the number of entries that
  // can carry one: HF files number vocab pieces and added tokens densely from 0 (an added token may
  // repeat a vocab id), and a larger id would size a table by what the file claims, not holds.
  const auto added = root.find("added_tokens");
  const size_t added_count = added != root.end() && added->is_array() ? added->size() : 0;
  // A Unigram vocab is an array of [piece, score] (kept in the DOM); BPE and WordPiece's an object.
  size_t vocab_count = parsed.vocab.size();
  if (const auto model = root.find("model"); model != root.end() && model->is_object()) {
    if (const auto vocab = model->find("vocab"); vocab != model->end() && vocab->is_array()) vocab_count = vocab->size();
  }
  const int64_t id_limit = int64_t(vocab_count + added_count);
  load_model(require(root, "model", "'" + path + "'"), parsed, id_limit, "'" + path + "' model");

  if (added_count > 0) {
    added_tokens_.reserve(added_count);
    std::unordered_map<int32_t, size_t> added_index_by_id;
    for (const auto& entry : *added) {
      const std::string where = fmt::format("'{}' added_tokens", path);
      const std::string content = require(entry, "content", where).get<std::string>();
      const json& id = require(entry, "id", where);
      SF_CHECK(id.is_number_integer() && id >= 0 && id < id_limit,
               "{}: token '{}' has a bad id {} (ids must lie in [0, {}), the number of vocab entries plus added tokens)",
               where, content, id.dump(), id_limit);
      AddedToken token{content, id.get<int32_t>(), value_or(entry, "special", false), value_or(entry, "single_word", false),
                       value_or(entry, "lstrip", false), value_or(entry, "rstrip", false),
                       value_or(entry, "normalized", false)};
      const auto [other, inserted] = added_index_by_id.emplace(token.id, added_tokens_.size());
      SF_CHECK(inserted || added_tokens_[other->second].content == token.content, "{}: tokens '{}' and '{}' share id {}",
               where, added_tokens_[other->second].content, token.content, token.id);
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
    normalizer_ = hf::parse_normalizer(root["normalizer"], where + " normalizer");
  }
  if (root.contains("pre_tokenizer") && !root["pre_tokenizer"].is_null()) {
    pre_tokenizer_ = hf::parse_pre_tokenizer(root["pre_tokenizer"], where + " pre_tokenizer");
  }
  if (root.contains("decoder") && !root["decoder"].is_null()) {
    decoder_ = hf::parse_decoder(root["decoder"], where + " decoder", decoder_traits_);
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
      if (!id.is_number_integer()) return;
      // A stop id the model can never produce, or one past int32, is a damaged file, not a stop.
      SF_CHECK(id >= 0 && id < int64_t(id_to_piece_.size()),
               "'{}': generation_config.json eos_token_id {} is outside the vocabulary [0, {})", path, id.dump(),
               id_to_piece_.size());
      if (std::find(eos_ids_.begin(), eos_ids_.end(), id.get<int32_t>()) == eos_ids_.end()) {
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

void HfTokenizer::load_model(const json& model, TokenizerJson& parsed, int64_t id_limit, const std::string& where) {
  SF_CHECK(model.is_object(), "{}: not an object", where);
  std::string type = value_or<std::string>(model, "type", "");
  if (type.empty()) {
    // Old files omit the type; BPE is the one with merges, Unigram the one with a vocab of pairs.
    type = model.contains("merges")                                   ? "BPE"
           : model.contains("vocab") && model["vocab"].is_object()   ? "WordPiece"
           : model.contains("vocab") && model["vocab"].is_array()    ? "Unigram"
                                                                      : "";
  }
  SF_CHECK(model.contains("vocab"), "{}: missing field 'vocab'", where);
  if (type == "BPE" || type == "WordPiece") {
    SF_CHECK(parsed.vocab_is_object, "{}: 'vocab' must be an object of piece -> id", where);
    vocab_.reserve(parsed.vocab.size());
    int64_t max_id = -1;
    for (const auto& [piece, id] : parsed.vocab) {
      SF_CHECK(id >= 0 && id < id_limit,
               "{}: vocab entry '{}' has a bad id {} (ids must lie in [0, {}), the number of vocab entries plus added "
               "tokens)",
               where, piece, id, id_limit);
      vocab_.assign(piece, int32_t(id));
      max_id = std::max(max_id, id);
    }
    id_to_piece_.resize(size_t(max_id + 1));
    std::vector<bool> id_taken(id_to_piece_.size(), false);
    for (auto& [piece, id] : parsed.vocab) {
      SF_CHECK(!id_taken[id], "{}: vocab entries '{}' and '{}' share id {}", where, id_to_piece_[id], piece, id);
      id_taken[id] = true;
      id_to_piece_[id] = std::move(piece);
    }
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
    merges_.reserve(merge_count);
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
  } else if (type == "Unigram") {
    model_type_ = ModelType::Unigram;
    load_unigram(model, where);
  } else {
    fail("{}: model type '{}' is not supported (supported: BPE, WordPiece, Unigram)", where, type);
  }
}

void HfTokenizer::load_unigram(const json& model, const std::string& where) {
  const json& vocab = model["vocab"];
  SF_CHECK(vocab.is_array(), "{}: a Unigram 'vocab' must be an array of [piece, score]", where);
  std::vector<std::pair<std::string, double>> pieces;
  pieces.reserve(vocab.size());
  for (const json& entry : vocab) {
    SF_CHECK(entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_number(),
             "{}: vocab entry {} is not [piece, score]", where, entry.dump().substr(0, 100));
    pieces.emplace_back(entry[0].get<std::string>(), entry[1].get<double>());
  }
  int32_t unk_id = -1;
  if (const auto unk = model.find("unk_id"); unk != model.end() && !unk->is_null()) {
    SF_CHECK(unk->is_number_integer() && *unk >= 0 && *unk < int64_t(pieces.size()),
             "{}: unk_id {} is outside the vocab of {} pieces", where, unk->dump(), pieces.size());
    unk_id = unk->get<int32_t>();
  }
  unigram_ = std::make_unique<UnigramModel>(pieces, unk_id, value_or(model, "byte_fallback", false), where);
  unk_id_ = unk_id;
  id_to_piece_.resize(pieces.size());
  for (size_t id = 0; id < pieces.size(); ++id) {
    vocab_.assign(pieces[id].first, int32_t(id));
    id_to_piece_[id] = std::move(pieces[id].first);
  }
}

void HfTokenizer::load_post_processor(const json& spec, const std::string& where) {
  const std::string type = type_of(spec, where);
  // The ids a post-processor adds go to the model as they are, so each must name a token.
  const auto token_id_of = [&](const json& id) {
    SF_CHECK(id.is_number_integer() && id >= 0 && id < int64_t(id_to_piece_.size()),
             "{} {}: special token id {} is outside the vocabulary [0, {})", where, type, id.dump(), id_to_piece_.size());
    return id.get<int32_t>();
  };
  const auto special_id = [&](const json& pair) {
    SF_CHECK(pair.is_array() && pair.size() == 2, "{} {}: expected [token, id], got {}", where, type, pair.dump());
    return token_id_of(pair[1]);
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
      for (const auto& id : require(*it, "ids", where)) (seen_sequence ? suffix : prefix).push_back(token_id_of(id));
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
  switch (model_type_) {
    case ModelType::Bpe:
      bpe_word(word, out);
      break;
    case ModelType::WordPiece:
      wordpiece_word(word, out);
      break;
    case ModelType::Unigram:
      unigram_->encode(word, out);
      break;
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
    hf::split_text_pieces(pieces, [&](const Piece& piece, Pieces& out) {
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
  if (decoder_traits_.byte_level) {
    std::string bytes;
    return hf::byte_level_decode(piece, bytes) ? bytes : piece;
  }
  if (decoder_traits_.sentencepiece) {
    const int byte = parse_byte_piece(piece);
    if (byte >= 0) return std::string(1, char(byte));
    return replace_all(piece, kSentencePieceSpace, " ");
  }
  if (decoder_traits_.wordpiece) {
    if (piece.compare(0, continuing_subword_prefix_.size(), continuing_subword_prefix_) == 0) {
      return piece.substr(continuing_subword_prefix_.size());
    }
    return " " + piece;
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
