// tokenizer/tokenizer.h — text <-> token ids. Implementations: HF tokenizer.json (byte-level BPE,
// SentencePiece-style BPE with byte fallback, WordPiece, SentencePiece Unigram), GGUF vocabularies
// (tokenizer.ggml.*: llama, gpt2, gemma4, bert), llama2.c tokenizer.bin. Encoding is bit-exact with
// the reference implementation of each format (HF `tokenizers`, llama.cpp, llama2.c); tests check that.
// Module files: hf_tokenizer.cpp + hf_components.* (tokenizer.json), unigram.* (the Unigram model),
// gguf_tokenizer.cpp, llama2c_tokenizer.cpp, merges.* (rank and score BPE merge loops, piece
// tables), regex.* (PCRE2), unicode.* + unicode_tables.* (categories, normalization, grapheme
// clusters, UTF-8), stream_decoder.cpp, load_tokenizer.cpp (which tokenizer goes with a model path).
// Tokenizers are immutable after loading; encode/decode may run on several threads at once.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace splitflow {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Encodes `text`. Special/added tokens written in the text are recognised (as HF does);
  // add_special adds the BOS/EOS (or CLS/SEP) the tokenizer's post-processor asks for.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special) const = 0;
  // The raw bytes one token stands for (byte-level and byte-fallback tokens decoded to bytes,
  // "▁" to space); may be an incomplete UTF-8 sequence. Special tokens give their text.
  virtual std::string token_bytes(int32_t id) const = 0;
  // Full decode with the format's rules (e.g. SentencePiece drops the leading space of the first
  // piece). skip_special drops control/special tokens.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual bool is_special(int32_t id) const = 0;
  virtual int32_t bos_id() const = 0;                   // -1 when none
  virtual std::vector<int32_t> eos_ids() const = 0;     // may be empty
  // Id of a token by its exact piece/content, -1 when absent.
  virtual int32_t token_id(std::string_view piece) const = 0;
};

// From a HF tokenizer.json (+ optional tokenizer_config.json in the same directory for BOS/EOS
// flags and added tokens).
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& tokenizer_json_path);
// From GGUF metadata (`tokenizer.ggml.*` keys as produced by WeightSource::metadata()).
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const nlohmann::json& gguf_metadata);
// From a llama2.c tokenizer.bin; vocab_size comes from the checkpoint header (<= 0: read every
// entry in the file).
std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, int32_t vocab_size);

// The tokenizer that goes with a model path: a HF directory -> its tokenizer.json (+
// tokenizer_config.json); a .gguf file -> its embedded vocabulary; a llama2.c checkpoint ->
// tokenizer.bin, else the one tok*.bin, in the same directory (vocab size from the checkpoint).
// A non-empty override names the tokenizer instead: a tokenizer.json (or a directory holding one),
// a .gguf file, or a llama2.c tokenizer .bin. Errors name what is missing.
std::unique_ptr<Tokenizer> load_tokenizer_for_model(const std::string& model_path,
                                                    const std::string& tokenizer_path_override = "");

// Streaming detokenizer: feed ids one at a time, get text as soon as it forms complete UTF-8;
// incomplete sequences wait for the next token, so a stream never contains broken UTF-8.
// Matches decode() of the whole sequence once finish() is called.
// Cost per token is bounded: only the ids since the last emitted text plus one emitted group of
// context are decoded again (HF tokenizers' DecodeStream scheme), so decode rules that look at the
// start of the text (SentencePiece's dropped leading space) see the same context as a full decode.
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special);
  std::string push(int32_t id);
  std::string finish();  // flushes what is left (invalid bytes become U+FFFD)

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;   // context group (already emitted) followed by pending ids
  size_t context_ids_ = 0;     // how many of ids_ are context
  std::string context_text_;   // decode() of the context ids
};

}  // namespace splitflow
