// embedding/embedding_input.h — text into the token ids an embedding model reads: the tokenizer's
// special tokens ([CLS] ... [SEP]) and truncation to the model's limit as transformers truncates
// (the text's tokens cut from the right, the special tokens kept), which is what
// sentence-transformers does at its max_seq_length.
#pragma once

#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <string_view>
#include <vector>

namespace splitflow {

// The special tokens the tokenizer's post-processor puts around a single text: `prefix` before
// it, `suffix` after it (BERT: [CLS] / [SEP]; RoBERTa: <s> / </s>). Found by encoding an empty and
// a one-word text with and without specials.
struct SpecialFrame {
  std::vector<int32_t> prefix, suffix;
};
SpecialFrame special_frame(const Tokenizer& tokenizer);

// tokenizer.encode(text, add_special=true), truncated to max_tokens (> 0) tokens with the frame
// kept: prefix + the first max_tokens - |prefix| - |suffix| text tokens + suffix. Throws when
// max_tokens cannot hold the frame and one text token.
std::vector<int32_t> encode_for_embedding(const Tokenizer& tokenizer, const SpecialFrame& frame, std::string_view text,
                                          int32_t max_tokens);

}  // namespace splitflow
