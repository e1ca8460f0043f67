// runtime/rope.h — RoPE frequencies and cos/sin rows from the spec, with every scaling computed as
// HF transformers' modeling_rope_utils.py does (fp32 inverse frequencies, the attention factor
// folded into cos and sin, the angle position * inv_freq rounded to fp32 as torch does).
//
// Dynamic NTK and LongRoPE depend on the sequence length: HF recomputes inv_freq from
// max(position_ids) + 1 of each forward call once it passes the original context. The runtime
// applies this per sequence span (seq_len = the span's last position + 1), which equals HF for one
// sequence at a time.
#pragma once

#include "model/spec.h"

#include <cstdint>
#include <vector>

namespace splitflow {

struct RopeFrequencies {
  std::vector<float> inv_freq;    // rotary_dim / 2: pair i turns by position * inv_freq[i]
  float attention_factor = 1.0f;  // scales cos and sin (YaRN, LongRoPE)
};

// Frequencies for a sequence of seq_len tokens (0: at most the original context).
RopeFrequencies rope_frequencies(const ModelSpec& spec, int64_t seq_len);

// Sequences no longer than this use rope_frequencies(spec, 0); longer ones need their own
// (dynamic NTK, LongRoPE). INT64_MAX when the frequencies never depend on the length.
int64_t rope_static_length(const ModelSpec& spec);

// row[i] = cos(position * inv_freq[i]) * a, row[half + i] = sin(...) * a, half = inv_freq.size().
void fill_rope_row(const RopeFrequencies& freqs, int64_t position, float* row);

}  // namespace splitflow
