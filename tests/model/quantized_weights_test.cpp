// Binding quantized matrices (model/weights.h): packed checkpoint tensors stay views of the file;
// fused QKV / gate-up concatenate the parts' packed rows (DType::Mixed when their types differ);
// corrupt scales are errors naming the tensor; --quantization quantizes float projections while
// binding and on dummy weights. Values are checked through quant::dequantize (the reference codecs).
#include "core/dtype.h"
#include "core/error.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "model/model_test_util.h"
#include "model/weights.h"
#include "quant/quant.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>

using namespace splitflow;
using test::expect_error;

namespace {

// A checkpoint in memory: another source's tensors, some replaced.
class EditedSource final : public WeightSource {
 public:
  explicit EditedSource(std::unique_ptr<WeightSource> base) : base_(std::move(base)), tensors_(base_->tensors()) {}
  std::string format() const override { return base_->format(); }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const nlohmann::json& metadata() const override { return base_->metadata(); }
  void replace(const std::string& name, Tensor tensor) {
    for (TensorInfo& info : tensors_)
      if (info.name == name) info.tensor = std::move(tensor);
  }

 private:
  std::unique_ptr<WeightSource> base_;
  std::vector<TensorInfo> tensors_;
};

std::string stories_gguf() { return test::shared_path("models/stories260K-gguf/stories260K.gguf"); }

std::string model_cache() {
  if (const char* env = std::getenv("SPLITFLOW_MODEL_CACHE")) return env;
  return test::fixture_path("../../.cache/models");
}

std::vector<float> dequantized(const Tensor& tensor) {
  const Tensor values = quant::dequantize(tensor);
  return {values.as<float>(), values.as<float>() + values.numel()};
}

// stories260K (f32) with layer 0's q and k in Q5_0, v in Q8_0, o in Q4_1, gate and up in Q4_0.
struct QuantizedStories {
  std::unique_ptr<EditedSource> source;
  ModelSpec spec;
  std::map<std::string, Tensor> parts;  // the quantized tensors put in
};

QuantizedStories quantized_stories() {
  QuantizedStories q;
  q.source = std::make_unique<EditedSource>(open_weights(stories_gguf()));
  const std::pair<const char*, DType> edits[] = {{"blk.0.attn_q.weight", DType::Q5_0},   {"blk.0.attn_k.weight", DType::Q5_0},
                                                 {"blk.0.attn_v.weight", DType::Q8_0},   {"blk.0.attn_output.weight", DType::Q4_1},
                                                 {"blk.0.ffn_gate.weight", DType::Q4_0}, {"blk.0.ffn_up.weight", DType::Q4_0}};
  for (const auto& [name, type] : edits) {
    Tensor packed = quant::quantize(q.source->find(name)->tensor, type);
    q.parts[name] = packed;
    q.source->replace(name, packed);
  }
  q.spec = resolve_source_spec(*q.source, stories_gguf(), "");
  return q;
}

TEST(QuantizedWeights, FusedPartsOfDifferentTypesBecomeMixedRuns) {
  QuantizedStories q = quantized_stories();
  const ModelWeights weights = bind_weights(q.spec, *q.source, DType::F32);
  const LayerWeights& layer = weights.layers[0];

  ASSERT_EQ(layer.wqkv.dtype, DType::Mixed);
  ASSERT_TRUE(layer.wqkv.row_runs);
  EXPECT_EQ(*layer.wqkv.row_runs, (std::vector<RowRun>{{DType::Q5_0, 96}, {DType::Q8_0, 32}}));
  EXPECT_EQ(layer.wqkv.shape, (Shape{128, 64}));
  std::vector<float> want;
  for (const char* part : {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"}) {
    const std::vector<float> rows = dequantized(q.parts[part]);
    want.insert(want.end(), rows.begin(), rows.end());
  }
  EXPECT_EQ(dequantized(layer.wqkv), want);

  // Same types: one packed matrix, the parts' bytes back to back.
  ASSERT_EQ(layer.w_gate_up.dtype, DType::Q4_0);
  const Tensor& gate = q.parts["blk.0.ffn_gate.weight"];
  const Tensor& up = q.parts["blk.0.ffn_up.weight"];
  ASSERT_EQ(layer.w_gate_up.nbytes(), gate.nbytes() + up.nbytes());
  EXPECT_EQ(std::memcmp(layer.w_gate_up.data, gate.data, gate.nbytes()), 0);
  EXPECT_EQ(std::memcmp(static_cast<const uint8_t*>(layer.w_gate_up.data) + gate.nbytes(), up.data, up.nbytes()), 0);

  // A lone quantized matrix is the stored tensor itself; float ones as before.
  EXPECT_EQ(layer.wo.dtype, DType::Q4_1);
  EXPECT_EQ(layer.wo.data, q.parts["blk.0.attn_output.weight"].data);
  EXPECT_EQ(layer.w_down.dtype, DType::F32);
  EXPECT_EQ(weights.layers[1].wqkv.dtype, DType::F32);
}

TEST(QuantizedWeights, NonFiniteScaleIsAnErrorNamingTheTensor) {
  QuantizedStories q = quantized_stories();
  Tensor broken = quant::quantize(q.source->find("blk.1.attn_output.weight")->tensor, DType::Q4_0);
  const uint16_t nan_f16 = 0x7e00;
  std::memcpy(static_cast<uint8_t*>(broken.data) + 3 * dtype_row_bytes(DType::Q4_0, 64) + 18, &nan_f16, 2);  // row 3, block 1
  q.source->replace("blk.1.attn_output.weight", broken);
  expect_error([&] { bind_weights(q.spec, *q.source, DType::F32); }, {"blk.1.attn_output.weight", "q4_0", "row 3"});
}

TEST(QuantizedWeights, QuantizationFlagQuantizesFloatProjectionsOnly) {
  QuantizedStories q = quantized_stories();
  // stories260K's down projection has rows of 172 elements: not a whole number of 32-blocks.
  expect_error([&] { bind_weights(q.spec, *q.source, DType::F32, DType::Q8_0); },
               {"blk.0.ffn_down.weight", "rows of 172 elements", "32-element blocks"});
  expect_error([&] { bind_weights(q.spec, *q.source, DType::F32, DType::F16); }, {"not a quantized type", "q4_0"});

  ModelSpec spec = q.spec;
  spec.mlp.intermediate_size = 128;
  spec.tie_embeddings = false;
  const ModelWeights weights = make_dummy_weights(spec, DType::F32, 5, DType::Q4_B32);
  const ModelWeights plain = make_dummy_weights(spec, DType::F32, 5);
  EXPECT_TRUE(weights.embed.generated);  // the embedding stays as it is
  EXPECT_EQ(weights.lm_head.dtype, DType::Q4_B32);
  for (const LayerWeights& layer : weights.layers)
    for (const Tensor* matrix : {&layer.wqkv, &layer.wo, &layer.w_gate_up, &layer.w_down})
      EXPECT_EQ(matrix->dtype, DType::Q4_B32);
  // The quantized values are those of the plain dummy weights, within a Q4 step.
  const std::vector<float> got = dequantized(weights.layers[0].wqkv);
  const Tensor want = materialize(plain.layers[0].wqkv);
  float worst = 0.0f;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want.as<float>()[i]));
  EXPECT_LT(worst, 0.02f);  // std 0.02 values: a 32-block spans ~0.1, its 15 steps ~0.007
}

// The real SmolLM2 Q4_1 GGUF: every matrix stays packed, lone ones are views of the mapped file,
// the tied lm_head is the Q8_0 embedding itself.
TEST(QuantizedWeights, RealGgufStaysPacked) {
  const std::string path = model_cache() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent (SPLITFLOW_MODEL_CACHE)";
  const std::unique_ptr<WeightSource> source = open_weights(path);
  const ModelSpec spec = resolve_source_spec(*source, path, "");
  const ModelWeights weights = bind_weights(spec, *source, DType::F32);
  EXPECT_EQ(weights.embed.dtype, DType::Q8_0);
  EXPECT_EQ(weights.embed.data, source->find("token_embd.weight")->tensor.data);
  EXPECT_EQ(weights.lm_head.data, weights.embed.data);
  const LayerWeights& layer = weights.layers[0];
  EXPECT_EQ(layer.wqkv.dtype, DType::Q4_1);
  EXPECT_EQ(layer.wqkv.shape, (Shape{960, 576}));
  EXPECT_EQ(layer.w_gate_up.dtype, DType::Q4_1);
  EXPECT_EQ(layer.w_down.data, source->find("blk.0.ffn_down.weight")->tensor.data);
  EXPECT_EQ(layer.wo.data, source->find("blk.0.attn_output.weight")->tensor.data);
  size_t packed = weights.embed.nbytes();
  for (const LayerWeights& l : weights.layers)
    packed += l.wqkv.nbytes() + l.wo.nbytes() + l.w_gate_up.nbytes() + l.w_down.nbytes();
  EXPECT_LT(packed, std::filesystem::file_size(path));  // nothing was widened
}

}  // namespace
