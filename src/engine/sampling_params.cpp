#include "engine/sampling_params.h"

#include "core/error.h"

#include <cmath>

namespace splitflow {

FsdMode fsd_mode_from_name(std::string_view name) {
  if (name == "off") return FsdMode::Off;
  if (name == "fsd") return FsdMode::Deterministic;
  if (name == "randomized") return FsdMode::Randomized;
  fail("fsd: unknown mode '{}' (expected off, fsd or randomized)", name);
}

std::string_view fsd_mode_name(FsdMode mode) {
  switch (mode) {
    case FsdMode::Off: return "off";
    case FsdMode::Deterministic: return "fsd";
    case FsdMode::Randomized: return "randomized";
  }
  return "?";
}

namespace {

// Written as "value inside the range" so NaN always fails.
void check_range(const char* name, float value, bool ok, const char* range) {
  SF_CHECK(ok && std::isfinite(value), "sampling parameter {} must be in {}, got {}", name, range, value);
}

}  // namespace

void SamplingParams::validate() const {
  check_range("temperature", temperature, temperature >= 0.0f, "[0, inf) (0 = greedy)");
  SF_CHECK(top_k >= 0, "sampling parameter top_k must be >= 0 (0 = off), got {}", top_k);
  check_range("top_p", top_p, top_p > 0.0f && top_p <= 1.0f, "(0, 1]");
  check_range("min_p", min_p, min_p >= 0.0f && min_p <= 1.0f, "[0, 1]");
  check_range("typical_p", typical_p, typical_p > 0.0f && typical_p <= 1.0f, "(0, 1]");
  check_range("tfs_z", tfs_z, tfs_z > 0.0f && tfs_z <= 1.0f, "(0, 1]");
  SF_CHECK(mirostat == 0 || mirostat == 1 || mirostat == 2,
           "sampling parameter mirostat must be 0, 1 or 2, got {}", mirostat);
  check_range("mirostat_tau", mirostat_tau, mirostat_tau > 0.0f, "(0, inf)");
  check_range("mirostat_eta", mirostat_eta, mirostat_eta > 0.0f, "(0, inf)");
  check_range("repetition_penalty", repetition_penalty, repetition_penalty > 0.0f, "(0, inf)");
  check_range("frequency_penalty", frequency_penalty,
              frequency_penalty >= -2.0f && frequency_penalty <= 2.0f, "[-2, 2]");
  check_range("presence_penalty", presence_penalty,
              presence_penalty >= -2.0f && presence_penalty <= 2.0f, "[-2, 2]");
  check_range("fsd_alpha", fsd_alpha, fsd_alpha >= 0.0f && fsd_alpha <= 1.0f, "[0, 1]");
  SF_CHECK(fsd_top_k >= 1, "sampling parameter fsd_top_k must be >= 1, got {}", fsd_top_k);
  SF_CHECK(fsd_ngram_order >= 1 && fsd_ngram_order <= kMaxFsdNgramOrder,
           "sampling parameter fsd_ngram_order must be in [1, {}], got {}", kMaxFsdNgramOrder,
           fsd_ngram_order);
  check_range("fsd_beta", fsd_beta, fsd_beta > 0.0f && fsd_beta <= 1.0f, "(0, 1]");
  SF_CHECK(fsd_random_steps >= 0, "sampling parameter fsd_random_steps must be >= 0, got {}",
           fsd_random_steps);
  check_range("fsd_random_probability", fsd_random_probability,
              fsd_random_probability >= 0.0f && fsd_random_probability <= 1.0f, "[0, 1]");
  SF_CHECK(max_tokens >= 1, "sampling parameter max_tokens must be >= 1, got {}", max_tokens);
  for (size_t i = 0; i < stop.size(); ++i) {
    SF_CHECK(!stop[i].empty(), "sampling parameter stop[{}] is an empty string (stop strings must be non-empty)", i);
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    SF_CHECK(stop_token_ids[i] >= 0, "sampling parameter stop_token_ids[{}] must be >= 0, got {}", i,
             stop_token_ids[i]);
  }
  SF_CHECK(top_logprobs >= 0 && top_logprobs <= kMaxTopLogprobs,
           "sampling parameter top_logprobs must be in [0, {}], got {}", kMaxTopLogprobs, top_logprobs);
}

void SamplingParams::validate_token_ids(int32_t vocab_size) const {
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    SF_CHECK(stop_token_ids[i] >= 0 && stop_token_ids[i] < vocab_size,
             "sampling parameter stop_token_ids[{}] = {} is outside the vocabulary [0, {})", i,
             stop_token_ids[i], vocab_size);
  }
}

}  // namespace splitflow
