// Llama 3.1+ GGUF files carry the llama3 RoPE scaling as llama.cpp's rope_freqs.weight tensor, not
// as metadata. The llama3_scaled HF fixture (transformers logits with rope_type llama3) is written
// out as llama.cpp's converter would write it (llama metadata, Q/K rows permuted to Meta's order,
// rope_freqs from the converter's formula), and the GGUF must reproduce the transformers logits;
// the same file without rope_freqs must not (the scaling changes the logits of this fixture).
#include "backend/backend.h"
#include "formats/format_test_util.h"
#include "formats/gguf_builder.h"
#include "formats/weight_source.h"
#include "hf_fixture_runner.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/model_runner.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

using namespace splitflow;
using namespace splitflow::test;

namespace {

constexpr int kHeads = 2, kKvHeads = 1, kHeadDim = 16, kLayers = 2;

// llama.cpp convert_hf_to_gguf.py (LlamaModel.generate_extra_tensors): one divisor per pair from
// the HF rope_scaling of the fixture (factor 8, low 1, high 4, original context 64, theta 5e5).
std::vector<float> converter_rope_freqs() {
  const double base = 500000.0, factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, old_context = 64.0;
  const double low_freq_wavelen = old_context / low_freq_factor, high_freq_wavelen = old_context / high_freq_factor;
  std::vector<float> factors;
  for (int i = 0; i < kHeadDim; i += 2) {
    const double freq = 1.0 / std::pow(base, static_cast<double>(i) / kHeadDim);
    const double wavelen = 2.0 * M_PI / freq;
    if (wavelen < high_freq_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_freq_wavelen) {
      factors.push_back(static_cast<float>(factor));
    } else {
      const double smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      factors.push_back(static_cast<float>(1.0 / ((1.0 - smooth) / factor + smooth)));
    }
  }
  return factors;
}

// The converter's LlamaModel.permute: within each head, rows (half, i) become (i, half).
std::string permute_heads(const Tensor& w, int heads) {
  const int64_t rows = w.shape[0], row_bytes = static_cast<int64_t>(w.nbytes()) / rows, per_head = rows / heads;
  std::string out(w.nbytes(), '\0');
  const char* in = static_cast<const char*>(w.data);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t half = 0; half < 2; ++half)
      for (int64_t i = 0; i < per_head / 2; ++i) {
        const int64_t from = h * per_head + half * (per_head / 2) + i, to = h * per_head + 2 * i + half;
        std::memcpy(out.data() + to * row_bytes, in + from * row_bytes, row_bytes);
      }
  return out;
}

std::string bytes_of(const Tensor& t) { return std::string(static_cast<const char*>(t.data), t.nbytes()); }

// `rope_freqs`: the rope_freqs tensor's values (none when empty); `scaling_type`: a
// llama.rope.scaling.type key (none when empty).
std::string fixture_as_gguf(const WeightSource& hf, const std::vector<float>& rope_freqs,
                            const std::string& scaling_type = "") {
  GgufBuilder gguf;
  gguf.key("general.architecture", kGgufString).str("llama");
  gguf.key("llama.context_length", kGgufU32).put<uint32_t>(512);
  gguf.key("llama.embedding_length", kGgufU32).put<uint32_t>(32);
  gguf.key("llama.block_count", kGgufU32).put<uint32_t>(kLayers);
  gguf.key("llama.feed_forward_length", kGgufU32).put<uint32_t>(64);
  gguf.key("llama.attention.head_count", kGgufU32).put<uint32_t>(kHeads);
  gguf.key("llama.attention.head_count_kv", kGgufU32).put<uint32_t>(kKvHeads);
  gguf.key("llama.rope.freq_base", kGgufF32).put<float>(500000.0f);
  gguf.key("llama.attention.layer_norm_rms_epsilon", kGgufF32).put<float>(1e-5f);
  gguf.key("llama.vocab_size", kGgufU32).put<uint32_t>(256);
  if (!scaling_type.empty()) {
    gguf.key("llama.rope.scaling.type", kGgufString).str(scaling_type);
    gguf.key("llama.rope.scaling.factor", kGgufF32).put<float>(2.0f);
  }
  const auto add = [&](const std::string& gguf_name, const std::string& hf_name, int permute_heads_count = 0) {
    const Tensor& t = hf.find(hf_name)->tensor;
    std::vector<uint64_t> ne(t.shape.rbegin(), t.shape.rend());
    ASSERT_TRUE(t.dtype == DType::BF16 || t.dtype == DType::F32) << hf_name;
    gguf.tensor(gguf_name, ne, t.dtype == DType::BF16 ? kGgmlBF16 : kGgmlF32,
                permute_heads_count > 0 ? permute_heads(t, permute_heads_count) : bytes_of(t));
  };
  add("token_embd.weight", "model.embed_tokens.weight");
  add("output_norm.weight", "model.norm.weight");
  add("output.weight", "lm_head.weight");
  for (int l = 0; l < kLayers; ++l) {
    const std::string hf_layer = "model.layers." + std::to_string(l) + ".", blk = "blk." + std::to_string(l) + ".";
    add(blk + "attn_norm.weight", hf_layer + "input_layernorm.weight");
    add(blk + "attn_q.weight", hf_layer + "self_attn.q_proj.weight", kHeads);
    add(blk + "attn_k.weight", hf_layer + "self_attn.k_proj.weight", kKvHeads);
    add(blk + "attn_v.weight", hf_layer + "self_attn.v_proj.weight");
    add(blk + "attn_output.weight", hf_layer + "self_attn.o_proj.weight");
    add(blk + "ffn_norm.weight", hf_layer + "post_attention_layernorm.weight");
    add(blk + "ffn_gate.weight", hf_layer + "mlp.gate_proj.weight");
    add(blk + "ffn_up.weight", hf_layer + "mlp.up_proj.weight");
    add(blk + "ffn_down.weight", hf_layer + "mlp.down_proj.weight");
  }
  if (!rope_freqs.empty()) gguf.tensor(kGgufRopeFreqs, {rope_freqs.size()}, kGgmlF32, as_bytes_of(rope_freqs));
  return gguf.bytes();
}

// The worst |diff| / max|expected| over the fixture's rows.
double worst_relative_error(const std::string& gguf_path, ModelSpec* spec_out) {
  std::unique_ptr<WeightSource> source = open_weights(gguf_path);
  const ModelSpec spec = resolve_source_spec(*source, gguf_path);
  *spec_out = spec;
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  ModelRunner runner(spec, bind_weights(spec, *source, DType::F32), *backend, KvCacheConfig{16, 4});
  double worst = 0.0;
  run_hf_fixture(runner, "llama3_scaled",
                 [&](const float* actual, const float* expected, int64_t rows, int32_t, const std::string&) {
                   for (int64_t i = 0; i < rows * spec.vocab_size; i += spec.vocab_size) {
                     double max_abs = 0, max_diff = 0;
                     for (int64_t v = 0; v < spec.vocab_size; ++v) {
                       max_abs = std::max(max_abs, std::abs(static_cast<double>(expected[i + v])));
                       max_diff = std::max(max_diff, std::abs(static_cast<double>(actual[i + v]) - expected[i + v]));
                     }
                     worst = std::max(worst, max_diff / max_abs);
                   }
                 });
  return worst;
}

TEST(GgufRopeFreqs, Llama31GgufMatchesTransformers) {
  TempDir dir;
  const std::unique_ptr<WeightSource> hf = open_weights(fixture_path("hf/llama3_scaled"));
  const std::string with = (dir.path() / "with.gguf").string(), without = (dir.path() / "without.gguf").string();
  write_bytes(with, fixture_as_gguf(*hf, converter_rope_freqs()));
  write_bytes(without, fixture_as_gguf(*hf, {}));

  ModelSpec spec;
  EXPECT_LE(worst_relative_error(with, &spec), 1e-3);  // the HF fixtures' tolerance
  EXPECT_EQ(spec.rope.scaling.type, RopeScalingType::FreqFactors);
  EXPECT_EQ(spec.rope.scaling.freq_factors.size(), static_cast<size_t>(kHeadDim / 2));
  EXPECT_GT(worst_relative_error(without, &spec), 1e-2);
  EXPECT_EQ(spec.rope.scaling.type, RopeScalingType::None);
}

// A rope_freqs of the wrong length, or next to scaling metadata, is refused with an error that
// names the file and the tensor.
TEST(GgufRopeFreqs, WrongLengthOrBothScalingsAreRefused) {
  TempDir dir;
  const std::unique_ptr<WeightSource> hf = open_weights(fixture_path("hf/llama3_scaled"));
  const std::string path = (dir.path() / "bad.gguf").string();
  const auto resolve = [&] {
    std::unique_ptr<WeightSource> source = open_weights(path);
    resolve_source_spec(*source, path);
  };
  write_bytes(path, fixture_as_gguf(*hf, std::vector<float>(kHeadDim / 2 - 1, 1.0f)));
  expect_error(resolve, {path, kGgufRopeFreqs, "expected f32 [8]", "[7]"});
  write_bytes(path, fixture_as_gguf(*hf, converter_rope_freqs(), "linear"));
  expect_error(resolve, {path, kGgufRopeFreqs, "rope.scaling (linear)", "one or the other"});
  std::vector<float> negative = converter_rope_freqs();
  negative[3] = -1.0f;
  write_bytes(path, fixture_as_gguf(*hf, negative));
  expect_error(resolve, {path, kGgufRopeFreqs, "entry 3", "expected > 0"});
}

}  // namespace
