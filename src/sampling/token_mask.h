// sampling/token_mask.h — structured outputs' vocabulary mask applied to a row of logits on the
// host: the one definition the CPU backend (Backend::apply_token_mask), the engine's host sampling
// path (engine/constrained_step.h) and `bench grammar` run. A mask is one bit per token, 32 to a
// word, bit t % 32 of word t / 32 set when token t is allowed.
#pragma once

#include <cstdint>

namespace splitflow {

// logits[t] = -inf for every t < count whose bit in `allowed` is clear (16 tokens per masked
// store on AVX-512).
void mask_logits_row(float* logits, const uint32_t* allowed, int64_t count);

}  // namespace splitflow
