#include "core/error.h"
#include "engine/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

namespace splitflow {
namespace {

// Expects validate() to throw splitflow::Error whose message names `parameter`.
void expect_invalid(const std::function<void(SamplingParams&)>& change, const std::string& parameter) {
  SamplingParams params;
  change(params);
  try {
    params.validate();
    ADD_FAILURE() << "no error for an invalid " << parameter;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(parameter), std::string::npos) << e.what();
  }
}

TEST(SamplingParams, DefaultsAreValidAndOff) {
  SamplingParams params;
  EXPECT_NO_THROW(params.validate());
  EXPECT_EQ(params.temperature, 1.0f);
  EXPECT_EQ(params.top_k, 0);
  EXPECT_EQ(params.top_p, 1.0f);
  EXPECT_EQ(params.min_p, 0.0f);
  EXPECT_EQ(params.typical_p, 1.0f);
  EXPECT_EQ(params.tfs_z, 1.0f);
  EXPECT_EQ(params.mirostat, 0);
  EXPECT_EQ(params.repetition_penalty, 1.0f);
  EXPECT_EQ(params.frequency_penalty, 0.0f);
  EXPECT_EQ(params.presence_penalty, 0.0f);
  EXPECT_EQ(params.fsd, FsdMode::Off);
  EXPECT_FALSE(params.seed.has_value());
  EXPECT_FALSE(params.ignore_eos);
}

TEST(SamplingParams, BoundaryValuesAreValid) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.top_p = 1.0f;
  params.min_p = 1.0f;
  params.typical_p = 1.0f;
  params.tfs_z = 1.0f;
  params.mirostat = 2;
  params.frequency_penalty = -2.0f;
  params.presence_penalty = 2.0f;
  params.fsd_alpha = 1.0f;
  params.fsd_ngram_order = SamplingParams::kMaxFsdNgramOrder;
  params.fsd_random_probability = 0.0f;
  params.max_tokens = 1;
  params.top_logprobs = SamplingParams::kMaxTopLogprobs;
  EXPECT_NO_THROW(params.validate());
  params.fsd_alpha = 0.0f;
  params.min_p = 0.0f;
  params.fsd_random_steps = 0;
  EXPECT_NO_THROW(params.validate());
}

TEST(SamplingParams, EachInvalidValueNamesItsParameter) {
  const float nan = std::nanf("");
  expect_invalid([](auto& p) { p.temperature = -0.1f; }, "temperature");
  expect_invalid([&](auto& p) { p.temperature = nan; }, "temperature");
  expect_invalid([](auto& p) { p.temperature = INFINITY; }, "temperature");
  expect_invalid([](auto& p) { p.top_k = -1; }, "top_k");
  expect_invalid([](auto& p) { p.top_p = 0.0f; }, "top_p");
  expect_invalid([](auto& p) { p.top_p = 1.01f; }, "top_p");
  expect_invalid([&](auto& p) { p.top_p = nan; }, "top_p");
  expect_invalid([](auto& p) { p.min_p = -0.01f; }, "min_p");
  expect_invalid([](auto& p) { p.min_p = 1.5f; }, "min_p");
  expect_invalid([](auto& p) { p.typical_p = 0.0f; }, "typical_p");
  expect_invalid([](auto& p) { p.typical_p = 2.0f; }, "typical_p");
  expect_invalid([](auto& p) { p.tfs_z = 0.0f; }, "tfs_z");
  expect_invalid([](auto& p) { p.tfs_z = 1.5f; }, "tfs_z");
  expect_invalid([](auto& p) { p.mirostat = 3; }, "mirostat");
  expect_invalid([](auto& p) { p.mirostat = -1; }, "mirostat");
  expect_invalid([](auto& p) { p.mirostat_tau = 0.0f; }, "mirostat_tau");
  expect_invalid([](auto& p) { p.mirostat_eta = -0.1f; }, "mirostat_eta");
  expect_invalid([](auto& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty");
  expect_invalid([](auto& p) { p.repetition_penalty = -1.0f; }, "repetition_penalty");
  expect_invalid([](auto& p) { p.frequency_penalty = 2.5f; }, "frequency_penalty");
  expect_invalid([](auto& p) { p.frequency_penalty = -2.5f; }, "frequency_penalty");
  expect_invalid([](auto& p) { p.presence_penalty = 3.0f; }, "presence_penalty");
  expect_invalid([](auto& p) { p.presence_penalty = -3.0f; }, "presence_penalty");
  expect_invalid([](auto& p) { p.fsd_alpha = -0.1f; }, "fsd_alpha");
  expect_invalid([](auto& p) { p.fsd_alpha = 1.1f; }, "fsd_alpha");
  expect_invalid([](auto& p) { p.fsd_top_k = 0; }, "fsd_top_k");
  expect_invalid([](auto& p) { p.fsd_ngram_order = 0; }, "fsd_ngram_order");
  expect_invalid([](auto& p) { p.fsd_ngram_order = SamplingParams::kMaxFsdNgramOrder + 1; }, "fsd_ngram_order");
  expect_invalid([](auto& p) { p.fsd_beta = 0.0f; }, "fsd_beta");
  expect_invalid([](auto& p) { p.fsd_beta = 1.5f; }, "fsd_beta");
  expect_invalid([](auto& p) { p.fsd_random_steps = -1; }, "fsd_random_steps");
  expect_invalid([](auto& p) { p.fsd_random_probability = 1.5f; }, "fsd_random_probability");
  expect_invalid([](auto& p) { p.max_tokens = 0; }, "max_tokens");
  expect_invalid([](auto& p) { p.stop = {"ok", ""}; }, "stop[1]");
  expect_invalid([](auto& p) { p.stop_token_ids = {-3}; }, "stop_token_ids");
  expect_invalid([](auto& p) { p.top_logprobs = -1; }, "top_logprobs");
  expect_invalid([](auto& p) { p.top_logprobs = SamplingParams::kMaxTopLogprobs + 1; }, "top_logprobs");
}

TEST(SamplingParams, MessageGivesTheAllowedRangeAndTheValue) {
  SamplingParams params;
  params.top_p = 1.5f;
  try {
    params.validate();
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("(0, 1]"), std::string::npos) << message;
    EXPECT_NE(message.find("1.5"), std::string::npos) << message;
  }
}

TEST(SamplingParams, StopTokenIdsMustBeInTheVocabulary) {
  SamplingParams params;
  params.stop_token_ids = {3, 10};
  EXPECT_NO_THROW(params.validate_token_ids(11));
  try {
    params.validate_token_ids(10);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stop_token_ids[1]"), std::string::npos) << e.what();
  }
}

TEST(SamplingParams, FsdModeNames) {
  EXPECT_EQ(fsd_mode_from_name("off"), FsdMode::Off);
  EXPECT_EQ(fsd_mode_from_name("fsd"), FsdMode::Deterministic);
  EXPECT_EQ(fsd_mode_from_name("randomized"), FsdMode::Randomized);
  EXPECT_EQ(fsd_mode_name(FsdMode::Randomized), "randomized");
  EXPECT_THROW(fsd_mode_from_name("beam"), Error);
}

}  // namespace
}  // namespace splitflow
