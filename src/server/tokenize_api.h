// server/tokenize_api.h — the bodies of POST /tokenize and POST /detokenize, as llama.cpp's server
// spells them, so its clients and scripts work unchanged:
//   /tokenize   {"content": "text", "add_special": false, "with_pieces": false}
//               -> {"tokens": [ids]}, or with_pieces {"tokens": [{"id": 15, "piece": "Hello"}, ...]}
//               where a piece that is not valid UTF-8 on its own (part of a character) is its
//               list of byte values, as llama.cpp gives it;
//   /detokenize {"tokens": [ids]} -> {"content": "text"} (special tokens kept, as llama.cpp does).
// Special tokens written in the text are always matched (HF semantics; llama.cpp's default
// parse_special true); parse_special false is refused. Pure JSON <-> tokenizer: every wrong type
// or value is an ApiError 400 naming the field.
#pragma once

#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

namespace splitflow {

// tokenizer may be null (a model without one): a 400 saying so.
nlohmann::json tokenize_response(const Tokenizer* tokenizer, const nlohmann::json& body);
nlohmann::json detokenize_response(const Tokenizer* tokenizer, const nlohmann::json& body);

}  // namespace splitflow
