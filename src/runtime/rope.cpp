// Each scaling follows the matching _compute_*_parameters function of transformers'
// modeling_rope_utils.py operation by operation: torch does this math on fp32 tensors (python
// scalars cast to fp32), so it is done here in float in the same order; pow is computed in double
// and rounded once.
#include "runtime/rope.h"

#include "core/error.h"

#include <cmath>
#include <limits>

namespace splitflow {
namespace {

// The context the scaling was trained for (the spec parser defaults it to max_position).
int64_t original_length(const ModelSpec& spec) {
  return spec.rope.scaling.original_max_position > 0 ? spec.rope.scaling.original_max_position : spec.max_position;
}

float pow_f32(float base, float exponent) {
  return static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(exponent)));
}

// torch: arange(0, dim, 2).float() / dim
float exponent_of(int pair, int dim) { return static_cast<float>(2 * pair) / static_cast<float>(dim); }

// torch: base ** (arange(0, dim, 2).float() / dim), fp32.
std::vector<float> position_frequencies(float base, int dim) {
  std::vector<float> freqs(dim / 2);
  for (int i = 0; i < dim / 2; ++i) freqs[i] = pow_f32(base, exponent_of(i, dim));
  return freqs;
}

// torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim))
std::vector<float> default_inv_freq(float base, int dim) {
  std::vector<float> inv = position_frequencies(base, dim);
  for (float& f : inv) f = 1.0f / f;
  return inv;
}

RopeFrequencies dynamic_ntk(const ModelSpec& spec, int64_t seq_len) {
  const RopeScaling& s = spec.rope.scaling;
  const int dim = spec.rotary_dim();
  const int64_t base_len = original_length(spec);
  if (seq_len <= base_len) return {default_inv_freq(static_cast<float>(spec.rope.theta), dim), 1.0f};
  // HF: base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2)), seq_len an
  // int64 tensor, so every step is fp32.
  const float factor = static_cast<float>(s.factor);
  float grown = factor * static_cast<float>(seq_len);
  grown = grown / static_cast<float>(base_len);
  grown = grown - static_cast<float>(s.factor - 1.0);
  grown = pow_f32(grown, static_cast<float>(static_cast<double>(dim) / (dim - 2)));
  const float base = static_cast<float>(spec.rope.theta) * grown;
  return {default_inv_freq(base, dim), 1.0f};
}

double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

RopeFrequencies yarn(const ModelSpec& spec) {
  const RopeScaling& s = spec.rope.scaling;
  const int dim = spec.rotary_dim();
  const double base = spec.rope.theta, factor = s.factor;
  double attention_factor;
  if (s.attention_factor)
    attention_factor = *s.attention_factor;
  else if (s.mscale != 0.0 && s.mscale_all_dim != 0.0)
    attention_factor = yarn_mscale(factor, s.mscale) / yarn_mscale(factor, s.mscale_all_dim);
  else
    attention_factor = yarn_mscale(factor, 1.0);

  // find_correction_range with truncate (HF's default): python double math.
  const auto correction_dim = [&](double rotations) {
    return (dim * std::log(original_length(spec) / (rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
  };
  double low = std::floor(correction_dim(s.beta_fast)), high = std::ceil(correction_dim(s.beta_slow));
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;

  const std::vector<float> pos_freqs = position_frequencies(static_cast<float>(base), dim);
  RopeFrequencies out{std::vector<float>(dim / 2), static_cast<float>(attention_factor)};
  for (int i = 0; i < dim / 2; ++i) {
    const float extrapolation = 1.0f / pos_freqs[i];
    const float interpolation = 1.0f / (static_cast<float>(factor) * pos_freqs[i]);
    float ramp = (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low);
    ramp = std::min(std::max(ramp, 0.0f), 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    out.inv_freq[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return out;
}

RopeFrequencies llama3(const ModelSpec& spec) {
  const RopeScaling& s = spec.rope.scaling;
  std::vector<float> inv = default_inv_freq(static_cast<float>(spec.rope.theta), spec.rotary_dim());
  const float factor = static_cast<float>(s.factor);
  const float low_freq_wavelen = static_cast<float>(original_length(spec) / s.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(original_length(spec) / s.high_freq_factor);
  for (float& f : inv) {
    const float wavelen = static_cast<float>(2.0 * M_PI) / f;
    const float scaled = wavelen > low_freq_wavelen ? f / factor : f;
    const float smooth = (static_cast<float>(original_length(spec)) / wavelen - static_cast<float>(s.low_freq_factor)) /
                         static_cast<float>(s.high_freq_factor - s.low_freq_factor);
    const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    f = medium ? smoothed : scaled;
  }
  return {inv, 1.0f};
}

// llama.cpp: theta_i = position * base^(-2i/d) / freq_factors[i].
RopeFrequencies freq_factors(const ModelSpec& spec) {
  const std::vector<double>& factors = spec.rope.scaling.freq_factors;
  const int dim = spec.rotary_dim();
  SF_CHECK(factors.size() == static_cast<size_t>(dim / 2), "rope.scaling: {} freq_factors, expected rotary_dim/2 = {}",
           factors.size(), dim / 2);
  std::vector<float> inv = default_inv_freq(static_cast<float>(spec.rope.theta), dim);
  for (int i = 0; i < dim / 2; ++i) inv[i] /= static_cast<float>(factors[i]);
  return {inv, 1.0f};
}

RopeFrequencies longrope(const ModelSpec& spec, int64_t seq_len) {
  const RopeScaling& s = spec.rope.scaling;
  const int dim = spec.rotary_dim();
  double attention_factor = 1.0;
  if (s.attention_factor)
    attention_factor = *s.attention_factor;
  else if (s.factor > 1.0)
    attention_factor = std::sqrt(1.0 + std::log(s.factor) / std::log(static_cast<double>(original_length(spec))));
  const std::vector<double>& ext = seq_len > original_length(spec) ? s.long_factor : s.short_factor;
  SF_CHECK(ext.size() == static_cast<size_t>(dim / 2), "rope.scaling: longrope has {} factors, expected rotary_dim/2 = {}",
           ext.size(), dim / 2);
  const std::vector<float> pos_freqs = position_frequencies(static_cast<float>(spec.rope.theta), dim);
  RopeFrequencies out{std::vector<float>(dim / 2), static_cast<float>(attention_factor)};
  for (int i = 0; i < dim / 2; ++i) out.inv_freq[i] = 1.0f / (static_cast<float>(ext[i]) * pos_freqs[i]);
  return out;
}

}  // namespace

RopeFrequencies rope_frequencies(const ModelSpec& spec, int64_t seq_len) {
  const int dim = spec.rotary_dim();
  SF_CHECK(dim >= 2 && dim <= spec.attention.head_dim, "rope: rotary_dim {} must be in [2, head_dim {}]", dim,
           spec.attention.head_dim);
  const RopeScaling& s = spec.rope.scaling;
  const float theta = static_cast<float>(spec.rope.theta);
  switch (s.type) {
    case RopeScalingType::None: return {default_inv_freq(theta, dim), 1.0f};
    case RopeScalingType::Linear: {
      std::vector<float> inv = default_inv_freq(theta, dim);
      for (float& f : inv) f /= static_cast<float>(s.factor);
      return {inv, 1.0f};
    }
    case RopeScalingType::DynamicNTK: return dynamic_ntk(spec, seq_len);
    case RopeScalingType::YaRN: return yarn(spec);
    case RopeScalingType::Llama3: return llama3(spec);
    case RopeScalingType::LongRope: return longrope(spec, seq_len);
    case RopeScalingType::FreqFactors: return freq_factors(spec);
  }
  fail("rope.scaling: unknown scaling type");
}

int64_t rope_static_length(const ModelSpec& spec) {
  const RopeScalingType type = spec.rope.scaling.type;
  if (type == RopeScalingType::DynamicNTK || type == RopeScalingType::LongRope)
    return original_length(spec);
  return std::numeric_limits<int64_t>::max();
}

void fill_rope_row(const RopeFrequencies& freqs, int64_t position, float* row) {
  const size_t half = freqs.inv_freq.size();
  const float p = static_cast<float>(position);
  for (size_t i = 0; i < half; ++i) {
    const float angle = p * freqs.inv_freq[i];  // torch: position_ids.float() * inv_freq, fp32
    row[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * freqs.attention_factor;
    row[half + i] = static_cast<float>(std::sin(static_cast<double>(angle))) * freqs.attention_factor;
  }
}

}  // namespace splitflow
