// tokenizer/gguf_tokenizer.cpp — vocabularies embedded in GGUF files (`tokenizer.ggml.*`),
// encoded as llama.cpp does (src/llama-vocab.cpp), the reference for these files:
//   llama: SentencePiece BPE by token scores, "▁" for spaces, byte fallback to <0xNN>;
//   gpt2:  byte-level BPE by merge rank, after the pre-tokenizer regexes `tokenizer.ggml.pre` names;
//   gemma4: SentencePiece-style BPE by merge rank (Gemma 4): spaces become "▁", the text splits only
//          into newline runs and the rest, merges run on raw UTF-8, <0xNN> pieces for uncovered bytes;
//   bert:  WordPiece on llama.cpp's converted vocabulary ("▁" marks word starts, no "##").
// Special tokens (control, user-defined, unknown types) written in the text are recognised first,
// longest first, with llama.cpp's lstrip/rstrip attributes.
#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "tokenizer/merges.h"
#include "tokenizer/pieces.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <limits>

namespace splitflow {
namespace {

using json = nlohmann::json;

enum class VocabKind { SentencePiece, BytePairEncoding, WordPiece };

// llama.cpp's token types (tokenizer.ggml.token_type).
enum TokenType : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6,
};

// Pre-tokenizer regexes by `tokenizer.ggml.pre`, applied in sequence (each splits every chunk the
// previous ones made, keeping matches and the text between them). From llama.cpp's table.
struct PreTokenizer {
  std::vector<std::string> patterns;
  bool ignore_merges = false;
  bool add_bos = false;
};

const std::string kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
const std::string kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const std::string kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen 3.5: Qwen 2's with marks kept inside words; the contractions spelled with ASCII case
// classes as llama.cpp writes them (PCRE2's caseless match would also take U+017F for "s").
const std::string kQwen35 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

PreTokenizer pre_tokenizer_for(const std::string& name, const std::string& where) {
  const auto is_any = [&](std::initializer_list<const char*> names) {
    return std::any_of(names.begin(), names.end(), [&](const char* n) { return name == n; });
  };
  if (name.empty() || name == "default") {
    return {{R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}};
  }
  if (is_any({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"})) {
    return {{kLlama3}, true, true};
  }
  if (is_any({"dbrx", "smaug-bpe", "chatglm-bpe", "glm4"})) return {{kLlama3}};
  if (name == "deepseek-llm") {
    return {{"[\r\n]",
             "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
             "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$", "[一-龥ࠀ-一가-퟿]+", "\\p{N}+"}};
  }
  if (name == "deepseek-coder") {
    return {{"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"}};
  }
  if (name == "deepseek-v3") {
    return {{"\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
             "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
             "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}};
  }
  if (name == "falcon") return {{R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}};
  if (is_any({"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"})) {
    return {{R"(\p{N})", kGpt2}};
  }
  if (is_any({"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
              "modern-bert", "exaone4", "mpt", "olmo", "jais", "trillion", "jina-v1-en", "jina-v2-code",
              "roberta-bpe"})) {
    return {{kGpt2}};
  }
  if (is_any({"qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan", "kormo"})) return {{kQwen2}};
  if (name == "qwen35") return {{kQwen35}};
  if (is_any({"poro-chat", "bloom", "gpt3-finnish"})) return {{R"( ?[^(\s|.,!?…。，、।۔،)]+)"}};
  if (name == "viking") return {{R"( ?[^(\s|.,!?…。，、।۔،)]+)", R"(\p{N})"}};
  if (is_any({"gpt-4o", "llama4"})) {
    return {{R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
             R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
             R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}};
  }
  if (name == "tekken") {
    return {{R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
             R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|)"
             R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
            true, true};
  }
  fail("{}: pre-tokenizer '{}' (tokenizer.ggml.pre) is not supported; known: default, llama3/llama-bpe, "
       "deepseek-llm, deepseek-coder, deepseek-v3, falcon, gpt-2, starcoder, qwen2, qwen35, stablelm2, mpt, olmo, "
       "poro-chat, viking, gpt-4o, tekken, dbrx, chatglm-bpe and their aliases",
       where, name);
}

// Whitespace as C isspace (llama.cpp strips it around lstrip/rstrip special tokens).
bool is_c_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

class GgufTokenizer final : public Tokenizer {
 public:
  explicit GgufTokenizer(const json& metadata);

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override;
  std::string token_bytes(int32_t id) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override;
  int32_t vocab_size() const override { return int32_t(pieces_.size()); }
  bool is_special(int32_t id) const override {
    return valid(id) && (types_[id] == kControl || types_[id] == kUnknown);
  }
  int32_t bos_id() const override { return bos_id_; }
  std::vector<int32_t> eos_ids() const override { return eos_ids_; }
  int32_t token_id(std::string_view piece) const override { return find_id(piece_to_id_, piece); }

 private:
  struct Fragment {
    std::string_view text;  // empty for a special token
    int32_t token = -1;
  };
  bool valid(int32_t id) const { return id >= 0 && size_t(id) < pieces_.size(); }
  std::vector<Fragment> partition(std::string_view text) const;
  void encode_sentencepiece(std::string_view text, std::vector<int32_t>& out) const;
  void encode_bpe(std::string_view text, std::vector<int32_t>& out) const;
  void encode_wordpiece(std::string_view text, std::vector<int32_t>& out) const;
  int32_t byte_token(uint8_t byte) const;

  VocabKind kind_ = VocabKind::SentencePiece;
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<int32_t> types_;
  PieceIdMap piece_to_id_;
  RankMerges merges_;
  std::vector<Regex> pre_regexes_;
  std::vector<int32_t> special_tokens_;  // matched in text, longest first
  std::vector<bool> lstrip_, rstrip_;
  bool add_space_prefix_ = false;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_sep_ = false;
  bool ignore_merges_ = false;
  bool byte_level_ = true;          // BPE pieces are GPT-2 byte-level strings (false: raw UTF-8, gemma4)
  bool escape_whitespace_ = false;  // BPE text has its spaces as "▁" (gemma4)
  bool lowercase_ = true;      // WordPiece normalization
  bool strip_accents_ = true;
  size_t max_piece_bytes_ = 0;
  int32_t bos_id_ = -1, eos_id_ = -1, unk_id_ = -1, sep_id_ = -1;
  std::vector<int32_t> eos_ids_;
};

const json* find_key(const json& metadata, const std::string& key) {
  const auto it = metadata.find(key);
  return it == metadata.end() ? nullptr : &*it;
}

GgufTokenizer::GgufTokenizer(const json& metadata) {
  SF_CHECK(metadata.is_object(), "GGUF metadata is not an object");
  const json* model = find_key(metadata, "tokenizer.ggml.model");
  SF_CHECK(model && model->is_string(), "GGUF metadata has no 'tokenizer.ggml.model': the file carries no vocabulary");
  const std::string model_name = model->get<std::string>();
  const json* tokens = find_key(metadata, "tokenizer.ggml.tokens");
  SF_CHECK(tokens && tokens->is_array() && !tokens->empty(),
           "GGUF metadata has no 'tokenizer.ggml.tokens' array (tokenizer.ggml.model is '{}')", model_name);

  const size_t n = tokens->size();
  // Ids are int32 everywhere downstream (the GGUF reader has already bounded the array by the file).
  SF_CHECK(n <= size_t(std::numeric_limits<int32_t>::max()),
           "GGUF 'tokenizer.ggml.tokens' has {} entries, more than int32 ids can number", n);
  pieces_.reserve(n);
  piece_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const json& token = (*tokens)[i];
    SF_CHECK(token.is_string(), "GGUF 'tokenizer.ggml.tokens'[{}] is not a string", i);
    pieces_.push_back(token.get<std::string>());
    piece_to_id_.insert(pieces_.back(), int32_t(i));  // a duplicate keeps the first id
    max_piece_bytes_ = std::max(max_piece_bytes_, pieces_.back().size());
  }
  scores_.assign(n, 0.0f);
  if (const json* scores = find_key(metadata, "tokenizer.ggml.scores")) {
    // One entry per token: a longer or shorter array means the arrays were written for different vocabularies.
    SF_CHECK(scores->is_array() && scores->size() == n, "GGUF 'tokenizer.ggml.scores' has {} entries for {} tokens",
             scores->is_array() ? scores->size() : 0, n);
    for (size_t i = 0; i < n; ++i) {
      // A double beyond float's range would make the conversion undefined; real files store f32.
      const json& score = (*scores)[i];
      SF_CHECK(score.is_number(), "GGUF 'tokenizer.ggml.scores'[{}] is a {}, not a number", i, score.type_name());
      const double value = score.get<double>();
      SF_CHECK(!std::isfinite(value) || std::abs(value) <= std::numeric_limits<float>::max(),
               "GGUF 'tokenizer.ggml.scores'[{}] is {}, beyond the f32 range", i, value);
      scores_[i] = static_cast<float>(value);
    }
  }
  types_.assign(n, kNormal);
  if (const json* types = find_key(metadata, "tokenizer.ggml.token_type")) {
    SF_CHECK(types->is_array() && types->size() == n, "GGUF 'tokenizer.ggml.token_type' has {} entries for {} tokens",
             types->is_array() ? types->size() : 0, n);
    for (size_t i = 0; i < n; ++i) {
      const json& type = (*types)[i];
      SF_CHECK(type.is_number_integer() && type >= std::numeric_limits<int32_t>::min() &&
                   type <= std::numeric_limits<int32_t>::max(),
               "GGUF 'tokenizer.ggml.token_type'[{}] is not an int32 token type ({})", i, type.type_name());
      types_[i] = type.get<int32_t>();
    }
  }
  const auto flag = [&](const char* key, bool fallback) {
    const json* value = find_key(metadata, key);
    return value && value->is_boolean() ? value->get<bool>() : fallback;
  };
  const std::string pre = [&] {
    const json* value = find_key(metadata, "tokenizer.ggml.pre");
    return value && value->is_string() ? value->get<std::string>() : std::string();
  }();

  // Default special ids per vocabulary kind, overridden by the metadata below (llama.cpp's order).
  if (model_name == "llama") {
    kind_ = VocabKind::SentencePiece;
    bos_id_ = 1, eos_id_ = 2, unk_id_ = 0;
    add_space_prefix_ = true, add_bos_ = true;
  } else if (model_name == "gpt2" || model_name == "gemma4") {
    kind_ = VocabKind::BytePairEncoding;
    if (model_name == "gpt2") {
      bos_id_ = 11, eos_id_ = 11;
      const PreTokenizer pre_tokenizer = pre_tokenizer_for(pre, "GGUF");
      for (const auto& pattern : pre_tokenizer.patterns) pre_regexes_.emplace_back(pattern, "GGUF pre-tokenizer '" + pre + "'");
      ignore_merges_ = pre_tokenizer.ignore_merges;
      add_bos_ = pre_tokenizer.add_bos;
      add_sep_ = pre == "jina-v1-en" || pre == "jina-v2-code" || pre == "roberta-bpe";
    } else {
      // llama.cpp's gemma4 pre-tokenizer: only newline runs split the text (BPE merge lookup
      // never sees a newline next to other text); its special ids all come from the metadata.
      pre_regexes_.emplace_back("[^\n]+|[\n]+", "GGUF gemma4 pre-tokenizer");
      byte_level_ = false;
      escape_whitespace_ = true;
      add_bos_ = true;
    }
    const json* merges = find_key(metadata, "tokenizer.ggml.merges");
    SF_CHECK(merges && merges->is_array(), "GGUF vocabulary '{}' needs a 'tokenizer.ggml.merges' array", model_name);
    merges_.reserve(merges->size());
    for (size_t i = 0; i < merges->size(); ++i) {
      const json& entry = (*merges)[i];
      SF_CHECK(entry.is_string(), "GGUF 'tokenizer.ggml.merges'[{}] is not a string", i);
      const std::string& merge = entry.get_ref<const std::string&>();
      const size_t space = merge.find(' ', 1);
      SF_CHECK(space != std::string::npos, "GGUF 'tokenizer.ggml.merges'[{}] '{}' is not 'left right'", i, merge);
      const int32_t left = find_id(piece_to_id_, std::string_view(merge).substr(0, space));
      const int32_t right = find_id(piece_to_id_, std::string_view(merge).substr(space + 1));
      const int32_t merged = find_id(piece_to_id_, merge.substr(0, space) + merge.substr(space + 1));
      // A merge of pieces outside the vocabulary can never fire on vocabulary symbols.
      if (left >= 0 && right >= 0 && merged >= 0) merges_.add(left, right, merged);
    }
  } else if (model_name == "bert") {
    kind_ = VocabKind::WordPiece;
    bos_id_ = 101, unk_id_ = 100, sep_id_ = 102;
    add_bos_ = true, add_sep_ = true;
  } else {
    fail("GGUF tokenizer.ggml.model '{}' is not supported (supported: llama, gpt2, gemma4, bert)", model_name);
  }
  add_space_prefix_ = flag("tokenizer.ggml.add_space_prefix", add_space_prefix_);
  const auto special_id = [&](const char* key, int32_t& id) {
    if (id >= int32_t(n)) id = -1;
    const json* value = find_key(metadata, key);
    if (value && value->is_number_integer() && value->get<int64_t>() >= 0 && value->get<int64_t>() < int64_t(n)) {
      id = value->get<int32_t>();
    }
  };
  special_id("tokenizer.ggml.bos_token_id", bos_id_);
  special_id("tokenizer.ggml.eos_token_id", eos_id_);
  special_id("tokenizer.ggml.unknown_token_id", unk_id_);
  special_id("tokenizer.ggml.seperator_token_id", sep_id_);
  int32_t eot_id = -1, eom_id = -1;
  special_id("tokenizer.ggml.eot_token_id", eot_id);
  special_id("tokenizer.ggml.eom_token_id", eom_id);
  add_bos_ = flag("tokenizer.ggml.add_bos_token", add_bos_);
  if (model_name == "gemma4") add_bos_ = true;  // llama.cpp overrides a false flag for Gemma 4
  add_eos_ = flag("tokenizer.ggml.add_eos_token", add_eos_);
  add_sep_ = flag("tokenizer.ggml.add_sep_token", add_sep_);
  SF_CHECK(!add_bos_ || bos_id_ >= 0, "GGUF tokenizer.ggml.add_bos_token is true but there is no bos_token_id");
  SF_CHECK(!add_eos_ || eos_id_ >= 0, "GGUF tokenizer.ggml.add_eos_token is true but there is no eos_token_id");
  lowercase_ = flag("tokenizer.ggml.normalizer.lowercase", true);
  strip_accents_ = flag("tokenizer.ggml.normalizer.strip_accents", lowercase_);

  // End-of-generation tokens: eos, eot, eom, plus the turn-end pieces llama.cpp recognises by text.
  for (int32_t id : {eos_id_, eot_id, eom_id}) {
    if (id >= 0 && std::find(eos_ids_.begin(), eos_ids_.end(), id) == eos_ids_.end()) eos_ids_.push_back(id);
  }
  for (const char* text : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
                           "<EOT>", "<|end_of_text|>", "<eos>", "<turn|>", "<|tool_response>"}) {
    const int32_t id = find_id(piece_to_id_, text);
    if (id < 0) continue;
    if (types_[id] == kNormal) types_[id] = kControl;
    if (std::find(eos_ids_.begin(), eos_ids_.end(), id) == eos_ids_.end()) eos_ids_.push_back(id);
  }

  // A special piece that is not valid UTF-8 (GGUF pieces are raw bytes) can only match inside a
  // character of the valid text encode() partitions: it would hand the pre-tokenizer regexes, which
  // trust their input to be UTF-8, split characters. Such pieces are never matched in text.
  for (size_t i = 0; i < n; ++i) {
    if ((types_[i] == kControl || types_[i] == kUserDefined || types_[i] == kUnknown) &&
        unicode::is_valid_utf8(pieces_[i]))
      special_tokens_.push_back(int32_t(i));
  }
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(),
                   [&](int32_t a, int32_t b) { return pieces_[a].size() > pieces_[b].size(); });
  // llama.cpp marks Phi-3's special tokens rstrip by model name.
  lstrip_.assign(n, false);
  rstrip_.assign(n, false);
  const json* general_name = find_key(metadata, "general.name");
  std::string name = general_name && general_name->is_string() ? general_name->get<std::string>() : "";
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (int32_t id : special_tokens_) rstrip_[id] = true;
    for (const char* text : {"</s>"}) {
      if (const int32_t id = find_id(piece_to_id_, text); id >= 0) rstrip_[id] = true;
    }
    for (const char* text : {"<unk>", "<s>", "<|endoftext|>"}) {
      if (const int32_t id = find_id(piece_to_id_, text); id >= 0) rstrip_[id] = false;
    }
  }
}

// llama.cpp's tokenizer_st_partition: each special token in turn (longest first) splits the text
// fragments that are left.
std::vector<GgufTokenizer::Fragment> GgufTokenizer::partition(std::string_view text) const {
  std::vector<Fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back({text, -1});
  for (int32_t special : special_tokens_) {
    const std::string& piece = pieces_[special];
    if (piece.empty()) continue;
    std::vector<Fragment> next;
    next.reserve(fragments.size());
    for (const Fragment& fragment : fragments) {
      if (fragment.token >= 0) {
        next.push_back(fragment);
        continue;
      }
      std::string_view rest = fragment.text;
      for (size_t hit; (hit = rest.find(piece)) != std::string_view::npos;) {
        std::string_view left = rest.substr(0, hit);
        if (lstrip_[special]) {
          while (!left.empty() && is_c_space(left.back())) left.remove_suffix(1);
        }
        if (!left.empty()) next.push_back({left, -1});
        next.push_back({{}, special});
        rest = rest.substr(hit + piece.size());
        if (rstrip_[special]) {
          while (!rest.empty() && is_c_space(rest.front())) rest.remove_prefix(1);
        }
      }
      if (!rest.empty()) next.push_back({rest, -1});
    }
    fragments = std::move(next);
  }
  return fragments;
}

int32_t GgufTokenizer::byte_token(uint8_t byte) const {
  int32_t id = find_id(piece_to_id_, byte_piece(byte));
  if (id < 0) id = find_id(piece_to_id_, std::string(1, char(byte)));
  return id >= 0 ? id : unk_id_;
}

void GgufTokenizer::encode_sentencepiece(std::string_view text, std::vector<int32_t>& out) const {
  const std::string escaped = replace_all(text, " ", kSentencePieceSpace);
  const auto score_of = [&](std::string_view piece, float& score) {
    const int32_t id = find_id(piece_to_id_, piece);
    if (id < 0) return false;
    score = scores_[id];
    return true;
  };
  for (const auto& [offset, length] : score_merge(escaped, score_of)) {
    const std::string_view symbol(escaped.data() + offset, length);
    const int32_t id = find_id(piece_to_id_, symbol);
    if (id >= 0) {
      out.push_back(id);
    } else {
      for (char c : symbol) {
        const int32_t byte_id = byte_token(static_cast<uint8_t>(c));
        if (byte_id >= 0) out.push_back(byte_id);
      }
    }
  }
}

void GgufTokenizer::encode_bpe(std::string_view raw_text, std::vector<int32_t>& out) const {
  const std::string escaped = escape_whitespace_ ? replace_all(raw_text, " ", kSentencePieceSpace) : std::string();
  const std::string_view text = escape_whitespace_ ? std::string_view(escaped) : raw_text;
  std::vector<std::string_view> chunks{text};
  for (const Regex& regex : pre_regexes_) {
    std::vector<std::string_view> next;
    next.reserve(chunks.size() * 2);
    for (std::string_view chunk : chunks) {
      size_t previous = 0;
      for (const auto& [first, last] : regex.find_all(chunk)) {
        if (first > previous) next.push_back(chunk.substr(previous, first - previous));
        if (last > first) next.push_back(chunk.substr(first, last - first));
        previous = last;
      }
      if (previous < chunk.size()) next.push_back(chunk.substr(previous));
    }
    chunks = std::move(next);
  }
  std::string word;
  std::vector<int32_t> symbols;
  for (std::string_view chunk : chunks) {
    word.clear();
    if (byte_level_) {
      for (char c : chunk) unicode::append_utf8(word, unicode::byte_to_char(static_cast<uint8_t>(c)));
    } else {
      word.assign(chunk);
    }
    // gemma4: a run of newlines that is a piece stays whole (llama.cpp's fix for Gemma 4).
    if (ignore_merges_ || (!byte_level_ && word.find_first_not_of('\n') == std::string::npos)) {
      const int32_t id = find_id(piece_to_id_, word);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
    }
    symbols.clear();
    // Characters missing from the vocabulary stay as unmergeable symbols (encoded as their index
    // into `word`, negated) and fall back to single-byte pieces at the end, as in llama.cpp.
    for (size_t offset = 0; offset < word.size();) {
      const size_t start = offset;
      unicode::decode_next(word, offset);
      const int32_t id = find_id(piece_to_id_, std::string_view(word).substr(start, offset - start));
      symbols.push_back(id >= 0 ? id : -1 - int32_t(start));
    }
    merges_.apply(symbols);
    for (int32_t symbol : symbols) {
      if (symbol >= 0) {
        out.push_back(symbol);
        continue;
      }
      const size_t start = size_t(-1 - symbol);
      size_t end = start;
      unicode::decode_next(word, end);
      for (size_t i = start; i < end; ++i) {
        // Byte-level vocabularies have one piece per byte; gemma4 has <0xNN> pieces.
        const int32_t id = byte_level_ ? find_id(piece_to_id_, std::string_view(word).substr(i, 1))
                                       : find_id(piece_to_id_, byte_piece(static_cast<uint8_t>(word[i])));
        if (id >= 0) out.push_back(id);
      }
    }
  }
}

void GgufTokenizer::encode_wordpiece(std::string_view text, std::vector<int32_t>& out) const {
  // llama.cpp's WPM preprocessing: (approximate) NFD, drop controls and accents, lowercase, split
  // on whitespace, punctuation, ASCII symbols and CJK characters.
  const auto is_chinese = [](char32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
  };
  std::vector<std::string> words(1);
  for (size_t offset = 0; offset < text.size();) {
    char32_t cp = unicode::decode_next(text, offset);
    if (strip_accents_) cp = unicode::nfd_first(cp);
    if (unicode::is_white_space(cp)) {
      if (!words.back().empty()) words.emplace_back();
      continue;
    }
    const auto category = unicode::category(cp);
    const bool control = category >= unicode::Category::Cc && category <= unicode::Category::Co;
    if (cp == 0 || cp == unicode::kReplacementChar || control) continue;
    if (strip_accents_ && unicode::is_mark(cp)) continue;
    std::string ch;
    unicode::append_utf8(ch, lowercase_ ? unicode::simple_lowercase(cp) : cp);
    if (unicode::is_punctuation(cp) || (cp < 0x7F && unicode::is_symbol(cp)) || is_chinese(cp)) {
      if (!words.back().empty()) words.emplace_back();
      words.back() = ch;
      words.emplace_back();
    } else {
      words.back() += ch;
    }
  }
  for (const std::string& word : words) {
    if (word.empty()) continue;
    const std::string marked = std::string(kSentencePieceSpace) + word;
    const size_t n = marked.size();
    const size_t first_token = out.size();
    for (size_t i = 0; i < n; ++i) {
      bool matched = false;
      for (size_t j = std::min(n, i + max_piece_bytes_ + 1); j > i; --j) {
        const int32_t id = find_id(piece_to_id_, std::string_view(marked).substr(i, j - i));
        if (id >= 0) {
          out.push_back(id);
          matched = true;
          i = j - 1;
          break;
        }
      }
      if (!matched) {  // the whole word becomes unknown
        out.resize(first_token);
        break;
      }
    }
    if (out.size() == first_token) out.push_back(unk_id_);
  }
}

std::vector<int32_t> GgufTokenizer::encode(std::string_view raw_text, bool add_special) const {
  const std::string text = unicode::make_valid_utf8(raw_text);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  const auto fragments = partition(text);
  switch (kind_) {
    case VocabKind::SentencePiece: {
      if (add_special && add_bos_) ids.push_back(bos_id_);
      bool previous_special = true;  // the first text fragment gets the dummy prefix space
      for (const Fragment& fragment : fragments) {
        if (fragment.token >= 0) {
          ids.push_back(fragment.token);
          previous_special = true;
          continue;
        }
        std::string piece = add_space_prefix_ && previous_special ? " " : "";
        piece += fragment.text;
        encode_sentencepiece(piece, ids);
        previous_special = false;
      }
      if (add_special && add_eos_) ids.push_back(eos_id_);
      break;
    }
    case VocabKind::BytePairEncoding:
      if (add_special && add_bos_) ids.push_back(bos_id_);
      for (const Fragment& fragment : fragments) {
        if (fragment.token >= 0) {
          ids.push_back(fragment.token);
        } else {
          encode_bpe(fragment.text, ids);
        }
      }
      if (add_special && add_eos_) ids.push_back(eos_id_);
      if (add_special && add_sep_ && sep_id_ >= 0) ids.push_back(sep_id_);
      break;
    case VocabKind::WordPiece:
      if (add_special && bos_id_ >= 0) ids.push_back(bos_id_);
      for (const Fragment& fragment : fragments) {
        if (fragment.token >= 0) {
          ids.push_back(fragment.token);
        } else {
          encode_wordpiece(fragment.text, ids);
        }
      }
      if (add_special && sep_id_ >= 0) ids.push_back(sep_id_);
      break;
  }
  return ids;
}

std::string GgufTokenizer::token_bytes(int32_t id) const {
  if (!valid(id)) return "";
  const std::string& piece = pieces_[id];
  switch (types_[id]) {
    case kControl:
    case kUnknown:
    case kUserDefined:
      return piece;
    case kByte: {
      const int byte = parse_byte_piece(piece);
      return byte >= 0 ? std::string(1, char(byte)) : piece;
    }
    default:
      break;
  }
  if (kind_ != VocabKind::BytePairEncoding || escape_whitespace_) return replace_all(piece, kSentencePieceSpace, " ");
  std::string bytes;
  for (size_t i = 0; i < piece.size();) {
    const size_t start = i;
    const int b = unicode::char_to_byte(unicode::decode_next(piece, i));
    if (b >= 0) {
      bytes.push_back(char(b));
    } else {
      bytes.append(piece, start, i - start);
    }
  }
  return bytes;
}

std::string GgufTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (!valid(id) || (skip_special && is_special(id))) continue;
    bytes += token_bytes(id);
  }
  // The dummy prefix space (SentencePiece) and the word-start marker (WordPiece) of the first piece
  // are not part of the text.
  const bool strip_leading_space = kind_ == VocabKind::WordPiece || (kind_ == VocabKind::SentencePiece && add_space_prefix_);
  if (strip_leading_space && !bytes.empty() && bytes[0] == ' ') bytes.erase(0, 1);
  return unicode::make_valid_utf8(bytes);
}

}  // namespace

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const nlohmann::json& gguf_metadata) {
  try {
    return std::make_unique<GgufTokenizer>(gguf_metadata);
  } catch (const nlohmann::json::exception& error) {
    fail("GGUF tokenizer metadata has a value of the wrong type: {}", error.what());
  }
}

}  // namespace splitflow
