// formats/gguf_writer: files it writes read back through the GGUF reader with every key, value
// type, shape and byte intact (tests/python/test_quantize_gguf.py reads them with the `gguf`
// package too), and failed writes leave nothing behind.
#include "formats/gguf_types.h"
#include "formats/gguf_writer.h"
#include "formats/weight_source.h"
#include "format_test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

namespace splitflow {
namespace {

using test::TempDir;

Tensor filled(DType dtype, Shape shape, uint8_t seed) {
  Tensor t = Tensor::zeros(dtype, std::move(shape));
  auto* bytes = static_cast<uint8_t*>(t.data);
  for (size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<uint8_t>(seed + i * 7);
  return t;
}

TEST(GgufWriter, RoundTripsMetadataAndTensors) {
  TempDir dir;
  nlohmann::json metadata = {
      {"general.architecture", "llama"},
      {"llama.block_count", 2u},
      {"llama.rope.freq_base", 10000.5},
      {"tokenizer.ggml.add_bos_token", true},
      {"tokenizer.ggml.tokens", {"<s>", "a", "b"}},
      {"tokenizer.ggml.token_type", {1, 1, -3}},
      {"tokenizer.ggml.scores", {0.0, -1.5, 2.25}},
      {"big", uint64_t{1} << 40},
  };
  std::vector<TensorInfo> tensors = {
      {"token_embd.weight", filled(DType::F32, {3, 5}, 1), ""},
      {"blk.0.attn_q.weight", filled(DType::Q8_0, {4, 64}, 2), ""},
      {"blk.0.attn_k.weight", filled(DType::Q3H_B64, {2, 128}, 3), ""},
      {"blk.0.ffn_down.weight", filled(DType::F8_G128, {3, 256}, 4), ""},
  };
  const std::string path = dir.file("out.gguf");
  write_gguf(path, metadata, tensors, 64);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  const auto source = open_gguf(path);
  nlohmann::json expected = metadata;
  expected["general.alignment"] = 64u;
  EXPECT_EQ(source->metadata().size(), expected.size());
  for (const auto& [key, value] : expected.items()) {
    ASSERT_TRUE(source->metadata().contains(key)) << key;
    if (value.is_number_float() || (value.is_array() && value.front().is_number_float())) {
      EXPECT_EQ(source->metadata()[key].dump(), nlohmann::json(value).dump()) << key;  // exact in f32
    } else {
      EXPECT_EQ(source->metadata()[key], value) << key;
    }
  }
  ASSERT_EQ(source->tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& got = source->tensors()[i].tensor;
    EXPECT_EQ(source->tensors()[i].name, tensors[i].name);
    EXPECT_EQ(got.dtype, tensors[i].tensor.dtype) << tensors[i].name;
    EXPECT_EQ(got.shape, tensors[i].tensor.shape) << tensors[i].name;
    ASSERT_EQ(got.nbytes(), tensors[i].tensor.nbytes());
    EXPECT_EQ(0, std::memcmp(got.data, tensors[i].tensor.data, got.nbytes())) << tensors[i].name;
  }
}

TEST(GgufWriter, TypeIdsRoundTrip) {
  for (uint8_t d = 0; d <= static_cast<uint8_t>(DType::I8_G128); ++d) {
    const auto dtype = static_cast<DType>(d);
    if (dtype == DType::F8E4M3 || dtype == DType::U8 || dtype == DType::Bool) {
      EXPECT_THROW(gguf_type_of(dtype), Error) << dtype_name(dtype);
      continue;
    }
    EXPECT_EQ(dtype_from_gguf_type(gguf_type_of(dtype)), dtype) << dtype_name(dtype);
  }
  EXPECT_EQ(gguf_type_of(DType::Q4_K), 12u);  // ggml.h's GGML_TYPE_Q4_K
  // splitflow's ids never move: later types are appended (the int8 groups after the FP8 types).
  EXPECT_EQ(gguf_type_of(DType::Q2_B32), 1024u);
  EXPECT_EQ(gguf_type_of(DType::F8_G128), 1038u);
  EXPECT_EQ(gguf_type_of(DType::I8_G32), 1039u);
  EXPECT_EQ(gguf_type_of(DType::I8_G128), 1041u);
  EXPECT_THROW(gguf_type_of(DType::Mixed), Error);
  EXPECT_EQ(gguf_type_of(DType::BF16), 30u);
  EXPECT_GE(gguf_type_of(DType::Q4_B32), kSplitflowTypeBase);
  EXPECT_EQ(dtype_from_gguf_type(kSplitflowTypeBase + 500), std::nullopt);
}

TEST(GgufWriter, RefusesWhatGgufCannotHold) {
  TempDir dir;
  const std::string path = dir.file("bad.gguf");
  EXPECT_THROW(write_gguf(path, nlohmann::json::array(), {}), Error);
  EXPECT_THROW(write_gguf(path, {{"k", nullptr}}, {}), Error);
  EXPECT_THROW(write_gguf(path, {{"k", {1, "a"}}}, {}), Error);
  EXPECT_THROW(write_gguf(path, {}, {{"w", filled(DType::Bool, {4}, 0), ""}}), Error);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

}  // namespace
}  // namespace splitflow
