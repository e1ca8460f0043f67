// embedding/pooling.h — token states into one vector, as sentence-transformers' Pooling and
// Normalize modules compute it. Pure host math over fp32. The engine pools on the device
// (ModelRunner::forward_pooled, Backend::pool_rows); pool_states is the host definition of the same
// rule, which the tests hold the device's result and transformers' states to.
#pragma once

#include "model/spec.h"

#include <cstdint>
#include <span>
#include <vector>

namespace splitflow {

// states [tokens, hidden] of one sequence (tokens >= 1): Cls = row 0, Last = row tokens - 1,
// Mean = the average of every row (sentence-transformers' mean over the attention mask; a
// sequence here has no padding). Sums in double.
std::vector<float> pool_states(std::span<const float> states, int64_t tokens, int64_t hidden, Pooling pooling);

// x / max(||x||_2, 1e-12) in place (torch.nn.functional.normalize, sentence-transformers' Normalize).
void l2_normalize(std::span<float> x);

// Matryoshka: the first `dimensions` values, L2-normalized again (vLLM's and OpenAI's `dimensions`).
// Throws splitflow::Error unless 1 <= dimensions <= x.size().
std::vector<float> truncate_dimensions(std::span<const float> x, int64_t dimensions);

}  // namespace splitflow
