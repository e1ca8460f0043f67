// engine/stop_checker.h — when a sequence ends and what text it may stream: EOS and stop token
// ids, stop strings over the detokenized text (they may span token boundaries), and max_tokens.
// OpenAI semantics: a stop string or stop token ends the output with finish reason "stop" and is
// not part of the text; running out of max_tokens gives "length". It only sees token ids and the
// text the streaming detokenizer releases; it never samples or decodes.
//
// Streaming contract: after each append(), text()[0, safe_bytes()) can be sent to the client —
// no stop string can begin there. The held-back rest is the longest suffix of the text that is
// a proper prefix of some stop string. safe_bytes() never decreases, and the text below it never
// changes; once finished(), everything in text() is safe. Given valid UTF-8 pieces (as
// StreamDecoder releases them) and valid UTF-8 stop strings, safe_bytes() is a character boundary.
#pragma once

#include "engine/sampling_params.h"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace splitflow {

// Abort: the client went away or cancelled; the sequence ends without further output.
enum class FinishReason : int8_t { None, Stop, Length, Abort };
// "stop", "length" (as the OpenAI API spells them), "abort"; "" for None.
std::string_view finish_reason_name(FinishReason reason);

class StopChecker {
 public:
  // eos_token_ids: the tokenizer's EOS ids (ignored when params.ignore_eos).
  StopChecker(const SamplingParams& params, std::span<const int32_t> eos_token_ids);

  // One generated token and the text the detokenizer released for it (may be empty). An EOS or
  // stop token id finishes ("stop") and its text is dropped; otherwise the text is appended and
  // scanned for stop strings (a match truncates the text before it: "stop"); then the token
  // count reaching max_tokens finishes ("length"). Throws when called after finished().
  void append(int32_t token_id, std::string_view text);
  // Text released when the stream ends (the detokenizer's finish(), usually empty), once
  // finished() by "length" or a stop token. Optional. Everything before it was already safe to
  // emit, so only a stop string lying wholly inside this text counts (it truncates the text and
  // turns the reason into "stop"). No-op after a stop string matched; throws before finished().
  void append_final_text(std::string_view text);
  // Ends the sequence for a reason found outside (the model's context is full, the request was
  // aborted): everything in text() becomes safe, and append_final_text() may follow. No-op when
  // already finished; throws for FinishReason::None.
  void finish(FinishReason reason);

  bool finished() const { return reason_ != FinishReason::None; }
  FinishReason finish_reason() const { return reason_; }
  const std::string& text() const { return text_; }
  size_t safe_bytes() const { return safe_bytes_; }
  int32_t num_tokens() const { return num_tokens_; }
  // What ended the sequence: the stop string (empty if none), the EOS/stop token (-1 if none).
  std::string_view matched_stop_string() const { return matched_stop_string_; }
  int32_t matched_stop_token() const { return matched_stop_token_; }

 private:
  // Scans the text appended since old_size for a complete stop string (one that may also start
  // in the earlier, held-back text when may_start_before); updates safe_bytes_.
  void scan(size_t old_size, bool may_start_before);
  bool is_stop_token(int32_t token_id) const;

  std::vector<std::string> stop_strings_;
  std::vector<int32_t> stop_token_ids_;  // stop_token_ids plus EOS unless ignore_eos
  int32_t max_tokens_;

  std::string text_;
  size_t safe_bytes_ = 0;
  int32_t num_tokens_ = 0;
  FinishReason reason_ = FinishReason::None;
  std::string matched_stop_string_;
  int32_t matched_stop_token_ = -1;
};

}  // namespace splitflow
