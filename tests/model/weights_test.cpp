// Weight binding: the same trained model in three formats binds to the same canonical weights;
// HF fixtures written by transformers land in the canonical layout (checked against index
// formulas over the stored tensors); a hand-written spec loads a renamed checkpoint; bad
// checkpoints give errors naming the tensor; dummy weights are fast and deterministic.
#include "core/dtype.h"
#include "core/error.h"
#include "formats/safetensors_writer.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "model/model_test_util.h"
#include "model/weights.h"
#include "quant/quant.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <sstream>

using namespace splitflow;
using nlohmann::json;
using test::expect_error;
using test::ScratchDir;

namespace {

struct Loaded {
  std::unique_ptr<WeightSource> source;
  ModelSpec spec;
  ModelWeights weights;
};

Loaded load(const std::string& path, DType dtype = DType::F32, const std::string& user_spec = "") {
  Loaded loaded;
  loaded.source = open_weights(path);
  loaded.spec = resolve_source_spec(*loaded.source, path, user_spec);
  loaded.weights = bind_weights(loaded.spec, *loaded.source, dtype);
  return loaded;
}

std::string stories_hf() { return test::shared_path("models/stories260K-hf"); }
std::string stories_gguf() { return test::shared_path("models/stories260K-gguf/stories260K.gguf"); }
std::string stories_gguf_f16() { return test::shared_path("models/stories260K-gguf/stories260K-f16.gguf"); }
std::string stories_llama2c() { return test::shared_path("models/stories260K/stories260K.bin"); }

std::vector<float> values(const Tensor& generated_or_stored) {
  const Tensor tensor = materialize(generated_or_stored);
  std::vector<float> out(static_cast<size_t>(tensor.numel()));
  convert_to_f32(tensor.dtype, tensor.data, out.data(), out.size());
  return out;
}

const Tensor& stored(const WeightSource& source, const std::string& name) {
  const TensorInfo* info = source.find(name);
  if (!info) throw Error("test: no tensor " + name);
  return info->tensor;
}

void expect_same(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape, b.shape) << what;
  EXPECT_TRUE(values(a) == values(b)) << what;
}

// Rows [begin, end) of a [rows, cols] tensor, as floats.
std::vector<float> rows(const Tensor& tensor, int64_t begin, int64_t end) {
  const std::vector<float> all = values(tensor);
  const int64_t cols = tensor.shape.size() == 1 ? 1 : tensor.dim(1);
  return {all.begin() + begin * cols, all.begin() + end * cols};
}

// HF's convert_llama_weights_to_hf permutes Meta's q/k rows per head: HF row h*hd + p*hd/2 + i
// holds Meta row h*hd + 2i + p (p in {0, 1}). Returns Meta's order from HF's rows [begin, begin + heads*hd).
std::vector<float> unpermute_hf_rows(const Tensor& wqkv, int64_t begin, int heads, int head_dim) {
  const int64_t cols = wqkv.dim(1);
  const std::vector<float> hf = rows(wqkv, begin, begin + int64_t{heads} * head_dim);
  std::vector<float> meta(hf.size());
  for (int h = 0; h < heads; ++h)
    for (int p = 0; p < 2; ++p)
      for (int i = 0; i < head_dim / 2; ++i) {
        const int64_t hf_row = int64_t{h} * head_dim + p * head_dim / 2 + i;
        const int64_t meta_row = int64_t{h} * head_dim + 2 * i + p;
        std::copy_n(hf.begin() + hf_row * cols, cols, meta.begin() + meta_row * cols);
      }
  return meta;
}

float round_to_f16(float value) { return f16_to_f32(f32_to_f16(value)); }

// Collects what spdlog writes while it lives.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(stream_)) {
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  std::string text() const { return stream_.str(); }

 private:
  std::ostringstream stream_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

// The stories260K-hf tensors, renamed by `rename` (old name -> new name; others dropped when
// `keep_others` is false) and written to `path`.
void write_renamed(const WeightSource& source, const std::map<std::string, std::string>& rename, const std::string& path,
                   bool keep_others = true) {
  std::vector<TensorInfo> tensors;
  for (const TensorInfo& info : source.tensors()) {
    auto it = rename.find(info.name);
    if (it == rename.end() && !keep_others) continue;
    TensorInfo copy = info;
    if (it != rename.end()) copy.name = it->second;
    tensors.push_back(copy);
  }
  write_safetensors(path, tensors);
}

}  // namespace

TEST(Stories, ThreeFormatsBindToTheSameWeights) {
  const Loaded hf = load(stories_hf());
  const Loaded gguf = load(stories_gguf());
  const Loaded bin = load(stories_llama2c());

  for (const Loaded* model : {&hf, &gguf, &bin}) {
    const ModelSpec& spec = model->spec;
    EXPECT_EQ(spec.hidden_size, 64);
    EXPECT_EQ(spec.num_layers, 5);
    EXPECT_EQ(spec.vocab_size, 512);
    EXPECT_EQ(spec.max_position, 512);
    EXPECT_EQ(spec.attention.num_heads, 8);
    EXPECT_EQ(spec.attention.num_kv_heads, 4);
    EXPECT_EQ(spec.attention.head_dim, 8);
    EXPECT_EQ(spec.mlp.intermediate_size, 172);
    EXPECT_NEAR(spec.norm.eps, 1e-5, 1e-12);  // GGUF stores it as f32
    EXPECT_EQ(spec.bos_token_id, 1);
    EXPECT_EQ(spec.eos_token_ids, std::vector<int>{2});
    ASSERT_EQ(model->weights.layers.size(), 5u);
  }
  EXPECT_EQ(hf.spec.rope.style, RopeStyle::Half);
  EXPECT_EQ(gguf.spec.rope.style, RopeStyle::Interleaved);
  EXPECT_EQ(bin.spec.rope.style, RopeStyle::Interleaved);
  EXPECT_TRUE(hf.spec.tie_embeddings);
  EXPECT_TRUE(bin.spec.tie_embeddings);
  EXPECT_EQ(hf.weights.lm_head.data, hf.weights.embed.data);
  EXPECT_EQ(bin.weights.lm_head.data, bin.weights.embed.data);

  const ModelWeights& reference = bin.weights;
  for (const Loaded* model : {&hf, &gguf}) {
    const ModelWeights& weights = model->weights;
    expect_same(weights.embed, reference.embed, "embed");
    expect_same(weights.lm_head, reference.lm_head, "lm_head");  // GGUF's output.weight is a copy
    expect_same(weights.final_norm, reference.final_norm, "final_norm");
    for (size_t layer = 0; layer < 5; ++layer) {
      const LayerWeights& got = weights.layers[layer];
      const LayerWeights& want = reference.layers[layer];
      const std::string at = " layer " + std::to_string(layer);
      expect_same(got.attn_norm, want.attn_norm, "attn_norm" + at);
      expect_same(got.ffn_norm, want.ffn_norm, "ffn_norm" + at);
      expect_same(got.wo, want.wo, "wo" + at);
      expect_same(got.w_gate_up, want.w_gate_up, "w_gate_up" + at);
      expect_same(got.w_down, want.w_down, "w_down" + at);
      ASSERT_EQ(got.wqkv.shape, (Shape{128, 64}));
      EXPECT_TRUE(got.bqkv.empty());
      EXPECT_EQ(rows(got.wqkv, 96, 128), rows(want.wqkv, 96, 128)) << "v" << at;
      if (model == &hf) {
        EXPECT_EQ(unpermute_hf_rows(got.wqkv, 0, 8, 8), rows(want.wqkv, 0, 64)) << "q" << at;
        EXPECT_EQ(unpermute_hf_rows(got.wqkv, 64, 4, 8), rows(want.wqkv, 64, 96)) << "k" << at;
      } else {
        EXPECT_EQ(rows(got.wqkv, 0, 96), rows(want.wqkv, 0, 96)) << "q, k" << at;
      }
    }
  }

  // The canonical w_gate_up is gate rows (w1) then up rows (w3); check against llama2c's tensors.
  EXPECT_EQ(rows(reference.layers[2].w_gate_up, 0, 172), values(stored(*bin.source, "layers.2.feed_forward.w1.weight")));
  EXPECT_EQ(rows(reference.layers[2].w_gate_up, 172, 344), values(stored(*bin.source, "layers.2.feed_forward.w3.weight")));
  EXPECT_EQ(rows(reference.layers[2].wqkv, 64, 96), values(stored(*bin.source, "layers.2.attention.wk.weight")));
}

TEST(Stories, GgufF16BindsToTheRoundedWeights) {
  const Loaded f16 = load(stories_gguf_f16());
  const Loaded f32 = load(stories_llama2c());
  auto rounded = [](const Tensor& tensor) {
    std::vector<float> out = values(tensor);
    for (float& value : out) value = round_to_f16(value);
    return out;
  };
  EXPECT_EQ(f16.weights.embed.dtype, DType::F32);
  EXPECT_EQ(values(f16.weights.embed), rounded(f32.weights.embed));
  EXPECT_EQ(values(f16.weights.layers[4].wqkv), rounded(f32.weights.layers[4].wqkv));
  EXPECT_EQ(values(f16.weights.layers[4].w_down), rounded(f32.weights.layers[4].w_down));
  EXPECT_EQ(f16.weights.layers[4].attn_norm.dtype, DType::F32);
  EXPECT_EQ(values(f16.weights.layers[4].attn_norm), values(f32.weights.layers[4].attn_norm));  // norms stay f32

  // Bound as f16, matrices keep their bits; when nothing needs converting they are views into the file.
  const Loaded as_f16 = load(stories_gguf_f16(), DType::F16);
  EXPECT_EQ(as_f16.weights.embed.dtype, DType::F16);
  EXPECT_EQ(as_f16.weights.embed.data, stored(*as_f16.source, "token_embd.weight").data);
  EXPECT_EQ(values(as_f16.weights.layers[1].wo), rounded(f32.weights.layers[1].wo));
  EXPECT_EQ(as_f16.weights.layers[1].ffn_norm.dtype, DType::F32);
}

TEST(Stories, MatrixDtypeConversion) {
  const Loaded f32 = load(stories_hf());
  // f32 -> f32 needs no copy.
  EXPECT_EQ(f32.weights.embed.data, stored(*f32.source, "model.embed_tokens.weight").data);
  EXPECT_EQ(f32.weights.layers[0].attn_norm.data, stored(*f32.source, "model.layers.0.input_layernorm.weight").data);

  const Loaded bf16 = load(stories_hf(), DType::BF16);
  EXPECT_EQ(bf16.weights.layers[3].wqkv.dtype, DType::BF16);
  EXPECT_EQ(bf16.weights.layers[3].w_gate_up.dtype, DType::BF16);
  EXPECT_EQ(bf16.weights.layers[3].ffn_norm.dtype, DType::F32);
  const std::vector<float> want = values(f32.weights.layers[3].w_down);
  const auto* got = bf16.weights.layers[3].w_down.as<uint16_t>();
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], f32_to_bf16(want[i])) << i;
  EXPECT_EQ(bf16.weights.lm_head.data, bf16.weights.embed.data);

  expect_error([&] { bind_weights(f32.spec, *f32.source, DType::I8); }, {"weight dtype i8 is not supported for matrices"});
}

TEST(Stories, OtherLlama2cCheckpointsResolveFromTheirHeaders) {
  const Loaded aidreams = load(test::shared_path("models/aidreams260K/aidreams260K.bin"));
  EXPECT_EQ(aidreams.spec.num_layers, 4);
  EXPECT_EQ(aidreams.spec.attention.num_heads, 4);
  EXPECT_EQ(aidreams.spec.attention.num_kv_heads, 4);
  EXPECT_EQ(aidreams.spec.max_position, 128);
  EXPECT_EQ(aidreams.weights.layers[0].wqkv.shape, (Shape{192, 64}));

  // The int8 export (version 2) of stories260K: its matrices stay int8 (I8_G32, the file's groups of
  // 32; the embedding too) and dequantize to within 0.007 of the f32 model.
  const Loaded q80 = load(test::shared_path("models/stories260K/stories260K_q80.bin"));
  const Loaded f32 = load(stories_llama2c());
  EXPECT_EQ(q80.spec, f32.spec);
  EXPECT_EQ(q80.weights.layers[2].w_gate_up.dtype, DType::I8_G32);
  EXPECT_EQ(q80.weights.embed.dtype, DType::I8_G32);
  const std::vector<float> got = values(quant::dequantize(q80.weights.layers[2].w_gate_up)),
                           want = values(f32.weights.layers[2].w_gate_up);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 0.007f) << i;
}

// A spec file alone (no config.json, no template, no architecture name) loads a checkpoint whose
// tensors all have names no template knows, and binds to the same weights as stories260K-hf.
TEST(HandWrittenSpec, RenamedCheckpointNeedsNoConfig) {
  const Loaded reference = load(stories_hf());
  std::map<std::string, std::string> rename = {{"model.embed_tokens.weight", "net.token_table.w"},
                                               {"model.norm.weight", "net.out_scale.w"}};
  const std::pair<const char*, const char*> per_layer[] = {
      {"input_layernorm", "pre_mix_scale"},    {"self_attn.q_proj", "mix.query"}, {"self_attn.k_proj", "mix.key"},
      {"self_attn.v_proj", "mix.value"},       {"self_attn.o_proj", "mix.merge"}, {"post_attention_layernorm", "pre_ff_scale"},
      {"mlp.gate_proj", "ff.gate"},            {"mlp.up_proj", "ff.lift"},        {"mlp.down_proj", "ff.drop"}};
  for (int layer = 0; layer < 5; ++layer)
    for (const auto& [from, to] : per_layer)
      rename["model.layers." + std::to_string(layer) + "." + from + ".weight"] =
          "net.blocks." + std::to_string(layer) + "." + to + ".w";
  ScratchDir dir;
  write_renamed(*reference.source, rename, dir.path("model.safetensors"), /*keep_others=*/false);

  LogCapture log;
  const Loaded renamed = load(dir.path(), DType::F32, test::fixture_path("model/renamed_stories/spec.json"));
  EXPECT_EQ(log.text().find("not used"), std::string::npos) << log.text();
  EXPECT_EQ(renamed.spec.name, "renamed-stories");
  ModelSpec same_model = renamed.spec;
  same_model.name = reference.spec.name;
  same_model.tensors = reference.spec.tensors;
  EXPECT_EQ(same_model, reference.spec);
  expect_same(renamed.weights.embed, reference.weights.embed, "embed");
  expect_same(renamed.weights.lm_head, reference.weights.lm_head, "lm_head");
  expect_same(renamed.weights.final_norm, reference.weights.final_norm, "final_norm");
  for (size_t layer = 0; layer < 5; ++layer) {
    const LayerWeights& got = renamed.weights.layers[layer];
    const LayerWeights& want = reference.weights.layers[layer];
    expect_same(got.attn_norm, want.attn_norm, "attn_norm");
    expect_same(got.wqkv, want.wqkv, "wqkv");
    expect_same(got.wo, want.wo, "wo");
    expect_same(got.ffn_norm, want.ffn_norm, "ffn_norm");
    expect_same(got.w_gate_up, want.w_gate_up, "w_gate_up");
    expect_same(got.w_down, want.w_down, "w_down");
  }
}

// The HF fixtures (python/make_hf_fixtures.py, written by transformers) all bind, with every
// checkpoint tensor used.
TEST(HfFixtures, EveryFixtureBindsAndUsesEveryTensor) {
  const json index = read_json_file(test::fixture_path("hf/index.json"));
  for (const json& name : index["fixtures"]) {
    SCOPED_TRACE(name.get<std::string>());
    LogCapture log;
    Loaded model;
    ASSERT_NO_THROW(model = load(test::fixture_path("hf/" + name.get<std::string>())));
    EXPECT_EQ(log.text().find("not used"), std::string::npos) << log.text();
    const int64_t q_dim = int64_t{model.spec.attention.num_heads} * model.spec.attention.head_dim;
    const int64_t kv_dim = int64_t{model.spec.attention.num_kv_heads} * model.spec.attention.head_dim;
    for (const LayerWeights& layer : model.weights.layers) {
      EXPECT_EQ(layer.wqkv.shape, (Shape{q_dim + 2 * kv_dim, model.spec.hidden_size}));
      EXPECT_EQ(layer.wo.shape, (Shape{model.spec.hidden_size, q_dim}));
    }
  }
}

TEST(HfFixtures, Gpt2ConvOneDIsTransposedAndFused) {
  const Loaded gpt2 = load(test::fixture_path("hf/gpt2"));
  const WeightSource& source = *gpt2.source;
  EXPECT_EQ(gpt2.weights.lm_head.data, gpt2.weights.embed.data);  // tied
  expect_same(gpt2.weights.pos_embed, stored(source, "transformer.wpe.weight"), "wpe");
  expect_same(gpt2.weights.final_norm_bias, stored(source, "transformer.ln_f.bias"), "ln_f.bias");
  const LayerWeights& layer = gpt2.weights.layers[1];
  // c_attn is Conv1D [in 32, out 96]: canonical wqkv[r][c] = c_attn[c][r].
  const std::vector<float> c_attn = values(stored(source, "transformer.h.1.attn.c_attn.weight"));
  const std::vector<float> wqkv = values(layer.wqkv);
  ASSERT_EQ(layer.wqkv.shape, (Shape{96, 32}));
  for (int r = 0; r < 96; ++r)
    for (int c = 0; c < 32; ++c) ASSERT_EQ(wqkv[r * 32 + c], c_attn[c * 96 + r]) << r << "," << c;
  expect_same(layer.bqkv, stored(source, "transformer.h.1.attn.c_attn.bias"), "c_attn.bias");
  const std::vector<float> c_fc = values(stored(source, "transformer.h.1.mlp.c_fc.weight"));  // [32, 128]
  const std::vector<float> up = values(layer.w_gate_up);
  ASSERT_EQ(layer.w_gate_up.shape, (Shape{128, 32}));
  for (int r = 0; r < 128; ++r)
    for (int c = 0; c < 32; ++c) ASSERT_EQ(up[r * 32 + c], c_fc[c * 128 + r]);
  const std::vector<float> proj = values(stored(source, "transformer.h.1.mlp.c_proj.weight"));  // [128, 32]
  const std::vector<float> down = values(layer.w_down);
  ASSERT_EQ(layer.w_down.shape, (Shape{32, 128}));
  for (int r = 0; r < 32; ++r)
    for (int c = 0; c < 128; ++c) ASSERT_EQ(down[r * 128 + c], proj[c * 32 + r]);
  expect_same(layer.b_down, stored(source, "transformer.h.1.mlp.c_proj.bias"), "c_proj.bias");
  expect_same(layer.attn_norm_bias, stored(source, "transformer.h.1.ln_1.bias"), "ln_1.bias");
}

TEST(HfFixtures, GptNeoXPerHeadQkvBecomesConcat) {
  const Loaded neox = load(test::fixture_path("hf/gpt_neox"));
  const int heads = 2, head_dim = 16, hidden = 32;
  const std::vector<float> fused = values(stored(*neox.source, "gpt_neox.layers.0.attention.query_key_value.weight"));
  const std::vector<float> fused_bias = values(stored(*neox.source, "gpt_neox.layers.0.attention.query_key_value.bias"));
  const std::vector<float> wqkv = values(neox.weights.layers[0].wqkv);
  const std::vector<float> bqkv = values(neox.weights.layers[0].bqkv);
  // Stored rows: head h, part p (q, k, v), row j at (h*3 + p)*head_dim + j. Canonical: p*hidden + h*head_dim + j.
  for (int h = 0; h < heads; ++h)
    for (int p = 0; p < 3; ++p)
      for (int j = 0; j < head_dim; ++j) {
        const int from = (h * 3 + p) * head_dim + j, to = p * hidden + h * head_dim + j;
        ASSERT_EQ(bqkv[to], fused_bias[from]);
        for (int c = 0; c < hidden; ++c) ASSERT_EQ(wqkv[to * hidden + c], fused[from * hidden + c]);
      }
  // transformers 5 names the output projection lm_head (the template also accepts embed_out).
  expect_same(neox.weights.lm_head, stored(*neox.source, "lm_head.weight"), "lm_head");
  EXPECT_TRUE(neox.spec.parallel_residual);
}

TEST(HfFixtures, Phi3FusedTensorsAreAlreadyCanonical) {
  const Loaded phi3 = load(test::fixture_path("hf/phi3"));
  expect_same(phi3.weights.layers[1].wqkv, stored(*phi3.source, "model.layers.1.self_attn.qkv_proj.weight"), "qkv");
  expect_same(phi3.weights.layers[1].w_gate_up, stored(*phi3.source, "model.layers.1.mlp.gate_up_proj.weight"), "gate_up");
}

TEST(HfFixtures, BiasesLandInTheirSlots) {
  const Loaded qwen2 = load(test::fixture_path("hf/qwen2"));
  const WeightSource& source = *qwen2.source;
  const Tensor& bqkv = qwen2.weights.layers[0].bqkv;
  ASSERT_EQ(bqkv.shape, (Shape{64}));
  EXPECT_EQ(bqkv.dtype, DType::F32);
  EXPECT_EQ(rows(bqkv, 0, 32), values(stored(source, "model.layers.0.self_attn.q_proj.bias")));
  EXPECT_EQ(rows(bqkv, 32, 48), values(stored(source, "model.layers.0.self_attn.k_proj.bias")));
  EXPECT_EQ(rows(bqkv, 48, 64), values(stored(source, "model.layers.0.self_attn.v_proj.bias")));
  EXPECT_TRUE(qwen2.weights.layers[0].bo.empty());

  const Loaded llama = load(test::fixture_path("hf/llama_bias"));
  const LayerWeights& layer = llama.weights.layers[1];
  EXPECT_EQ(rows(layer.b_gate_up, 0, 64), values(stored(*llama.source, "model.layers.1.mlp.gate_proj.bias")));
  EXPECT_EQ(rows(layer.b_gate_up, 64, 128), values(stored(*llama.source, "model.layers.1.mlp.up_proj.bias")));
  expect_same(layer.b_down, stored(*llama.source, "model.layers.1.mlp.down_proj.bias"), "down bias");
  expect_same(layer.bo, stored(*llama.source, "model.layers.1.self_attn.o_proj.bias"), "o bias");
}

TEST(BadInput, MissingTensorNamesTensorAndSpecField) {
  ScratchDir dir;
  const std::string patch = dir.file("patch.json", R"({"tensors": {"q": "model.layers.{layer}.attn.wq"}})");
  expect_error([&] { load(stories_hf(), DType::F32, patch); },
               {"missing tensor 'model.layers.0.attn.wq.weight' (from tensors.q = 'model.layers.{layer}.attn.wq', layer 0)",
                "in the safetensors checkpoint '", "model.safetensors'"});
  const std::string untie = dir.file("untie.json", R"({"tie_embeddings": false})");
  expect_error([&] { load(stories_hf(), DType::F32, untie); }, {"missing tensor 'lm_head.weight' (from tensors.lm_head = 'lm_head')"});
  // Alternatives and prefixes are all listed.
  const std::string alternatives = dir.file("alt.json", R"({"tensors": {"final_norm": "ln_f|norm_f", "name_prefixes": ["", "x."]}})");
  expect_error([&] { load(stories_hf(), DType::F32, alternatives); },
               {"missing tensor 'ln_f.weight' or 'x.ln_f.weight' or 'norm_f.weight' or 'x.norm_f.weight'"});
}

TEST(BadInput, ShapeMismatchNamesTensorAndShapes) {
  ScratchDir dir;
  const std::string patch = dir.file("patch.json", R"({"mlp": {"intermediate_size": 180}})");
  expect_error([&] { load(stories_hf(), DType::F32, patch); },
               {"tensor 'model.layers.0.mlp.gate_proj.weight' (tensors.gate = 'model.layers.{layer}.mlp.gate_proj', layer 0) "
                "has shape [172, 64], expected [180, 64]"});
  const std::string vocab = dir.file("vocab.json", R"({"vocab_size": 500})");
  expect_error([&] { load(stories_gguf(), DType::F32, vocab); },
               {"tensor 'token_embd.weight' (tensors.embed = 'token_embd') has shape [512, 64], expected [500, 64]"});
  const std::string gpt2 = dir.file("gpt2.json", R"({"mlp": {"intermediate_size": 64}})");
  expect_error([&] { load(test::fixture_path("hf/gpt2"), DType::F32, gpt2); },
               {"tensor 'transformer.h.0.mlp.c_fc.weight'", "has shape [32, 128], expected [32, 64]",
                "(stored [in, out]: tensors.linear_transposed is true)"});
}

TEST(BadInput, NonFloatTensorIsRejected) {
  const auto source = open_weights(stories_hf());
  std::vector<TensorInfo> tensors = source->tensors();
  for (TensorInfo& info : tensors)
    if (info.name == "model.layers.2.post_attention_layernorm.weight") info.tensor = Tensor::zeros(DType::I32, {64});
  ScratchDir dir;
  std::filesystem::copy_file(stories_hf() + "/config.json", dir.path("config.json"));
  write_safetensors(dir.path("model.safetensors"), tensors);
  expect_error([&] { load(dir.path()); },
               {"tensor 'model.layers.2.post_attention_layernorm.weight' in '", "has dtype i32; weights must be f32, f16, bf16"});
}

TEST(BadInput, UnusedTensorsAreWarnedAboutNotFatal) {
  const auto source = open_weights(stories_hf());
  std::vector<TensorInfo> tensors = source->tensors();
  tensors.push_back({"model.layers.0.self_attn.q_norm.weight", Tensor::zeros(DType::F32, {8}), ""});
  tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", Tensor::zeros(DType::F32, {4}), ""});
  ScratchDir dir;
  std::filesystem::copy_file(stories_hf() + "/config.json", dir.path("config.json"));
  write_safetensors(dir.path("model.safetensors"), tensors);
  LogCapture log;
  EXPECT_NO_THROW(load(dir.path()));
  EXPECT_NE(log.text().find("1 checkpoint tensor(s) are not used by the model spec 'llama': "
                            "model.layers.0.self_attn.q_norm.weight"),
            std::string::npos)
      << log.text();
  EXPECT_EQ(log.text().find("inv_freq"), std::string::npos) << log.text();
}

TEST(BadInput, GgufWithoutOutputTensorTiesTheHead) {
  const auto gguf = open_weights(stories_gguf());
  std::vector<TensorInfo> tensors;
  for (const TensorInfo& info : gguf->tensors())
    if (info.name != "output.weight") tensors.push_back(info);
  ScratchDir dir;
  write_safetensors(dir.path("no_output.safetensors"), tensors);
  const auto source = open_weights(dir.path("no_output.safetensors"));
  SpecRequest request{gguf->metadata(), "GGUF metadata", {}, "llama", "", {}};
  const ModelSpec spec = resolve_spec(request);
  LogCapture log;
  const ModelWeights weights = bind_weights(spec, *source, DType::F32);
  EXPECT_EQ(weights.lm_head.data, weights.embed.data);
  EXPECT_NE(log.text().find("tied to the embedding"), std::string::npos) << log.text();
}

TEST(DummyWeights, ShapesFollowTheSpec) {
  const ModelSpec gpt2 = resolve_config_spec(test::fixture_path("model/configs/gpt2/config.json"));
  const ModelWeights weights = make_dummy_weights(gpt2, DType::F16, 1);
  EXPECT_EQ(weights.embed.shape, (Shape{50257, 768}));
  EXPECT_EQ(weights.embed.dtype, DType::F16);
  EXPECT_EQ(weights.pos_embed.shape, (Shape{1024, 768}));
  ASSERT_TRUE(weights.embed.generated && weights.lm_head.generated);  // filled where uploaded
  EXPECT_EQ(weights.lm_head.generated->key, weights.embed.generated->key);  // tied
  EXPECT_EQ(weights.final_norm_bias.shape, (Shape{768}));
  ASSERT_EQ(weights.layers.size(), 12u);
  const LayerWeights& layer = weights.layers[11];
  EXPECT_EQ(layer.wqkv.shape, (Shape{2304, 768}));
  EXPECT_EQ(layer.bqkv.shape, (Shape{2304}));
  EXPECT_EQ(layer.w_gate_up.shape, (Shape{3072, 768}));
  EXPECT_EQ(layer.b_gate_up.shape, (Shape{3072}));
  EXPECT_EQ(layer.w_down.shape, (Shape{768, 3072}));
  EXPECT_EQ(layer.attn_norm_bias.dtype, DType::F32);
  EXPECT_EQ(values(layer.attn_norm), std::vector<float>(768, 1.0f));

  ModelSpec small = resolve_config_spec(test::fixture_path("model/configs/llama-3.1-8b-instruct/config.json"));
  small.num_layers = 2;
  small.vocab_size = 1000;
  small.bos_token_id = -1;
  small.eos_token_ids.clear();
  const ModelWeights llama = make_dummy_weights(small, DType::BF16, 1);
  EXPECT_EQ(llama.layers[0].wqkv.shape, (Shape{4096 + 2 * 1024, 4096}));
  EXPECT_EQ(llama.layers[0].w_gate_up.shape, (Shape{2 * 14336, 4096}));
  EXPECT_TRUE(llama.layers[0].bqkv.empty());
  EXPECT_TRUE(llama.pos_embed.empty());
  EXPECT_NE(values(llama.lm_head), values(llama.embed));
}

TEST(DummyWeights, DeterministicPerSeedAndNormalLike) {
  ModelSpec spec = resolve_hf_spec(stories_hf());
  const ModelWeights a = make_dummy_weights(spec, DType::F32, 7);
  const ModelWeights b = make_dummy_weights(spec, DType::F32, 7);
  const ModelWeights c = make_dummy_weights(spec, DType::F32, 8);
  EXPECT_EQ(values(a.layers[3].wqkv), values(b.layers[3].wqkv));
  EXPECT_NE(values(a.layers[3].wqkv), values(c.layers[3].wqkv));
  EXPECT_NE(values(a.layers[3].wqkv), values(a.layers[2].wqkv));  // every tensor draws its own values

  // Statistics over the embedding (32768 values), in double: mean 0, std 0.02, ~68% within 1 sigma.
  const std::vector<float> embed = values(a.embed);
  double sum = 0, sum_sq = 0;
  for (float value : embed) sum += value, sum_sq += double{value} * value;
  const double mean = sum / embed.size(), stddev = std::sqrt(sum_sq / embed.size() - mean * mean);
  EXPECT_LT(std::fabs(mean), 5e-4);
  EXPECT_NEAR(stddev, 0.02, 0.0006);
  const auto within = std::count_if(embed.begin(), embed.end(), [](float value) { return std::fabs(value) < 0.02f; });
  EXPECT_NEAR(static_cast<double>(within) / embed.size(), 0.683, 0.02);
}

TEST(DummyWeights, OneBillionParametersInSecondsOnTheHost) {
  // TinyLlama-1.1B's shape (bench/configs/tinyllama-1.1b.json), bf16, generated into host memory
  // (what the CPU backend's upload does; the CUDA backend fills the GPU instead).
  const json config = json::parse(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632,
    "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-05, "tie_word_embeddings": false})");
  const ModelSpec spec = resolve_spec({config, "tinyllama shape", {"LlamaForCausalLM"}, "", "", {}});
  const auto start = std::chrono::steady_clock::now();
  const ModelWeights weights = make_dummy_weights(spec, DType::BF16, 42);
  int64_t params = 0;
  const auto fill = [&params](const Tensor& tensor) {
    const Tensor host = materialize(tensor);
    ASSERT_NE(host.data, nullptr);
    params += host.numel();
  };
  fill(weights.embed);
  fill(weights.lm_head);
  for (const LayerWeights& layer : weights.layers) {
    for (const Tensor* matrix : {&layer.wqkv, &layer.wo, &layer.w_gate_up, &layer.w_down}) fill(*matrix);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("dummy weights: %.2f B parameters (bf16) in %.2f s\n", params / 1e9, seconds);
  EXPECT_GT(params, 1'000'000'000);
  EXPECT_LT(seconds, 20.0);
}
