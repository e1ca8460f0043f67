// bench/grammar_overhead.h — `splitflow bench grammar`: what structured outputs cost per token.
// Two measures on the same model and tokenizer:
//   decode: the in-process Engine decoding B sequences (greedy) for N tokens, unconstrained and
//           under a JSON grammar that never ends (an endless JSON array, so every step is
//           constrained), per batch size; overhead = constrained / unconstrained step time - 1,
//           from the median pure decode step of each (after an untimed warm-up run). The mask
//           cache starts empty, so its misses are in the constrained time.
//   mask:   the vocabulary mask alone (the tokenizer's vocabulary): a cache miss (the trie walk),
//           a hit (a copy), and applying it to a logits row.
#pragma once

#include "backend/backend.h"
#include "engine/model_loader.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

namespace splitflow::bench {

struct GrammarOverheadOptions {
  std::vector<int32_t> batch_sizes = {1, 64};
  int32_t output_len = 32;   // tokens generated per sequence
  int32_t input_len = 16;    // prompt tokens per sequence
  int32_t repeats = 2;       // runs per configuration; the faster is kept (a shared machine drifts)
};

nlohmann::json run_grammar_overhead(LoadedModel model, Backend& backend, const GrammarOverheadOptions& options);

}  // namespace splitflow::bench
