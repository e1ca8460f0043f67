// Template resolution: each built-in template against the public config.json of a model it
// serves (expected values copied from those configs and the HF modeling code), user overrides,
// and the errors a user meets.
#include "core/error.h"
#include "model/config.h"
#include "model/embedded_specs.h"
#include "model/model_test_util.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

using namespace splitflow;
using nlohmann::json;
using test::expect_error;
using TempDir = test::ScratchDir;

namespace {

std::string config_dir(const std::string& name) { return test::fixture_path("model/configs/" + name); }

void expect_llama_tensor_names(const TensorNames& tensors) {
  EXPECT_EQ(tensors.embed, "model.embed_tokens");
  EXPECT_EQ(tensors.final_norm, "model.norm");
  EXPECT_EQ(tensors.lm_head, "lm_head");
  EXPECT_EQ(tensors.attn_norm, "model.layers.{layer}.input_layernorm");
  EXPECT_EQ(tensors.q, "model.layers.{layer}.self_attn.q_proj");
  EXPECT_EQ(tensors.k, "model.layers.{layer}.self_attn.k_proj");
  EXPECT_EQ(tensors.v, "model.layers.{layer}.self_attn.v_proj");
  EXPECT_EQ(tensors.o, "model.layers.{layer}.self_attn.o_proj");
  EXPECT_EQ(tensors.ffn_norm, "model.layers.{layer}.post_attention_layernorm");
  EXPECT_EQ(tensors.gate, "model.layers.{layer}.mlp.gate_proj");
  EXPECT_EQ(tensors.up, "model.layers.{layer}.mlp.up_proj");
  EXPECT_EQ(tensors.down, "model.layers.{layer}.mlp.down_proj");
  EXPECT_TRUE(tensors.qkv.empty());
  EXPECT_TRUE(tensors.gate_up.empty());
  EXPECT_FALSE(tensors.linear_transposed);
}

}  // namespace

TEST(Templates, EveryEmbeddedTemplateParsesAndServesSomething) {
  ASSERT_GE(embedded_specs().size(), 8u);
  for (const std::string name : {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "gpt2", "gpt_neox",
                                 "gguf_llama", "gguf_gemma3", "gguf_qwen2", "gguf_qwen3", "gguf_phi3", "llama2c"}) {
    const auto names = template_names();
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  const auto architectures = known_hf_architectures();
  for (const char* architecture : {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Phi3ForCausalLM",
                                   "GPT2LMHeadModel", "GPTNeoXForCausalLM"})
    EXPECT_NE(std::find(architectures.begin(), architectures.end(), architecture), architectures.end()) << architecture;
  EXPECT_EQ(known_gguf_architectures(), (std::vector<std::string>{"gemma3", "llama", "phi3", "qwen2", "qwen3"}));
}

TEST(Templates, Llama2_7B) {
  const ModelSpec spec = resolve_hf_spec(config_dir("llama-2-7b"));
  EXPECT_EQ(spec.name, "llama");
  EXPECT_EQ(spec.hidden_size, 4096);
  EXPECT_EQ(spec.num_layers, 32);
  EXPECT_EQ(spec.vocab_size, 32000);
  EXPECT_EQ(spec.max_position, 4096);
  EXPECT_EQ(spec.norm.type, NormType::RMSNorm);
  EXPECT_DOUBLE_EQ(spec.norm.eps, 1e-5);
  EXPECT_EQ(spec.attention.num_heads, 32);
  EXPECT_EQ(spec.attention.num_kv_heads, 32);
  EXPECT_EQ(spec.attention.head_dim, 128);
  EXPECT_FALSE(spec.attention.q_bias || spec.attention.k_bias || spec.attention.v_bias || spec.attention.o_bias);
  EXPECT_EQ(spec.attention.sliding_window, 0);
  EXPECT_EQ(spec.attention.qkv_layout, QkvLayout::Separate);
  EXPECT_EQ(spec.mlp.intermediate_size, 11008);
  EXPECT_EQ(spec.mlp.activation, Activation::SiLU);
  EXPECT_TRUE(spec.mlp.gated);
  EXPECT_FALSE(spec.mlp.gate_up_fused || spec.mlp.up_bias || spec.mlp.down_bias);
  EXPECT_EQ(spec.position, PositionType::Rope);
  EXPECT_DOUBLE_EQ(spec.rope.theta, 10000.0);  // absent from the config: HF's default
  EXPECT_EQ(spec.rope.style, RopeStyle::Half);
  EXPECT_EQ(spec.rope.scaling.type, RopeScalingType::None);
  EXPECT_EQ(spec.rotary_dim(), 128);
  EXPECT_FALSE(spec.tie_embeddings || spec.parallel_residual);
  EXPECT_EQ(spec.bos_token_id, 1);
  EXPECT_EQ(spec.eos_token_ids, std::vector<int>{2});
  expect_llama_tensor_names(spec.tensors);
}

TEST(Templates, Llama31_8B_Instruct_WithLlama3ScalingAndGenerationConfig) {
  const ModelSpec spec = resolve_hf_spec(config_dir("llama-3.1-8b-instruct"));
  EXPECT_EQ(spec.hidden_size, 4096);
  EXPECT_EQ(spec.vocab_size, 128256);
  EXPECT_EQ(spec.max_position, 131072);
  EXPECT_EQ(spec.attention.num_heads, 32);
  EXPECT_EQ(spec.attention.num_kv_heads, 8);
  EXPECT_EQ(spec.attention.head_dim, 128);
  EXPECT_EQ(spec.mlp.intermediate_size, 14336);
  EXPECT_DOUBLE_EQ(spec.rope.theta, 500000.0);
  const RopeScaling& scaling = spec.rope.scaling;
  EXPECT_EQ(scaling.type, RopeScalingType::Llama3);
  EXPECT_DOUBLE_EQ(scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(scaling.high_freq_factor, 4.0);
  EXPECT_EQ(scaling.original_max_position, 8192);
  EXPECT_EQ(spec.bos_token_id, 128000);
  EXPECT_EQ(spec.eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
  expect_llama_tensor_names(spec.tensors);
}

TEST(Templates, GenerationConfigEosWinsOverConfigJson) {
  TempDir dir;
  dir.file("config.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1,
    "vocab_size": 200, "max_position_embeddings": 32, "num_attention_heads": 4, "intermediate_size": 128,
    "bos_token_id": 1, "eos_token_id": 2})");
  dir.file("generation_config.json", R"({"bos_token_id": 1, "eos_token_id": [2, 9]})");
  EXPECT_EQ(resolve_hf_spec(dir.path()).eos_token_ids, (std::vector<int>{2, 9}));
}

TEST(Templates, Mistral7B_SlidingWindow) {
  const ModelSpec spec = resolve_hf_spec(config_dir("mistral-7b-v0.1"));
  EXPECT_EQ(spec.name, "mistral");
  EXPECT_EQ(spec.max_position, 32768);
  EXPECT_EQ(spec.attention.num_kv_heads, 8);
  EXPECT_EQ(spec.attention.head_dim, 128);
  EXPECT_EQ(spec.attention.sliding_window, 4096);
  EXPECT_EQ(spec.mlp.intermediate_size, 14336);
  EXPECT_DOUBLE_EQ(spec.norm.eps, 1e-5);
  EXPECT_EQ(spec.bos_token_id, 1);
  EXPECT_EQ(spec.eos_token_ids, std::vector<int>{2});
  expect_llama_tensor_names(spec.tensors);
}

TEST(Templates, Qwen2_7B_BiasesAndNoSlidingWindowUnlessEnabled) {
  const ModelSpec spec = resolve_hf_spec(config_dir("qwen2-7b-instruct"));
  EXPECT_EQ(spec.name, "qwen2");
  EXPECT_EQ(spec.hidden_size, 3584);
  EXPECT_EQ(spec.num_layers, 28);
  EXPECT_EQ(spec.vocab_size, 152064);
  EXPECT_EQ(spec.attention.num_heads, 28);
  EXPECT_EQ(spec.attention.num_kv_heads, 4);
  EXPECT_EQ(spec.attention.head_dim, 128);
  EXPECT_TRUE(spec.attention.q_bias && spec.attention.k_bias && spec.attention.v_bias);
  EXPECT_FALSE(spec.attention.o_bias);
  EXPECT_EQ(spec.attention.sliding_window, 0);  // use_sliding_window is false
  EXPECT_EQ(spec.mlp.intermediate_size, 18944);
  EXPECT_DOUBLE_EQ(spec.norm.eps, 1e-6);
  EXPECT_DOUBLE_EQ(spec.rope.theta, 1e6);
  EXPECT_EQ(spec.bos_token_id, 151643);
  EXPECT_EQ(spec.eos_token_ids, std::vector<int>{151645});
  expect_llama_tensor_names(spec.tensors);
}

TEST(Templates, Qwen2_SlidingWindowOnEveryLayerOrUnsupported) {
  json config = read_json_file(config_dir("qwen2-7b-instruct") + "/config.json");
  config["use_sliding_window"] = true;
  config["max_window_layers"] = 0;  // every layer slides
  SpecRequest request{config, "config.json (edited)", {"Qwen2ForCausalLM"}, "", "", {}};
  EXPECT_EQ(resolve_spec(request).attention.sliding_window, 131072);
  request.config["max_window_layers"] = 28;  // no layer >= 28 of 28 slides
  EXPECT_EQ(resolve_spec(request).attention.sliding_window, 0);
  request.config["max_window_layers"] = 14;  // half of them: one window per model cannot say that
  expect_error([&] { resolve_spec(request); }, {"config.json (edited)", "sliding window on some layers only",
                                                "models/qwen2.json"});
  // transformers >= 5 writes layer_types: then the layers >= max_window_layers slide.
  json types = json::array();
  for (int l = 0; l < 28; ++l) types.push_back(l >= 14 ? "sliding_attention" : "full_attention");
  request.config["layer_types"] = types;
  const ModelSpec spec = resolve_spec(request);
  EXPECT_EQ(spec.layer_sliding_window(13), 0);
  EXPECT_EQ(spec.layer_sliding_window(14), 131072);
  request.config["use_sliding_window"] = false;  // then HF writes every layer full anyway
  EXPECT_EQ(resolve_spec(request).layer_sliding_window(14), 0);
}

TEST(Templates, Phi3Mini4k_FusedProjections) {
  const ModelSpec spec = resolve_hf_spec(config_dir("phi-3-mini-4k-instruct"));
  EXPECT_EQ(spec.name, "phi3");
  EXPECT_EQ(spec.hidden_size, 3072);
  EXPECT_EQ(spec.vocab_size, 32064);
  EXPECT_EQ(spec.max_position, 4096);
  EXPECT_EQ(spec.attention.num_heads, 32);
  EXPECT_EQ(spec.attention.num_kv_heads, 32);
  EXPECT_EQ(spec.attention.head_dim, 96);
  EXPECT_EQ(spec.attention.sliding_window, 2047);
  EXPECT_EQ(spec.attention.qkv_layout, QkvLayout::Concat);
  EXPECT_EQ(spec.mlp.intermediate_size, 8192);
  EXPECT_TRUE(spec.mlp.gated && spec.mlp.gate_up_fused);
  EXPECT_EQ(spec.rope.scaling.type, RopeScalingType::None);
  EXPECT_EQ(spec.rotary_dim(), 96);
  EXPECT_EQ(spec.eos_token_ids, std::vector<int>{32000});
  EXPECT_EQ(spec.tensors.qkv, "model.layers.{layer}.self_attn.qkv_proj");
  EXPECT_EQ(spec.tensors.gate_up, "model.layers.{layer}.mlp.gate_up_proj");
  EXPECT_TRUE(spec.tensors.q.empty() && spec.tensors.gate.empty() && spec.tensors.up.empty());
}

TEST(Templates, Phi35Mini_LongRope) {
  const json config = read_json_file(config_dir("phi-3.5-mini-instruct") + "/config.json");
  const ModelSpec spec = resolve_hf_spec(config_dir("phi-3.5-mini-instruct"));
  EXPECT_EQ(spec.max_position, 131072);
  const RopeScaling& scaling = spec.rope.scaling;
  EXPECT_EQ(scaling.type, RopeScalingType::LongRope);
  EXPECT_DOUBLE_EQ(scaling.factor, 32.0);  // 131072 / 4096, as HF derives it
  EXPECT_EQ(scaling.original_max_position, 4096);
  EXPECT_FALSE(scaling.attention_factor);
  ASSERT_EQ(scaling.long_factor.size(), 48u);
  EXPECT_EQ(scaling.long_factor, config["rope_scaling"]["long_factor"].get<std::vector<double>>());
  EXPECT_EQ(scaling.short_factor, config["rope_scaling"]["short_factor"].get<std::vector<double>>());
  EXPECT_EQ(spec.attention.sliding_window, 262144);
}

TEST(Templates, Phi3_SuAndYarnAreLongRopeAndPartialRotary) {
  json config = read_json_file(config_dir("phi-3.5-mini-instruct") + "/config.json");
  config["rope_scaling"]["type"] = "su";
  SpecRequest request{config, "config.json (edited)", {"Phi3ForCausalLM"}, "", "", {}};
  EXPECT_EQ(resolve_spec(request).rope.scaling.type, RopeScalingType::LongRope);
  request.config["rope_scaling"]["type"] = "yarn";
  EXPECT_EQ(resolve_spec(request).rope.scaling.type, RopeScalingType::LongRope);
  // Phi-4-mini style: partial_rotary_factor 0.75 of head_dim 96 -> 72 rotary dims, 36 factors.
  request.config["partial_rotary_factor"] = 0.75;
  request.config["rope_scaling"]["long_factor"] = std::vector<double>(36, 1.0);
  request.config["rope_scaling"]["short_factor"] = std::vector<double>(36, 1.0);
  const ModelSpec spec = resolve_spec(request);
  EXPECT_DOUBLE_EQ(spec.rope.partial_factor, 0.75);
  EXPECT_EQ(spec.rotary_dim(), 72);
}

TEST(Templates, Gpt2) {
  const ModelSpec spec = resolve_hf_spec(config_dir("gpt2"));
  EXPECT_EQ(spec.name, "gpt2");
  EXPECT_EQ(spec.hidden_size, 768);
  EXPECT_EQ(spec.num_layers, 12);
  EXPECT_EQ(spec.vocab_size, 50257);
  EXPECT_EQ(spec.max_position, 1024);
  EXPECT_EQ(spec.norm.type, NormType::LayerNorm);
  EXPECT_TRUE(spec.norm.bias);
  EXPECT_DOUBLE_EQ(spec.norm.eps, 1e-5);
  EXPECT_EQ(spec.attention.num_heads, 12);
  EXPECT_EQ(spec.attention.num_kv_heads, 12);
  EXPECT_EQ(spec.attention.head_dim, 64);
  EXPECT_TRUE(spec.attention.q_bias && spec.attention.k_bias && spec.attention.v_bias && spec.attention.o_bias);
  EXPECT_EQ(spec.attention.qkv_layout, QkvLayout::Concat);
  EXPECT_EQ(spec.mlp.intermediate_size, 3072);  // n_inner absent: 4 * n_embd
  EXPECT_EQ(spec.mlp.activation, Activation::GELUTanh);
  EXPECT_FALSE(spec.mlp.gated);
  EXPECT_TRUE(spec.mlp.up_bias && spec.mlp.down_bias);
  EXPECT_EQ(spec.position, PositionType::Learned);
  EXPECT_TRUE(spec.tie_embeddings);
  EXPECT_TRUE(spec.tensors.linear_transposed);
  EXPECT_EQ(spec.tensors.name_prefixes, (std::vector<std::string>{"", "transformer."}));
  EXPECT_EQ(spec.tensors.embed, "wte");
  EXPECT_EQ(spec.tensors.pos_embed, "wpe");
  EXPECT_EQ(spec.tensors.qkv, "h.{layer}.attn.c_attn");
  EXPECT_EQ(spec.tensors.up, "h.{layer}.mlp.c_fc");
  EXPECT_EQ(spec.tensors.down, "h.{layer}.mlp.c_proj");
  EXPECT_EQ(spec.bos_token_id, 50256);
  EXPECT_EQ(spec.eos_token_ids, std::vector<int>{50256});
}

TEST(Templates, Gpt2_UnsupportedOptionsAreRejected) {
  json config = read_json_file(config_dir("gpt2") + "/config.json");
  config["scale_attn_by_inverse_layer_idx"] = true;
  SpecRequest request{config, "config.json (edited)", {"GPT2LMHeadModel"}, "", "", {}};
  expect_error([&] { resolve_spec(request); }, {"scale_attn_by_inverse_layer_idx", "is not supported"});
  request.config["scale_attn_by_inverse_layer_idx"] = false;
  request.config["n_inner"] = 1000;
  EXPECT_EQ(resolve_spec(request).mlp.intermediate_size, 1000);
}

TEST(Templates, Pythia160m) {
  const ModelSpec spec = resolve_hf_spec(config_dir("pythia-160m"));
  EXPECT_EQ(spec.name, "gpt_neox");
  EXPECT_EQ(spec.hidden_size, 768);
  EXPECT_EQ(spec.num_layers, 12);
  EXPECT_EQ(spec.vocab_size, 50304);
  EXPECT_EQ(spec.max_position, 2048);
  EXPECT_EQ(spec.norm.type, NormType::LayerNorm);
  EXPECT_TRUE(spec.norm.bias);
  EXPECT_EQ(spec.attention.head_dim, 64);
  EXPECT_EQ(spec.attention.qkv_layout, QkvLayout::PerHead);
  EXPECT_TRUE(spec.attention.q_bias && spec.attention.o_bias);
  EXPECT_EQ(spec.mlp.intermediate_size, 3072);
  EXPECT_EQ(spec.mlp.activation, Activation::GELU);
  EXPECT_FALSE(spec.mlp.gated);
  EXPECT_TRUE(spec.mlp.up_bias && spec.mlp.down_bias);
  EXPECT_DOUBLE_EQ(spec.rope.partial_factor, 0.25);
  EXPECT_EQ(spec.rotary_dim(), 16);
  EXPECT_EQ(spec.rope.style, RopeStyle::Half);
  EXPECT_TRUE(spec.parallel_residual);
  EXPECT_FALSE(spec.tie_embeddings);
  EXPECT_EQ(spec.tensors.embed, "gpt_neox.embed_in");
  EXPECT_EQ(spec.tensors.lm_head, "embed_out|lm_head");
  EXPECT_EQ(spec.tensors.qkv, "gpt_neox.layers.{layer}.attention.query_key_value");
  EXPECT_EQ(spec.bos_token_id, 0);
  EXPECT_EQ(spec.eos_token_ids, std::vector<int>{0});
}

// The tiny HF checkpoints of tests/fixtures/hf were written by transformers (python/make_hf_fixtures.py):
// every one resolves, and the values that vary between them come out as their configs say.
TEST(Templates, EveryHfFixtureConfigResolves) {
  const json index = read_json_file(test::fixture_path("hf/index.json"));
  for (const json& name : index["fixtures"]) {
    SCOPED_TRACE(name.get<std::string>());
    const std::string dir = test::fixture_path("hf/" + name.get<std::string>());
    const json config = read_json_file(dir + "/config.json");
    ModelSpec spec;
    ASSERT_NO_THROW(spec = resolve_hf_spec(dir));
    EXPECT_EQ(spec.vocab_size, config["vocab_size"].get<int>());
    const int heads = config.value("num_attention_heads", config.value("n_head", 0));
    EXPECT_EQ(spec.attention.num_heads, heads);
    EXPECT_EQ(spec.attention.num_kv_heads, config.value("num_key_value_heads", heads));
    EXPECT_EQ(spec.tie_embeddings, config.value("tie_word_embeddings", false));
  }
}

TEST(Templates, HfRopeVariantsFromFixtures) {
  const ModelSpec dynamic = resolve_hf_spec(test::fixture_path("hf/llama_dynamic"));
  EXPECT_EQ(dynamic.rope.scaling.type, RopeScalingType::DynamicNTK);
  EXPECT_DOUBLE_EQ(dynamic.rope.scaling.factor, 2.0);
  EXPECT_EQ(dynamic.rope.scaling.original_max_position, 10);  // = max_position_embeddings, as in HF
  const ModelSpec yarn = resolve_hf_spec(test::fixture_path("hf/llama_yarn"));
  EXPECT_EQ(yarn.rope.scaling.type, RopeScalingType::YaRN);
  EXPECT_DOUBLE_EQ(yarn.rope.scaling.factor, 4.0);
  EXPECT_EQ(yarn.rope.scaling.original_max_position, 256);
  EXPECT_DOUBLE_EQ(yarn.rope.scaling.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(yarn.rope.scaling.beta_slow, 1.0);
  const ModelSpec linear = resolve_hf_spec(test::fixture_path("hf/llama_linear"));
  EXPECT_EQ(linear.rope.scaling.type, RopeScalingType::Linear);
  EXPECT_DOUBLE_EQ(linear.rope.scaling.factor, 4.0);
  // transformers 5 writes rope_parameters (with rope_theta inside) instead of rope_scaling.
  const ModelSpec v5 = resolve_hf_spec(test::fixture_path("hf/llama3_rope_parameters"));
  EXPECT_EQ(v5.rope.scaling.type, RopeScalingType::Llama3);
  EXPECT_DOUBLE_EQ(v5.rope.theta, 500000.0);
  EXPECT_EQ(v5.rope.scaling.original_max_position, 64);
  EXPECT_EQ(v5.attention.head_dim, 16);
  const ModelSpec longrope = resolve_hf_spec(test::fixture_path("hf/phi3_longrope"));
  EXPECT_EQ(longrope.rope.scaling.type, RopeScalingType::LongRope);
  EXPECT_DOUBLE_EQ(longrope.rope.scaling.factor, 8.0);  // 32 / 4
  EXPECT_EQ(longrope.rope.scaling.original_max_position, 4);
  const ModelSpec neox_serial = resolve_hf_spec(test::fixture_path("hf/gpt_neox_serial"));
  EXPECT_FALSE(neox_serial.parallel_residual);
  EXPECT_EQ(neox_serial.rotary_dim(), 8);  // 0.5 of head_dim 16
}

TEST(Templates, GgufLlamaFromMetadata) {
  // The keys llama.cpp writes for stories260K (see ../shared/models/README.md).
  json metadata = {{"general.architecture", "llama"},
                   {"llama.context_length", 512},
                   {"llama.embedding_length", 64},
                   {"llama.feed_forward_length", 172},
                   {"llama.attention.head_count", 8},
                   {"llama.attention.head_count_kv", 4},
                   {"llama.block_count", 5},
                   {"llama.rope.dimension_count", 8},
                   {"llama.attention.layer_norm_rms_epsilon", 1e-5},
                   {"tokenizer.ggml.tokens", std::vector<std::string>(512, "x")},
                   {"tokenizer.ggml.bos_token_id", 1},
                   {"tokenizer.ggml.eos_token_id", 2}};
  SpecRequest request{metadata, "GGUF metadata", {}, "llama", "", {}};
  const ModelSpec spec = resolve_spec(request);
  EXPECT_EQ(spec.hidden_size, 64);
  EXPECT_EQ(spec.num_layers, 5);
  EXPECT_EQ(spec.vocab_size, 512);  // len(tokenizer.ggml.tokens)
  EXPECT_EQ(spec.max_position, 512);
  EXPECT_EQ(spec.attention.num_kv_heads, 4);
  EXPECT_EQ(spec.attention.head_dim, 8);
  EXPECT_EQ(spec.mlp.intermediate_size, 172);
  EXPECT_DOUBLE_EQ(spec.rope.theta, 10000.0);
  EXPECT_DOUBLE_EQ(spec.rope.partial_factor, 1.0);
  EXPECT_EQ(spec.rope.style, RopeStyle::Interleaved);
  EXPECT_EQ(spec.rope.scaling.type, RopeScalingType::None);
  EXPECT_TRUE(spec.tensors.lm_head_optional);
  EXPECT_EQ(spec.tensors.q, "blk.{layer}.attn_q");
  EXPECT_EQ(spec.bos_token_id, 1);
  EXPECT_EQ(spec.eos_token_ids, std::vector<int>{2});

  request.config["llama.rope.freq_base"] = 500000.0;
  request.config["llama.rope.scaling.type"] = "linear";
  request.config["llama.rope.scaling.factor"] = 4.0;
  request.config["llama.vocab_size"] = 600;
  const ModelSpec scaled = resolve_spec(request);
  EXPECT_DOUBLE_EQ(scaled.rope.theta, 500000.0);
  EXPECT_EQ(scaled.rope.scaling.type, RopeScalingType::Linear);
  EXPECT_DOUBLE_EQ(scaled.rope.scaling.factor, 4.0);
  EXPECT_EQ(scaled.vocab_size, 600);

  request.config["llama.expert_count"] = 8;
  expect_error([&] { resolve_spec(request); }, {"mixture-of-experts"});
}

TEST(Templates, Llama2cFromHeader) {
  const json header = {{"dim", 64},       {"hidden_dim", 172}, {"n_layers", 5},   {"n_heads", 8},
                       {"n_kv_heads", 4}, {"vocab_size", 512}, {"seq_len", 512}, {"shared_classifier", true}};
  SpecRequest request{header, "llama2c header", {}, "", "llama2c", {}};
  const ModelSpec spec = resolve_spec(request);
  EXPECT_EQ(spec.hidden_size, 64);
  EXPECT_EQ(spec.attention.head_dim, 8);
  EXPECT_EQ(spec.attention.num_kv_heads, 4);
  EXPECT_EQ(spec.mlp.intermediate_size, 172);
  EXPECT_EQ(spec.max_position, 512);
  EXPECT_DOUBLE_EQ(spec.norm.eps, 1e-5);
  EXPECT_EQ(spec.rope.style, RopeStyle::Interleaved);
  EXPECT_TRUE(spec.tie_embeddings);
  EXPECT_EQ(spec.tensors.embed, "tok_embeddings");
  EXPECT_EQ(spec.tensors.gate, "layers.{layer}.feed_forward.w1");
  EXPECT_EQ(spec.tensors.up, "layers.{layer}.feed_forward.w3");
  EXPECT_EQ(spec.tensors.down, "layers.{layer}.feed_forward.w2");
  request.config["shared_classifier"] = false;
  EXPECT_FALSE(resolve_spec(request).tie_embeddings);
}

TEST(Overrides, UserSpecPatchesAnyField) {
  TempDir dir;
  const std::string patch = dir.file("override.json", R"({
    // shorter context, a sliding window, and different rope scaling
    "max_position": 2048,
    "attention": {"sliding_window": 1024},
    "rope": {"scaling": {"type": "linear", "factor": 2.0}},
    "eos_token_ids": "$eos_token_id | [] "
  })");
  const ModelSpec spec = resolve_hf_spec(config_dir("llama-2-7b"), patch);
  EXPECT_EQ(spec.max_position, 2048);
  EXPECT_EQ(spec.attention.sliding_window, 1024);
  EXPECT_EQ(spec.attention.num_heads, 32);  // untouched fields keep the template's values
  EXPECT_EQ(spec.rope.scaling.type, RopeScalingType::Linear);
  EXPECT_EQ(spec.eos_token_ids, std::vector<int>{2});
}

TEST(Overrides, PatchedSpecIsRevalidated) {
  TempDir dir;
  const std::string patch = dir.file("bad.json", R"({"attention": {"num_kv_heads": 3}})");
  expect_error([&] { resolve_hf_spec(config_dir("llama-2-7b"), patch); },
               {"model spec (template models/llama.json + spec file '", "attention.num_kv_heads: 3 does not divide num_heads 32"});
  const std::string null_patch = dir.file("null.json", R"({"tensors": {"lm_head": null}})");
  expect_error([&] { resolve_hf_spec(config_dir("llama-2-7b"), null_patch); },
               {"tensors.lm_head: missing, needed because tie_embeddings is false"});
}

TEST(Overrides, TemplateKeyPicksABaseForAnUnknownArchitecture) {
  TempDir dir;
  dir.file("config.json", R"({"architectures": ["MyLlamaLikeForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "vocab_size": 100, "max_position_embeddings": 64, "num_attention_heads": 4, "intermediate_size": 96})");
  const std::string spec_path = dir.file("spec.json", R"({"template": "llama", "name": "my-llama", "norm": {"eps": 1e-6}})");
  const ModelSpec spec = resolve_hf_spec(dir.path(), spec_path);
  EXPECT_EQ(spec.name, "my-llama");
  EXPECT_EQ(spec.hidden_size, 64);
  EXPECT_DOUBLE_EQ(spec.norm.eps, 1e-6);
  const std::string bad = dir.file("bad.json", R"({"template": "falcon"})");
  expect_error([&] { resolve_hf_spec(dir.path(), bad); }, {"template: no built-in template 'falcon'", "known: ", "llama"});
}

TEST(Overrides, CompleteSpecNeedsNoConfig) {
  TempDir dir;
  const std::string spec_path = dir.file("spec.json", R"({
    "hidden_size": 64, "num_layers": 1, "vocab_size": 10, "max_position": 8,
    "attention": {"num_heads": 4}, "mlp": {"intermediate_size": 16},
    "tensors": {"embed": "e", "final_norm": "n", "lm_head": "h", "attn_norm": "{layer}.a", "q": "{layer}.q",
                "k": "{layer}.k", "v": "{layer}.v", "o": "{layer}.o", "ffn_norm": "{layer}.f",
                "gate": "{layer}.g", "up": "{layer}.u", "down": "{layer}.d"}
  })");
  EXPECT_EQ(resolve_hf_spec(dir.path(), spec_path).hidden_size, 64);  // no config.json in dir
  EXPECT_EQ(resolve_config_spec(spec_path).hidden_size, 64);          // --dummy-weights with a spec
  const std::string patch = dir.file("patch.json", R"({"num_layers": 3})");
  EXPECT_EQ(resolve_config_spec(spec_path, patch).num_layers, 3);
  // A spec that references the config cannot resolve without one.
  const std::string referencing = dir.file("ref.json", R"({"hidden_size": "$hidden_size"})");
  expect_error([&] { resolve_hf_spec(dir.path(), referencing); },
               {"hidden_size: 'hidden_size' is not in the model's config (there is none)"});
}

TEST(Overrides, DummyWeightsFromConfigJson) {
  const ModelSpec spec = resolve_config_spec(config_dir("llama-3.1-8b-instruct") + "/config.json");
  EXPECT_EQ(spec.num_layers, 32);
  EXPECT_EQ(spec.rope.scaling.type, RopeScalingType::Llama3);
}

// Gemma 3 270M's GGUF metadata (gemma-3-270m-q4_k_m.gguf, less the tokenizer arrays): what
// llama.cpp hard-codes for gemma3 (every 6th layer global, local RoPE base 10000, scale
// 1/sqrt(head_dim)) comes from the template.
TEST(Templates, GgufGemma3) {
  const json metadata = json::parse(R"({
    "general.architecture": "gemma3", "gemma3.context_length": 32768, "gemma3.embedding_length": 640,
    "gemma3.block_count": 18, "gemma3.feed_forward_length": 2048, "gemma3.attention.head_count": 4,
    "gemma3.attention.layer_norm_rms_epsilon": 1e-6, "gemma3.attention.key_length": 256,
    "gemma3.attention.value_length": 256, "gemma3.rope.freq_base": 1000000.0,
    "gemma3.attention.sliding_window": 512, "gemma3.attention.head_count_kv": 1, "gemma3.vocab_size": 262144,
    "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1})");
  const ModelSpec spec = resolve_spec(SpecRequest{metadata, "GGUF metadata", {}, "gemma3", "", {}});
  EXPECT_EQ(spec.attention.head_dim, 256);
  EXPECT_EQ(spec.attention.num_kv_heads, 1);
  EXPECT_DOUBLE_EQ(spec.attention_scale(), 1.0 / 16);
  EXPECT_TRUE(spec.attention.qk_norm && spec.post_norms);
  EXPECT_EQ(spec.norm.weight_offset, 0.0);  // llama.cpp stores 1 + w
  EXPECT_DOUBLE_EQ(spec.embedding_multiplier, std::sqrt(640.0));
  EXPECT_EQ(spec.mlp.activation, Activation::GELUTanh);
  EXPECT_EQ(spec.rope.style, RopeStyle::Half);
  for (int l = 0; l < 18; ++l) {
    const bool global = l % 6 == 5;
    EXPECT_EQ(spec.layer_sliding_window(l), global ? 0 : 512) << l;
    EXPECT_EQ(spec.layer_rope_spec(l).rope.theta, global ? 1e6 : 1e4) << l;
  }
  EXPECT_EQ(spec.tensors.q_norm, "blk.{layer}.attn_q_norm");
  EXPECT_EQ(spec.tensors.post_attn_norm, "blk.{layer}.post_attention_norm");
  EXPECT_EQ(spec.tensors.post_ffn_norm, "blk.{layer}.post_ffw_norm");
}

TEST(Templates, GgufQwen2Qwen3Phi3) {
  const auto metadata = [](const std::string& arch, json extra) {
    json m = {{"general.architecture", arch}, {arch + ".context_length", 4096}, {arch + ".embedding_length", 1024},
              {arch + ".block_count", 4}, {arch + ".feed_forward_length", 3072}, {arch + ".attention.head_count", 16},
              {arch + ".attention.head_count_kv", 8}, {arch + ".attention.layer_norm_rms_epsilon", 1e-6},
              {arch + ".rope.freq_base", 1000000.0}, {arch + ".vocab_size", 1000}};
    if (extra.is_object()) m.update(extra);
    return m;
  };
  const ModelSpec qwen2 = resolve_spec(SpecRequest{metadata("qwen2", {}), "GGUF metadata", {}, "qwen2", "", {}});
  EXPECT_TRUE(qwen2.attention.q_bias && qwen2.attention.k_bias && qwen2.attention.v_bias && !qwen2.attention.o_bias);
  EXPECT_EQ(qwen2.rope.style, RopeStyle::Half);
  EXPECT_EQ(qwen2.tensors.q, "blk.{layer}.attn_q");
  const ModelSpec qwen3 = resolve_spec(
      SpecRequest{metadata("qwen3", {{"qwen3.attention.key_length", 128}}), "GGUF metadata", {}, "qwen3", "", {}});
  EXPECT_EQ(qwen3.attention.head_dim, 128);
  EXPECT_TRUE(qwen3.attention.qk_norm);
  EXPECT_FALSE(qwen3.attention.q_bias);
  EXPECT_EQ(qwen3.tensors.k_norm, "blk.{layer}.attn_k_norm");
  const ModelSpec phi3 = resolve_spec(SpecRequest{
      metadata("phi3", {{"phi3.rope.dimension_count", 64}, {"phi3.rope.scaling.original_context_length", 4096},
                        {"phi3.attention.sliding_window", 2047}}),
      "GGUF metadata", {}, "phi3", "", {}});
  EXPECT_EQ(phi3.attention.qkv_layout, QkvLayout::Concat);
  EXPECT_TRUE(phi3.mlp.gate_up_fused);
  EXPECT_EQ(phi3.tensors.gate_up, "blk.{layer}.ffn_up");
  EXPECT_EQ(phi3.attention.sliding_window, 2047);
  EXPECT_EQ(phi3.rotary_dim(), 64);
  expect_error([&] {
    resolve_spec(SpecRequest{metadata("phi3", {{"phi3.rope.scaling.original_context_length", 1024}}), "GGUF metadata",
                             {}, "phi3", "", {}});
  }, {"LongRoPE phi3 GGUF"});
}

TEST(BadInput, UnknownArchitectureSaysWhatToDo) {
  TempDir dir;
  dir.file("config.json", R"({"architectures": ["FalconForCausalLM"], "hidden_size": 64})");
  expect_error([&] { resolve_hf_spec(dir.path()); },
               {"config.json '", "no built-in template serves architectures [FalconForCausalLM]",
                "known: BartForConditionalGeneration, BertForMaskedLM, ",
                "GPT2LMHeadModel, GPTNeoXForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, LlamaForCausalLM, MarianMTModel, "
                "MistralForCausalLM, Phi3ForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, RobertaForMaskedLM",
                "hidden_size, num_layers, vocab_size, max_position, norm, attention, mlp", "--spec",
                "\"template\": \"<name>\""});
  SpecRequest gguf{{{"general.architecture", "falcon"}}, "GGUF metadata of 'x.gguf'", {}, "falcon", "", {}};
  expect_error([&] { resolve_spec(gguf); },
               {"GGUF metadata of 'x.gguf'", "general.architecture 'falcon'", "known: gemma3, llama, phi3, qwen2, qwen3",
                "--spec"});
}

TEST(BadInput, NoArchitecturesOrNoConfig) {
  TempDir dir;
  expect_error([&] { resolve_hf_spec(dir.path()); }, {"no config.json", "--spec"});
  dir.file("config.json", R"({"hidden_size": 64})");
  expect_error([&] { resolve_hf_spec(dir.path()); }, {"no \"architectures\" list", "--spec"});
}

TEST(BadInput, MissingConfigKeyNamesTemplateFieldAndKey) {
  TempDir dir;
  dir.file("config.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "vocab_size": 100, "num_attention_heads": 4, "intermediate_size": 96})");
  expect_error([&] { resolve_hf_spec(dir.path()); },
               {"template models/llama.json: max_position: 'max_position_embeddings' is not in config.json '",
                "(needed by \"$max_position_embeddings\")", "--spec"});
}

TEST(BadInput, WrongTypesAndValuesInConfig) {
  TempDir dir;
  dir.file("config.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": "64", "num_hidden_layers": 2,
    "vocab_size": 100, "max_position_embeddings": 64, "num_attention_heads": 4, "intermediate_size": 96})");
  expect_error([&] { resolve_hf_spec(dir.path()); },
               {"template models/llama.json: attention.head_dim: expression", "'/' needs numbers, got \"64\" and 4"});
  dir.file("config.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": "2",
    "vocab_size": 100, "max_position_embeddings": 64, "num_attention_heads": 4, "intermediate_size": 96})");
  expect_error([&] { resolve_hf_spec(dir.path()); }, {"num_layers: expected an integer, got \"2\""});
  dir.file("config.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "vocab_size": 100, "max_position_embeddings": 64, "num_attention_heads": 4, "num_key_value_heads": 3,
    "intermediate_size": 96})");
  expect_error([&] { resolve_hf_spec(dir.path()); },
               {"model spec (template models/llama.json + config.json '", "attention.num_kv_heads: 3 does not divide num_heads 4"});
  dir.file("config.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "vocab_size": 100, "max_position_embeddings": 64, "num_attention_heads": 4, "intermediate_size": 96,
    "hidden_act": "swiglu"})");
  expect_error([&] { resolve_hf_spec(dir.path()); }, {"mlp.activation: unknown value 'swiglu'"});
  dir.file("config.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "vocab_size": 100, "max_position_embeddings": 64, "num_attention_heads": 4, "intermediate_size": 96,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "beta": 2}})");
  expect_error([&] { resolve_hf_spec(dir.path()); }, {"rope.scaling.beta: unknown field"});
}

TEST(BadInput, MalformedJsonFileNamesTheFile) {
  TempDir dir;
  dir.file("config.json", R"({"architectures": ["LlamaForCausalLM"],})");
  expect_error([&] { resolve_hf_spec(dir.path()); }, {"config.json'", "invalid JSON"});
  dir.file("config.json", R"([1, 2])");
  expect_error([&] { resolve_hf_spec(dir.path()); }, {"expected a JSON object"});
  expect_error([&] { resolve_config_spec(dir.path() + "/absent.json"); }, {"absent.json"});
}
