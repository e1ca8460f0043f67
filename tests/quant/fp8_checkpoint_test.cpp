// quant::pack_fp8_checkpoint_weight on a compressed-tensors style checkpoint written by torch
// (python/gen_quant_fixtures.py: float8_e4m3fn weights, per-tensor [1], scalar [] and per-channel
// [n, 1] weight_scale, and torch's e4m3 * scale in float32 as `expected`).
#include "core/error.h"
#include "formats/weight_source.h"
#include "quant/quant.h"
#include "quant/sfq_fixture.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>

using namespace splitflow;
using splitflow::test::float_bits;

namespace {

std::map<std::string, Tensor> read_checkpoint() {
  const auto source = open_safetensors(test::fixture_path("quant/fp8_checkpoint.safetensors"));
  std::map<std::string, Tensor> tensors;
  for (const TensorInfo& info : source->tensors()) tensors[info.name] = info.tensor;
  return tensors;
}

}  // namespace

TEST(Fp8Checkpoint, PackedWeightsDequantizeToTorchsValues) {
  auto tensors = read_checkpoint();
  for (const std::string prefix : {"per_tensor", "scalar", "per_channel"}) {
    const Tensor& weight = tensors.at(prefix + ".weight");
    ASSERT_EQ(weight.dtype, DType::F8E4M3);
    const Tensor packed = quant::pack_fp8_checkpoint_weight(weight, tensors.at(prefix + ".weight_scale"), prefix);
    EXPECT_EQ(packed.dtype, DType::F8_CHANNEL);
    EXPECT_EQ(packed.shape, weight.shape);
    quant::validate(packed, prefix);
    const Tensor values = quant::dequantize(packed);
    const Tensor& expected = tensors.at((prefix == "scalar" ? std::string("per_tensor") : prefix) + ".expected");
    for (int64_t i = 0; i < expected.numel(); ++i)
      ASSERT_EQ(float_bits(values.as<float>()[i]), float_bits(expected.as<float>()[i])) << prefix << " element " << i;
  }
}

// Group ([n, k/128]) and 128x128 block ([ceil(n/128), ceil(k/128)]) scales become F8_G128 rows whose
// group g of row r carries the scale of (r, g) / (r / 128, g).
TEST(Fp8Checkpoint, GroupAndBlockScalesBecomeG128) {
  const int64_t n = 130, k = 256;
  Tensor weight = Tensor::zeros(DType::F8E4M3, {n, k});
  for (int64_t i = 0; i < n * k; ++i) weight.as<uint8_t>()[i] = static_cast<uint8_t>(0x38 + i % 8);  // 1.0 .. 1.875
  Tensor group = Tensor::zeros(DType::F32, {n, 2});
  for (int64_t i = 0; i < n * 2; ++i) group.as<float>()[i] = 0.5f + static_cast<float>(i);
  Tensor block = Tensor::zeros(DType::BF16, {2, 2});
  for (int i = 0; i < 4; ++i) block.as<uint16_t>()[i] = f32_to_bf16(0.25f * static_cast<float>(i + 1));
  const Tensor from_group = quant::dequantize(quant::pack_fp8_checkpoint_weight(weight, group, "g"));
  const Tensor from_block = quant::dequantize(quant::pack_fp8_checkpoint_weight(weight, block, "b"));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const float e = e4m3_to_f32(weight.as<uint8_t>()[r * k + c]);
      ASSERT_EQ(from_group.as<float>()[r * k + c], e * group.as<float>()[r * 2 + c / 128]) << r << "," << c;
      ASSERT_EQ(from_block.as<float>()[r * k + c], e * (0.25f * static_cast<float>((r / 128) * 2 + c / 128 + 1)))
          << r << "," << c;
    }
}

TEST(Fp8Checkpoint, BadScalesAreErrorsNamingTheWeight) {
  const Tensor weight = Tensor::zeros(DType::F8E4M3, {4, 32});
  const auto message = [&](const Tensor& scale) {
    try {
      quant::pack_fp8_checkpoint_weight(weight, scale, "model.layers.0.mlp.down_proj");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(Tensor::zeros(DType::F32, {3, 1})).find("model.layers.0.mlp.down_proj"), std::string::npos);
  EXPECT_NE(message(Tensor::zeros(DType::F32, {3, 1})).find("[3, 1]"), std::string::npos);
  EXPECT_NE(message(Tensor::zeros(DType::I32, {4, 1})).find("i32"), std::string::npos);
  Tensor nan_scale = Tensor::zeros(DType::F32, {4, 1});
  nan_scale.as<float>()[2] = std::nanf("");
  EXPECT_NE(message(nan_scale).find("element 2 is nan"), std::string::npos);
  const Tensor odd = Tensor::zeros(DType::F8E4M3, {4, 24});
  try {
    quant::pack_fp8_checkpoint_weight(odd, Tensor::zeros(DType::F32, {1}), "odd");
    ADD_FAILURE() << "k = 24 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f8_channel"), std::string::npos) << e.what();
  }
}
