// Spec JSON parsing, validation and round trip; template expressions.
#include "core/error.h"
#include "model/spec.h"
#include "model/template.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace splitflow;
using nlohmann::json;

namespace {

// A small complete Llama-like spec, as a user would write it.
json minimal_spec() {
  return json::parse(R"({
    "name": "tiny",
    "hidden_size": 64, "num_layers": 2, "vocab_size": 100, "max_position": 128,
    "attention": {"num_heads": 8, "num_kv_heads": 4},
    "mlp": {"intermediate_size": 172},
    "tensors": {
      "embed": "emb", "final_norm": "norm", "lm_head": "head",
      "attn_norm": "l{layer}.n1", "q": "l{layer}.q", "k": "l{layer}.k", "v": "l{layer}.v", "o": "l{layer}.o",
      "ffn_norm": "l{layer}.n2", "gate": "l{layer}.g", "up": "l{layer}.u", "down": "l{layer}.d"
    }
  })");
}

// Expects spec_from_json(json) to throw an Error whose message contains `needle`.
void expect_spec_error(const json& spec, const std::string& needle) {
  try {
    spec_from_json(spec);
    ADD_FAILURE() << "no error for " << spec.dump() << " (expected '" << needle << "')";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
  }
}

json with(json spec, const std::string& pointer, json value) {
  spec[json::json_pointer(pointer)] = std::move(value);
  return spec;
}

json evaluate(const std::string& expression, const json& config) {
  ExpressionValue value = evaluate_expression(expression, config);
  EXPECT_TRUE(value.value.has_value()) << expression;
  return value.value.value_or(json("<missing>"));
}

}  // namespace

TEST(Spec, MinimalSpecTakesDocumentedDefaults) {
  const ModelSpec spec = spec_from_json(minimal_spec());
  EXPECT_EQ(spec.hidden_size, 64);
  EXPECT_EQ(spec.attention.head_dim, 8);  // hidden_size / num_heads
  EXPECT_EQ(spec.attention.num_kv_heads, 4);
  EXPECT_EQ(spec.norm.type, NormType::RMSNorm);
  EXPECT_DOUBLE_EQ(spec.norm.eps, 1e-5);
  EXPECT_EQ(spec.mlp.activation, Activation::SiLU);
  EXPECT_TRUE(spec.mlp.gated);
  EXPECT_EQ(spec.position, PositionType::Rope);
  EXPECT_DOUBLE_EQ(spec.rope.theta, 10000.0);
  EXPECT_EQ(spec.rope.style, RopeStyle::Half);
  EXPECT_EQ(spec.rope.scaling.type, RopeScalingType::None);
  EXPECT_EQ(spec.attention.qkv_layout, QkvLayout::Separate);
  EXPECT_EQ(spec.tensors.name_prefixes, std::vector<std::string>{""});
  EXPECT_EQ(spec.bos_token_id, -1);
  EXPECT_TRUE(spec.eos_token_ids.empty());
  EXPECT_EQ(spec.rotary_dim(), 8);
  EXPECT_DOUBLE_EQ(spec.attention_scale(), 1.0 / std::sqrt(8.0));
}

TEST(Spec, NumKvHeadsDefaultsToNumHeads) {
  json spec = minimal_spec();
  spec["attention"].erase("num_kv_heads");
  EXPECT_EQ(spec_from_json(spec).attention.num_kv_heads, 8);
}

TEST(Spec, RotaryDimAndScale) {
  json spec = minimal_spec();
  spec["attention"]["head_dim"] = 10;
  spec["rope"] = {{"partial_factor", 0.25}};  // 2.5 -> 2
  spec["attention"]["softmax_scale"] = 0.125;
  const ModelSpec parsed = spec_from_json(spec);
  EXPECT_EQ(parsed.rotary_dim(), 2);
  EXPECT_DOUBLE_EQ(parsed.attention_scale(), 0.125);
  spec["rope"]["partial_factor"] = 0.75;  // 7.5 -> 7 -> 6 (even)
  EXPECT_EQ(spec_from_json(spec).rotary_dim(), 6);
}

TEST(Spec, CommentsAreAllowedInSpecFiles) {
  const json parsed = json::parse("{ // a comment\n \"a\": 1 /* another */ }", nullptr, true, true);
  EXPECT_EQ(parsed["a"], 1);
}

TEST(Spec, RoundTripsThroughJson) {
  json spec = minimal_spec();
  spec["norm"] = {{"type", "layernorm"}, {"eps", 1e-6}, {"bias", true}, {"weight_offset", 1.0}};
  spec["attention"]["q_bias"] = true;
  spec["attention"]["sliding_window"] = 4096;
  spec["mlp"]["activation"] = "gelu_new";  // alias, written back as gelu_tanh
  spec["mlp"]["up_bias"] = true;
  spec["rope"] = {{"theta", 5e5},
                  {"style", "interleaved"},
                  {"scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"original_max_position_embeddings", 64}}}};
  spec["parallel_residual"] = true;
  spec["tensors"]["name_prefixes"] = {"", "model."};
  spec["bos_token_id"] = 1;
  spec["eos_token_ids"] = 2;  // a single id is accepted
  const ModelSpec parsed = spec_from_json(spec);
  EXPECT_EQ(parsed.mlp.activation, Activation::GELUTanh);
  EXPECT_EQ(parsed.eos_token_ids, std::vector<int>{2});
  const json written = spec_to_json(parsed);
  EXPECT_EQ(written["mlp"]["activation"], "gelu_tanh");
  EXPECT_EQ(written["rope"]["scaling"]["type"], "llama3");
  EXPECT_EQ(written["rope"]["scaling"]["original_max_position"], 64);
  EXPECT_EQ(spec_from_json(written), parsed);
}

TEST(Spec, LongRopeRoundTripsAndDefaultsOriginalToMaxPosition) {
  json spec = minimal_spec();
  spec["rope"] = {{"scaling", {{"type", "su"}, {"long_factor", {1.0, 2.0, 3.0, 4.0}}, {"short_factor", {1, 1, 1, 1}},
                               {"attention_factor", 1.2}, {"factor", 4}}}};
  const ModelSpec parsed = spec_from_json(spec);
  EXPECT_EQ(parsed.rope.scaling.type, RopeScalingType::LongRope);
  EXPECT_EQ(parsed.rope.scaling.original_max_position, 128);
  ASSERT_TRUE(parsed.rope.scaling.attention_factor);
  EXPECT_DOUBLE_EQ(*parsed.rope.scaling.attention_factor, 1.2);
  EXPECT_EQ(spec_from_json(spec_to_json(parsed)), parsed);
}

// llama.cpp's per-pair divisors (a GGUF rope_freqs tensor, also writable in a spec file): rotary_dim/2
// positive entries, no original context needed.
TEST(Spec, FreqFactorsRoundTripAndAreChecked) {
  json spec = minimal_spec();  // head_dim 8: four pairs
  spec["rope"] = {{"scaling", {{"type", "freq_factors"}, {"freq_factors", {1.0, 1.5, 4.0, 8.0}}}}};
  const ModelSpec parsed = spec_from_json(spec);
  EXPECT_EQ(parsed.rope.scaling.type, RopeScalingType::FreqFactors);
  EXPECT_EQ(parsed.rope.scaling.freq_factors, (std::vector<double>{1.0, 1.5, 4.0, 8.0}));
  EXPECT_EQ(spec_from_json(spec_to_json(parsed)), parsed);
  expect_spec_error(with(minimal_spec(), "/rope", {{"scaling", {{"type", "freq_factors"}, {"freq_factors", {1.0}}}}}),
                    "rope.scaling.freq_factors: 1 entries, expected rotary_dim/2 = 4");
  expect_spec_error(with(minimal_spec(), "/rope", {{"scaling", {{"type", "freq_factors"}, {"freq_factors", {1.0, 0.0, 1.0, 1.0}}}}}),
                    "rope.scaling.freq_factors[1]: must be > 0, got 0");
}

TEST(Spec, HfRopeParametersObjectIsAccepted) {
  json spec = minimal_spec();
  spec["rope"] = {{"theta", 500000.0},
                  {"scaling", json::parse(R"({"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 64, "rope_theta": 500000.0, "rope_type": "llama3"})")}};
  const ModelSpec parsed = spec_from_json(spec);
  EXPECT_EQ(parsed.rope.scaling.type, RopeScalingType::Llama3);
  EXPECT_DOUBLE_EQ(parsed.rope.scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(parsed.rope.scaling.high_freq_factor, 4.0);
  // "default" means no scaling; its rope_theta must still agree.
  spec["rope"]["scaling"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  EXPECT_EQ(spec_from_json(spec).rope.scaling, RopeScaling{});
  spec["rope"]["scaling"]["rope_theta"] = 10000.0;
  expect_spec_error(spec, "rope.scaling.rope_theta: 10000 disagrees with rope.theta 500000");
}

// Gemma 3's per-layer attention: layer_types over full_attention_interval over "every layer
// slides"; rope.sliding gives the sliding layers their own base and scaling.
TEST(Spec, SlidingAndFullLayersWithTheirOwnRope) {
  json j = minimal_spec();
  j["num_layers"] = 6;
  j["attention"]["sliding_window"] = 512;
  j["attention"]["full_attention_interval"] = 3;
  j["rope"] = json::parse(R"({"theta": 1e6, "scaling": {"rope_type": "linear", "factor": 8},
                              "sliding": {"theta": 10000, "scaling": {"rope_type": "default", "rope_theta": 10000}}})");
  ModelSpec spec = spec_from_json(j);
  const std::vector<int> windows = {512, 512, 0, 512, 512, 0};
  for (int l = 0; l < 6; ++l) EXPECT_EQ(spec.layer_sliding_window(l), windows[l]) << "layer " << l;
  EXPECT_EQ(spec.layer_rope_spec(0).rope.theta, 1e4);
  EXPECT_EQ(spec.layer_rope_spec(0).rope.scaling.type, RopeScalingType::None);
  EXPECT_EQ(spec.layer_rope_spec(2).rope.theta, 1e6);
  EXPECT_EQ(spec.layer_rope_spec(2).rope.scaling.type, RopeScalingType::Linear);
  EXPECT_EQ(spec_from_json(spec_to_json(spec)), spec);

  j["attention"]["layer_types"] = {"full_attention", "sliding_attention", "sliding", "full", "full", "sliding"};
  spec = spec_from_json(j);
  EXPECT_EQ(spec.layer_sliding_window(0), 0);
  EXPECT_EQ(spec.layer_sliding_window(2), 512);
  EXPECT_EQ(spec_from_json(spec_to_json(spec)), spec);

  expect_spec_error(with(j, "/attention/layer_types", {"full"}), "attention.layer_types: 1 entries, num_layers is 6");
  expect_spec_error(with(j, "/attention/layer_types/1", "local"), "attention.layer_types[1]: unknown value 'local'");
  expect_spec_error(with(j, "/attention/sliding_window", 0), "attention.layer_types[1]: sliding, but attention.sliding_window is 0");
  expect_spec_error(with(j, "/rope/sliding/scaling/rope_theta", 5), "rope.sliding.scaling.rope_theta: 5 disagrees with rope.sliding.theta 10000");
  j["rope"]["sliding"].erase("scaling");
  expect_spec_error(with(j, "/rope/sliding/theta", -1), "rope.sliding.theta: must be > 0");
}

TEST(Spec, QkNormPostNormsAndSoftcapsNeedTheirTensors) {
  json j = minimal_spec();
  j["attention"]["qk_norm"] = true;
  expect_spec_error(j, "tensors.q_norm: missing, needed because attention.qk_norm is true");
  j["tensors"]["q_norm"] = "l{layer}.qn";
  j["tensors"]["k_norm"] = "l{layer}.kn";
  j["post_norms"] = true;
  expect_spec_error(j, "tensors.post_attn_norm: missing, needed because post_norms is true");
  j["tensors"]["post_attn_norm"] = "l{layer}.pa";
  j["tensors"]["post_ffn_norm"] = "l{layer}.pf";
  j["final_logit_softcap"] = 30;
  j["attention"]["logit_softcap"] = 50;
  const ModelSpec spec = spec_from_json(j);
  EXPECT_TRUE(spec.attention.qk_norm && spec.post_norms);
  EXPECT_EQ(spec.final_logit_softcap, 30);
  EXPECT_EQ(spec.attention.logit_softcap, 50);
  EXPECT_EQ(spec_from_json(spec_to_json(spec)), spec);
  expect_spec_error(with(j, "/attention/qk_norm", false), "tensors.q_norm: 'l{layer}.qn' given, but attention.qk_norm is false");
  expect_spec_error(with(j, "/final_logit_softcap", -1), "final_logit_softcap: must be >= 0");
}

TEST(Spec, NullMeansDefault) {
  json spec = minimal_spec();
  spec["rope"] = {{"scaling", nullptr}, {"theta", nullptr}};
  spec["attention"]["head_dim"] = nullptr;
  const ModelSpec parsed = spec_from_json(spec);
  EXPECT_EQ(parsed.rope.scaling.type, RopeScalingType::None);
  EXPECT_DOUBLE_EQ(parsed.rope.theta, 10000.0);
  EXPECT_EQ(parsed.attention.head_dim, 8);
}

TEST(Spec, UnknownKeysAreRejectedWithTheirPath) {
  expect_spec_error(with(minimal_spec(), "/hiden_size", 3), "hiden_size: unknown field");
  expect_spec_error(with(minimal_spec(), "/attention/num_kv_head", 3), "attention.num_kv_head: unknown field");
  expect_spec_error(with(minimal_spec(), "/rope", {{"scaling", {{"type", "yarn"}, {"fator", 2}}}}),
                    "rope.scaling.fator: unknown field");
  expect_spec_error(with(minimal_spec(), "/tensors/qproj", "x"), "tensors.qproj: unknown field");
}

TEST(Spec, WrongTypesNameTheField) {
  expect_spec_error(with(minimal_spec(), "/hidden_size", "64"), "hidden_size: expected an integer, got \"64\"");
  expect_spec_error(with(minimal_spec(), "/hidden_size", 64.5), "hidden_size: expected an integer, got 64.5");
  expect_spec_error(with(minimal_spec(), "/attention/q_bias", 1), "attention.q_bias: expected true or false");
  expect_spec_error(with(minimal_spec(), "/norm/eps", "small"), "norm.eps: expected a number");
  expect_spec_error(with(minimal_spec(), "/mlp/activation", 3), "mlp.activation: expected one of silu, gelu, gelu_tanh, relu");
  expect_spec_error(with(minimal_spec(), "/mlp/activation", "swiglu"), "mlp.activation: unknown value 'swiglu'");
  expect_spec_error(with(minimal_spec(), "/norm/type", "batchnorm"), "norm.type: unknown value 'batchnorm'");
  expect_spec_error(with(minimal_spec(), "/rope", {{"style", "neox"}}), "rope.style: unknown value 'neox'");
  expect_spec_error(with(minimal_spec(), "/attention", 8), "attention: expected an object");
  expect_spec_error(with(minimal_spec(), "/tensors/q", 5), "tensors.q: expected a string");
  expect_spec_error(with(minimal_spec(), "/eos_token_ids", {2, "x"}), "eos_token_ids[1]: expected an integer");
  expect_spec_error(with(minimal_spec(), "/rope", {{"scaling", {{"type", "longrope"}, {"long_factor", {1, "a"}}}}}),
                    "rope.scaling.long_factor[1]: expected a number");
}

TEST(Spec, MissingRequiredFields) {
  json spec = minimal_spec();
  spec.erase("vocab_size");
  expect_spec_error(spec, "vocab_size: missing (required)");
  spec = minimal_spec();
  spec["attention"].erase("num_heads");
  expect_spec_error(spec, "attention.num_heads: missing (required)");
  spec = minimal_spec();
  spec.erase("tensors");
  expect_spec_error(spec, "tensors: missing (required)");
}

TEST(Spec, InvalidValues) {
  expect_spec_error(with(minimal_spec(), "/attention/num_kv_heads", 3), "attention.num_kv_heads: 3 does not divide num_heads 8");
  expect_spec_error(with(minimal_spec(), "/attention/num_kv_heads", 16), "attention.num_kv_heads: must be in [1, num_heads 8]");
  expect_spec_error(with(minimal_spec(), "/hidden_size", 0), "hidden_size: must be > 0");
  expect_spec_error(with(minimal_spec(), "/num_layers", -1), "num_layers: must be > 0");
  expect_spec_error(with(minimal_spec(), "/norm/eps", 0), "norm.eps: must be > 0");
  expect_spec_error(with(minimal_spec(), "/norm/bias", true), "norm.bias: only layernorm has a bias");
  expect_spec_error(with(minimal_spec(), "/attention/sliding_window", -5), "attention.sliding_window: must be >= 0");
  expect_spec_error(with(minimal_spec(), "/rope", {{"partial_factor", 1.5}}), "rope.partial_factor: must be in (0, 1]");
  expect_spec_error(with(minimal_spec(), "/rope", {{"theta", -1}}), "rope.theta: must be > 0");
  expect_spec_error(with(minimal_spec(), "/rope", {{"scaling", {{"type", "linear"}, {"factor", 0.5}}}}),
                    "rope.scaling.factor: linear scaling needs a factor >= 1");
  expect_spec_error(with(minimal_spec(), "/rope", {{"scaling", {{"type", "llama3"}, {"factor", 8}}}}),
                    "rope.scaling.original_max_position: llama3 scaling needs it > 0");
  expect_spec_error(
      with(minimal_spec(), "/rope",
           {{"scaling", {{"type", "llama3"}, {"factor", 8}, {"original_max_position", 64}, {"high_freq_factor", 0.5}}}}),
      "rope.scaling.high_freq_factor: 0.5 must exceed low_freq_factor 1");
  expect_spec_error(with(minimal_spec(), "/rope",
                         {{"scaling", {{"type", "longrope"}, {"long_factor", {1, 1}}, {"short_factor", {1, 1, 1, 1}}}}}),
                    "rope.scaling.long_factor: 2 entries, expected rotary_dim/2 = 4");
  expect_spec_error(with(minimal_spec(), "/rope", {{"scaling", {{"type", "yarn"}, {"rope_type", "linear"}}}}),
                    "rope.scaling: type \"yarn\" and rope_type \"linear\" disagree");
  expect_spec_error(with(minimal_spec(), "/bos_token_id", 100), "bos_token_id: 100 is outside the vocabulary");
  expect_spec_error(with(minimal_spec(), "/eos_token_ids", {2, 1000}), "eos_token_ids[1]: 1000 is outside the vocabulary");
  expect_spec_error(with(minimal_spec(), "/network", "encoder_decoder"), "encoder: network encoder_decoder needs an \"encoder\" object");
  expect_spec_error(with(minimal_spec(), "/network", "encoder_only"),
                    "tensors.lm_head: 'head' given, but an encoder_only model returns its states");
  expect_spec_error(with(minimal_spec(), "/attention/causal", false), "attention.causal: false needs network encoder_only");
  expect_spec_error(with(minimal_spec(), "/position_offset", 2), "position_offset: 2 needs learned positions");
  expect_spec_error(with(minimal_spec(), "/position", "alibi"), "position: alibi is not supported yet");
  expect_spec_error(with(minimal_spec(), "/shared_layer_norm", true), "shared_layer_norm: needs parallel_residual");
  expect_spec_error(with(minimal_spec(), "/hidden_size", 60), "attention.head_dim: missing, and hidden_size 60 is not a multiple");
}

TEST(Spec, TensorNamesMustMatchTheModules) {
  json spec = minimal_spec();
  spec["tensors"]["q"] = "";
  expect_spec_error(spec, "tensors.q: missing, needed because attention.qkv_layout is separate");
  spec = minimal_spec();
  spec["attention"]["qkv_layout"] = "concat";
  expect_spec_error(spec, "tensors.qkv: missing, needed because attention.qkv_layout is concat");
  spec["tensors"]["qkv"] = "l{layer}.qkv";
  expect_spec_error(spec, "tensors.q: 'l{layer}.q' given, but attention.qkv_layout is fused");
  spec = minimal_spec();
  spec["attention"]["qkv_layout"] = "per_head";
  expect_spec_error(spec, "attention.qkv_layout: per_head needs num_kv_heads == num_heads");
  spec = minimal_spec();
  spec["tensors"]["q"] = "q_proj";
  expect_spec_error(spec, "tensors.q: 'q_proj' has no {layer} placeholder");
  spec = minimal_spec();
  spec["tensors"]["embed"] = "emb{layer}";
  expect_spec_error(spec, "tensors.embed: 'emb{layer}' is a model-level tensor");
  spec = minimal_spec();
  spec["mlp"]["gated"] = false;
  expect_spec_error(spec, "tensors.gate: 'l{layer}.g' given, but mlp.gated is false");
  spec = minimal_spec();
  spec["mlp"]["gate_up_fused"] = true;
  expect_spec_error(spec, "tensors.gate_up: missing, needed because mlp.gate_up_fused is true");
  spec = minimal_spec();
  spec["tensors"]["lm_head"] = "";
  expect_spec_error(spec, "tensors.lm_head: missing, needed because tie_embeddings is false");
  spec["tie_embeddings"] = true;
  EXPECT_NO_THROW(spec_from_json(spec));
  spec = minimal_spec();
  spec["position"] = "learned";
  expect_spec_error(spec, "tensors.pos_embed: missing, needed because position is learned");
  spec = minimal_spec();
  spec["tensors"]["name_prefixes"] = json::array();
  expect_spec_error(spec, "tensors.name_prefixes: expected a non-empty array");
}

TEST(TemplateExpression, ReferencesAndAlternatives) {
  const json config = json::parse(R"({"a": 4096, "b": 32, "n": null, "nested": {"x": {"y": 7}}, "list": [1, 2, 3],
                                      "llama.embedding_length": 64, "flag": true, "name": "gelu_new"})");
  EXPECT_EQ(evaluate("$a", config), 4096);
  EXPECT_EQ(evaluate("$missing | $a", config), 4096);
  EXPECT_EQ(evaluate("$n | 10000", config), 10000);  // null counts as absent
  EXPECT_EQ(evaluate("$missing | null", config), nullptr);
  EXPECT_EQ(evaluate("$missing | []", config), json::array());
  EXPECT_EQ(evaluate("$missing | {\"k\": [1, \"]\"]}", config), json::parse(R"({"k": [1, "]"]})"));
  EXPECT_EQ(evaluate("$missing | \"quoted | text\"", config), "quoted | text");
  EXPECT_EQ(evaluate("$missing | silu", config), "silu");
  EXPECT_EQ(evaluate("$name", config), "gelu_new");
  EXPECT_EQ(evaluate("$nested.x.y", config), 7);
  EXPECT_EQ(evaluate("$list.1", config), 2);
  EXPECT_EQ(evaluate("$llama.embedding_length", config), 64);  // exact dotted key first
  EXPECT_EQ(evaluate("len($list)", config), 3);
  EXPECT_EQ(evaluate("$missing | -1", config), -1);
  EXPECT_EQ(evaluate("1e-5", config), 1e-5);

  ExpressionValue missing = evaluate_expression("$x | $y.z", config);
  EXPECT_FALSE(missing.value);
  EXPECT_EQ(missing.missing_keys, (std::vector<std::string>{"x", "y.z"}));
}

TEST(TemplateExpression, Arithmetic) {
  const json config = {{"hidden", 4096}, {"heads", 32}, {"odd", 3}, {"pct", 0.25}, {"flag", true}};
  EXPECT_EQ(evaluate("$hidden / $heads", config), 128);
  EXPECT_TRUE(evaluate("$hidden / $heads", config).is_number_integer());
  EXPECT_DOUBLE_EQ(evaluate("$odd / 2", config).get<double>(), 1.5);
  EXPECT_EQ(evaluate("4 * $hidden", config), 16384);
  EXPECT_EQ(evaluate("$missing | 4 * $hidden", config), 16384);  // | binds looser than arithmetic
  EXPECT_EQ(evaluate("$hidden / $missing | 1", config), 1);
  EXPECT_EQ(evaluate("2 + 3 * 4 - -1", config), 15);
  EXPECT_EQ(evaluate("(2 + 3) * 4", config), 20);
  EXPECT_DOUBLE_EQ(evaluate("$pct * 64", config).get<double>(), 16.0);
  EXPECT_EQ(evaluate("$flag ? 1 : 2", config), 1);
  EXPECT_EQ(evaluate("$missing | false ? 1 : 2", config), 2);
  EXPECT_EQ(evaluate("$odd > 2 ? ($odd == 3 ? yes : no) : never", config), "yes");
  EXPECT_EQ(evaluate("$flag == 1", config), true);  // booleans compare as 0/1
  EXPECT_EQ(evaluate("$missing | 0 > 0", config), false);
  // The branch not taken is not evaluated.
  EXPECT_EQ(evaluate("$heads > 100 ? $hidden / 0 : 5", config), 5);
}

TEST(TemplateExpression, Sqrt) {
  const json config = {{"hidden", 640}, {"scalar", 256}};
  EXPECT_DOUBLE_EQ(evaluate("sqrt($hidden)", config).get<double>(), std::sqrt(640.0));
  EXPECT_DOUBLE_EQ(evaluate("1 / sqrt($missing | $scalar)", config).get<double>(), 1.0 / 16);
}

TEST(TemplateExpression, Errors) {
  const json config = {{"s", "text"}, {"a", 1}};
  const std::pair<const char*, const char*> cases[] = {
      {"$a +", "unexpected end"},
      {"$", "expected a config key after '$'"},
      {"$a.", "expected a config key after '$'"},
      {"($a", "expected ')'"},
      {"$a $a", "unexpected '$a'"},
      {"$s * 2", "'*' needs numbers, got \"text\" and 2"},
      {"$a / 0", "division by zero"},
      {"$s ? 1 : 2", "a condition must be a boolean or a number"},
      {"len($a)", "len() needs an array, string or object"},
      {"[1, 2", "unterminated literal"},
      {"$s < 2", "'<' needs numbers"},
  };
  for (const auto& [expression, needle] : cases) {
    try {
      evaluate_expression(expression, config);
      ADD_FAILURE() << "no error for " << expression;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << expression << ": " << error.what();
    }
  }
}

TEST(TemplateExpression, EvaluateTemplateNamesPathAndKeys) {
  const json spec_template = json::parse(R"({"a": {"b": ["$x", "$y | $z"]}, "plain": "no refs", "n": 5})");
  const json out = evaluate_template(spec_template, {{"x", 1}, {"z", 2}}, "test config");
  EXPECT_EQ(out, json::parse(R"({"a": {"b": [1, 2]}, "plain": "no refs", "n": 5})"));
  try {
    evaluate_template(spec_template, {{"x", 1}}, "config.json 'c.json'");
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(),
                 "a.b[1]: 'y' or 'z' are not in config.json 'c.json' (needed by \"$y | $z\"); give the field in a "
                 "spec file with --spec");
  }
}
