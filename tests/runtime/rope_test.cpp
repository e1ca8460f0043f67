// RoPE frequencies and cos/sin rows against HF transformers' values for every scaling type
// (tests/fixtures/runtime/rope_cases.json, written by make_rope_fixture.py from transformers' own
// rope init functions and LlamaRotaryEmbedding.forward, dynamic updates included).
#include "runtime/rope.h"

#include "core/error.h"
#include "core/mapped_file.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

using namespace splitflow;
using nlohmann::json;

namespace {

RopeScalingType scaling_type(const std::string& name) {
  if (name == "default") return RopeScalingType::None;
  if (name == "linear") return RopeScalingType::Linear;
  if (name == "dynamic") return RopeScalingType::DynamicNTK;
  if (name == "yarn") return RopeScalingType::YaRN;
  if (name == "llama3") return RopeScalingType::Llama3;
  if (name == "longrope") return RopeScalingType::LongRope;
  fail("rope fixture: unknown rope_type {}", name);
}

// The spec fields HF's rope_parameters carry, mapped by hand (this test checks rope.cpp, not the
// config mapping).
ModelSpec spec_for(const json& c) {
  ModelSpec spec;
  spec.attention.head_dim = c["head_dim"];
  spec.max_position = c["max_position"];
  spec.rope.partial_factor = c["partial_factor"];
  const json& p = c["rope_parameters"];
  spec.rope.theta = p["rope_theta"];
  RopeScaling& s = spec.rope.scaling;
  s.type = scaling_type(p["rope_type"]);
  s.factor = p.value("factor", 1.0);
  s.original_max_position = p.value("original_max_position_embeddings", spec.max_position);
  s.low_freq_factor = p.value("low_freq_factor", 1.0);
  s.high_freq_factor = p.value("high_freq_factor", 4.0);
  s.beta_fast = p.value("beta_fast", 32.0);
  s.beta_slow = p.value("beta_slow", 1.0);
  // HF uses the mscale ratio only when both are given; the spec's defaults (1, 0) select the plain form.
  s.mscale = p.value("mscale", 1.0);
  s.mscale_all_dim = p.value("mscale_all_dim", 0.0);
  if (p.contains("attention_factor")) s.attention_factor = p["attention_factor"].get<double>();
  if (p.contains("long_factor")) s.long_factor = p["long_factor"].get<std::vector<double>>();
  if (p.contains("short_factor")) s.short_factor = p["short_factor"].get<std::vector<double>>();
  return spec;
}

TEST(Rope, FrequenciesAndRowsMatchTransformers) {
  const json fixture = json::parse(read_text_file(test::fixture_path("runtime/rope_cases.json")));
  ASSERT_GE(fixture["cases"].size(), 9u);
  for (const json& c : fixture["cases"]) {
    const ModelSpec spec = spec_for(c);
    for (const json& probe : c["probes"]) {
      const int64_t seq_len = probe["seq_len"];
      // The runner asks for length-specific frequencies only past rope_static_length.
      const RopeFrequencies freqs = rope_frequencies(spec, seq_len > rope_static_length(spec) ? seq_len : 0);
      const std::vector<double> want = probe["inv_freq"];
      const std::string where = fmt::format("{} seq_len {}", c["name"].get<std::string>(), seq_len);
      ASSERT_EQ(freqs.inv_freq.size(), want.size()) << where;
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(freqs.inv_freq[i], want[i], 2.5e-7 * std::abs(want[i])) << where << " inv_freq[" << i << "]";
      EXPECT_FLOAT_EQ(freqs.attention_factor, probe["attention_factor"].get<double>()) << where;

      std::vector<float> row(2 * want.size());
      for (size_t r = 0; r < probe["positions"].size(); ++r) {
        const int64_t position = probe["positions"][r];
        fill_rope_row(freqs, position, row.data());
        for (size_t i = 0; i < want.size(); ++i) {
          // Equal fp32 angles give cos/sin within an ulp; a one-ulp difference in inv_freq moves
          // the angle by position * 6e-8, hence the position term.
          const double tolerance = 1e-6 + 1.2e-7 * position * want[i];
          EXPECT_NEAR(row[i], probe["cos"][r][i].get<double>(), tolerance) << where << " cos p=" << position << " i=" << i;
          EXPECT_NEAR(row[want.size() + i], probe["sin"][r][i].get<double>(), tolerance)
              << where << " sin p=" << position << " i=" << i;
        }
      }
    }
  }
}

TEST(Rope, StaticLengthOnlyForLengthDependentScalings) {
  ModelSpec spec;
  spec.attention.head_dim = 64;
  spec.max_position = 2048;
  for (RopeScalingType type : {RopeScalingType::None, RopeScalingType::Linear, RopeScalingType::YaRN, RopeScalingType::Llama3}) {
    spec.rope.scaling.type = type;
    EXPECT_EQ(rope_static_length(spec), std::numeric_limits<int64_t>::max());
  }
  spec.rope.scaling.type = RopeScalingType::DynamicNTK;
  spec.rope.scaling.original_max_position = 1024;
  EXPECT_EQ(rope_static_length(spec), 1024);
  spec.rope.scaling.type = RopeScalingType::LongRope;
  EXPECT_EQ(rope_static_length(spec), 1024);
}

TEST(Rope, LongRopeRejectsWrongFactorCount) {
  ModelSpec spec;
  spec.attention.head_dim = 16;
  spec.max_position = 64;
  spec.rope.scaling.type = RopeScalingType::LongRope;
  spec.rope.scaling.original_max_position = 32;
  spec.rope.scaling.short_factor = {1.0, 1.0};  // needs 8
  spec.rope.scaling.long_factor = {1.0, 1.0};
  EXPECT_THROW(rope_frequencies(spec, 0), Error);
}

}  // namespace
