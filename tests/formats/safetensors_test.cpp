#include "formats/safetensors_writer.h"
#include "formats/weight_source.h"
#include "format_test_util.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>

namespace splitflow {
namespace {

using test::ByteWriter;
using test::expect_error;
using test::TempDir;

const std::string kModel = test::shared_path("models/stories260K-hf/model.safetensors");

// Raw bytes of a safetensors file with this header text and `data_bytes` zero bytes of data.
std::string safetensors_bytes(const std::string& header, size_t data_bytes) {
  ByteWriter out;
  out.put<uint64_t>(header.size()).raw(header);
  out.bytes.append(data_bytes, '\0');
  return out.bytes;
}

TEST(Safetensors, OpensStories260K) {
  const auto source = open_safetensors(kModel);
  EXPECT_EQ(source->format(), "safetensors");
  // embed + final norm + 5 layers x (2 norms, q, k, v, o, gate, up, down); tied, so no lm_head.
  EXPECT_EQ(source->tensors().size(), 47u);
  EXPECT_EQ(source->find("lm_head.weight"), nullptr);
  EXPECT_EQ(source->metadata(), nlohmann::json({{"format", "pt"}}));
  const std::pair<const char*, Shape> expected[] = {
      {"model.embed_tokens.weight", {512, 64}},
      {"model.norm.weight", {64}},
      {"model.layers.0.self_attn.q_proj.weight", {64, 64}},
      {"model.layers.4.self_attn.k_proj.weight", {32, 64}},
      {"model.layers.2.self_attn.v_proj.weight", {32, 64}},
      {"model.layers.3.mlp.gate_proj.weight", {172, 64}},
      {"model.layers.3.mlp.down_proj.weight", {64, 172}},
      {"model.layers.1.post_attention_layernorm.weight", {64}}};
  for (const auto& [name, shape] : expected) {
    const TensorInfo* info = source->find(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->tensor.shape, shape) << name;
    EXPECT_EQ(info->tensor.dtype, DType::F32) << name;
    EXPECT_EQ(info->file, kModel);
  }
}

TEST(Safetensors, EmbeddingEqualsLlama2cFileBytes) {
  // The HF file was derived from stories260K.bin; the embedding follows its 28-byte header.
  const std::string bin = test::read_bytes(test::shared_path("models/stories260K/stories260K.bin"));
  const auto source = open_safetensors(kModel);
  const Tensor& embed = source->find("model.embed_tokens.weight")->tensor;
  ASSERT_EQ(embed.nbytes(), 512u * 64 * 4);
  EXPECT_EQ(std::memcmp(embed.data, bin.data() + 28, embed.nbytes()), 0);
}

TEST(Safetensors, TensorsAreViewsOfTheFileBytes) {
  const std::string bytes = test::read_bytes(kModel);
  uint64_t header_bytes;
  std::memcpy(&header_bytes, bytes.data(), 8);
  const auto header = nlohmann::json::parse(bytes.substr(8, header_bytes));
  const auto source = open_safetensors(kModel);
  const void* mapping = source->tensors().front().tensor.storage.get();
  for (const TensorInfo& info : source->tensors()) {
    EXPECT_EQ(info.tensor.storage.get(), mapping) << info.name << " is not a view of the one mapping";
    const uint64_t begin = header[info.name]["data_offsets"][0];
    EXPECT_EQ(std::memcmp(info.tensor.data, bytes.data() + 8 + header_bytes + begin, info.tensor.nbytes()), 0) << info.name;
  }
}

// One tensor of each dtype the writer supports, with distinct byte patterns.
std::vector<TensorInfo> every_dtype_tensors() {
  std::vector<TensorInfo> tensors;
  const std::pair<DType, Shape> kinds[] = {{DType::F32, {2, 3}}, {DType::F16, {3}},  {DType::BF16, {2, 2}},
                                           {DType::F64, {2}},    {DType::I8, {4}},   {DType::I16, {1, 2}},
                                           {DType::I32, {3}},    {DType::I64, {2}},  {DType::U8, {5}},
                                           {DType::Bool, {2}},   {DType::F32, {}},   {DType::F32, {0, 4}}};
  int index = 0;
  for (const auto& [dtype, shape] : kinds) {
    Tensor tensor = Tensor::zeros(dtype, shape);
    auto* bytes = static_cast<uint8_t*>(tensor.data);
    for (size_t i = 0; i < tensor.nbytes(); ++i) bytes[i] = dtype == DType::Bool ? i % 2 : uint8_t(17 * index + i);
    tensors.push_back({fmt::format("t{}.{}", index++, dtype_name(dtype)), tensor, ""});
  }
  return tensors;
}

TEST(SafetensorsWriter, RoundTripsEveryDTypeAndMetadata) {
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  const auto written = every_dtype_tensors();
  write_safetensors(path, written, {{"format", "pt"}, {"note", "round trip"}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  // The raw layout, read independently of the reader: 8-byte aligned header, contiguous offsets.
  const std::string bytes = test::read_bytes(path);
  uint64_t header_bytes;
  std::memcpy(&header_bytes, bytes.data(), 8);
  EXPECT_EQ(header_bytes % 8, 0u);
  const auto header = nlohmann::json::parse(bytes.substr(8, header_bytes));
  EXPECT_EQ(header["t0.f32"]["dtype"], "F32");
  EXPECT_EQ(header["t2.bf16"]["dtype"], "BF16");
  EXPECT_EQ(header["t9.bool"]["dtype"], "BOOL");
  EXPECT_EQ(header["t1.f16"]["data_offsets"], nlohmann::json::array({24, 30}));
  EXPECT_EQ(header["__metadata__"]["note"], "round trip");

  const auto source = open_safetensors(path);
  ASSERT_EQ(source->tensors().size(), written.size());
  EXPECT_EQ(source->metadata(), nlohmann::json({{"format", "pt"}, {"note", "round trip"}}));
  for (const TensorInfo& expected : written) {
    const TensorInfo* actual = source->find(expected.name);
    ASSERT_NE(actual, nullptr) << expected.name;
    EXPECT_EQ(actual->tensor.dtype, expected.tensor.dtype) << expected.name;
    EXPECT_EQ(actual->tensor.shape, expected.tensor.shape) << expected.name;
    EXPECT_EQ(std::memcmp(actual->tensor.data, expected.tensor.data, expected.tensor.nbytes()), 0) << expected.name;
  }
}

TEST(SafetensorsWriter, RejectsBadInput) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const Tensor one = Tensor::zeros(DType::F32, {1});
  expect_error([&] { write_safetensors(path, {{"w", one, ""}, {"w", one, ""}}); }, {path, "'w'", "twice"});
  expect_error([&] { write_safetensors(path, {{"__metadata__", one, ""}}); }, {path, "__metadata__"});
  Tensor no_data;
  no_data.shape = {4};
  expect_error([&] { write_safetensors(path, {{"hollow", no_data, ""}}); }, {path, "'hollow'", "no data"});
  const std::string unwritable = dir.file("missing-dir/x.safetensors");
  expect_error([&] { write_safetensors(unwritable, {{"w", one, ""}}); }, {unwritable, "cannot create"});
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Safetensors, MisalignedDataIsCopiedNotViewed) {
  // A 9-byte header puts the data section at offset 17, misaligned for f32.
  TempDir dir;
  const std::string path = dir.file("odd.safetensors");
  const std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} )";
  std::string bytes = safetensors_bytes(header, 0);
  const float values[2] = {1.5f, -2.25f};
  bytes.append(reinterpret_cast<const char*>(values), sizeof values);
  ASSERT_NE((8 + header.size()) % 4, 0u);
  test::write_bytes(path, bytes);
  const auto source = open_safetensors(path);
  const Tensor& x = source->find("x")->tensor;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.data) % alignof(float), 0u);
  EXPECT_EQ(x.as<float>()[0], 1.5f);
  EXPECT_EQ(x.as<float>()[1], -2.25f);
}

struct DamagedHeader {
  const char* header;
  size_t data_bytes;
  std::vector<std::string> expected;  // substrings of the message besides the path
};

TEST(Safetensors, DamagedFilesGiveErrorsNamingFileAndProblem) {
  const DamagedHeader cases[] = {
      {"not json", 0, {"not valid JSON"}},
      {R"({"a": )", 0, {"not valid JSON"}},
      {"[1, 2]", 0, {"not a JSON object"}},
      {R"({"t": 5})", 0, {"'t'", "not an object"}},
      {R"({"t": {"shape": [1], "data_offsets": [0, 4]}})", 4, {"'t'", "dtype"}},
      {R"({"t": {"dtype": "F8_E5M2", "shape": [1], "data_offsets": [0, 1]}})", 1, {"'t'", "F8_E5M2", "not supported"}},
      {R"({"t": {"dtype": "F32", "data_offsets": [0, 4]}})", 4, {"'t'", "shape"}},
      {R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4, {"'t'", "negative"}},
      {R"({"t": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4, {"'t'", "not an integer"}},
      {R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 4]}})", 4, {"'t'", "overflows"}},
      {R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4, {"'t'", "data_offsets"}},
      {R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4, {"'t'", "[0, 8]", "outside the 4-byte data section"}},
      {R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8, {"'t'", "[8, 4]", "outside"}},
      {R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 18446744073709551615]}})", 4, {"'t'", "outside"}},
      {R"({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8, {"'t'", "span 8 bytes", "needs 12"}},
      {R"({"t": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 4]}})", 8, {"'t'", "[2, 2]", "needs 8"}},
      {R"({"__metadata__": [1], "t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4, {"__metadata__"}},
      // Issue 24: tensors sharing data bytes, aliased or straddling, are named together.
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
       8, {"'a'", "'b'", "overlap"}},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       12, {"'a'", "'b'", "[4, 12)", "overlap"}},
      {R"({"big": {"dtype": "U8", "shape": [12], "data_offsets": [0, 12]}, "inner": {"dtype": "U8", "shape": [2], "data_offsets": [8, 10]}, "z": {"dtype": "U8", "shape": [0], "data_offsets": [4, 4]}})",
       12, {"'big'", "'inner'", "overlap"}},
  };
  TempDir dir;
  const std::string path = dir.file("damaged.safetensors");
  for (const DamagedHeader& damaged : cases) {
    SCOPED_TRACE(damaged.header);
    test::write_bytes(path, safetensors_bytes(damaged.header, damaged.data_bytes));
    try {
      open_safetensors(path);
      ADD_FAILURE() << "opened";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(path), std::string::npos) << message;
      for (const std::string& part : damaged.expected) EXPECT_NE(message.find(part), std::string::npos) << message;
    }
  }
}

TEST(Safetensors, TooShortOrOversizedHeaderLength) {
  TempDir dir;
  const std::string path = dir.file("short.safetensors");
  test::write_bytes(path, "");
  expect_error([&] { open_safetensors(path); }, {path, "too small"});
  test::write_bytes(path, "1234567");
  expect_error([&] { open_safetensors(path); }, {path, "too small"});
  ByteWriter huge;
  huge.put<uint64_t>(1000).raw("{}");
  test::write_bytes(path, huge.bytes);
  expect_error([&] { open_safetensors(path); }, {path, "header length 1000 exceeds the 2 bytes"});
  ByteWriter max;
  max.put<uint64_t>(UINT64_MAX).raw("{}");
  test::write_bytes(path, max.bytes);
  expect_error([&] { open_safetensors(path); }, {path, "exceeds"});
  expect_error([&] { open_safetensors(dir.file("absent.safetensors")); }, {"absent.safetensors", "cannot open"});
}

// Two shards and an index written with the writer, as HF sharded checkpoints are laid out.
struct ShardedCheckpoint {
  TempDir dir;
  std::vector<TensorInfo> tensors = every_dtype_tensors();

  ShardedCheckpoint() {
    const std::vector<TensorInfo> first(tensors.begin(), tensors.begin() + 5), second(tensors.begin() + 5, tensors.end());
    write_safetensors(dir.file("model-00001-of-00002.safetensors"), first, {{"format", "pt"}});
    write_safetensors(dir.file("model-00002-of-00002.safetensors"), second, {{"format", "pt"}});
    nlohmann::json index = {{"metadata", {{"total_size", 123}}}, {"weight_map", nlohmann::json::object()}};
    for (const auto& info : first) index["weight_map"][info.name] = "model-00001-of-00002.safetensors";
    for (const auto& info : second) index["weight_map"][info.name] = "model-00002-of-00002.safetensors";
    write_index(index);
  }
  std::string index_path() const { return dir.file("model.safetensors.index.json"); }
  void write_index(const nlohmann::json& index) const { test::write_bytes(index_path(), index.dump()); }
  nlohmann::json index() const { return nlohmann::json::parse(test::read_bytes(index_path())); }
};

TEST(SafetensorsIndex, OpensEveryShardOnceAndFindsEveryTensor) {
  ShardedCheckpoint checkpoint;
  for (const auto& source : {open_safetensors_index(checkpoint.index_path()), open_weights(checkpoint.dir.path())}) {
    EXPECT_EQ(source->format(), "safetensors");
    ASSERT_EQ(source->tensors().size(), checkpoint.tensors.size());
    EXPECT_EQ(source->metadata()["total_size"], 123);
    EXPECT_EQ(source->metadata()["format"], "pt");
    for (const TensorInfo& expected : checkpoint.tensors) {
      const TensorInfo* actual = source->find(expected.name);
      ASSERT_NE(actual, nullptr) << expected.name;
      EXPECT_EQ(actual->tensor.shape, expected.tensor.shape);
      EXPECT_EQ(std::memcmp(actual->tensor.data, expected.tensor.data, expected.tensor.nbytes()), 0) << expected.name;
    }
    // Tensors of one shard share its single mapping.
    const auto& tensors = checkpoint.tensors;
    EXPECT_EQ(source->find(tensors[0].name)->tensor.storage, source->find(tensors[4].name)->tensor.storage);
    EXPECT_NE(source->find(tensors[0].name)->tensor.storage, source->find(tensors[5].name)->tensor.storage);
    EXPECT_EQ(source->find(tensors[6].name)->file, checkpoint.dir.file("model-00002-of-00002.safetensors"));
  }
}

TEST(SafetensorsIndex, MissingShardNamesIndexAndShard) {
  ShardedCheckpoint checkpoint;
  auto index = checkpoint.index();
  index["weight_map"]["extra"] = "model-00003-of-00002.safetensors";
  checkpoint.write_index(index);
  expect_error([&] { open_safetensors_index(checkpoint.index_path()); },
               {checkpoint.index_path(), "model-00003-of-00002.safetensors", "cannot open"});
}

TEST(SafetensorsIndex, TensorMissingFromItsShard) {
  ShardedCheckpoint checkpoint;
  auto index = checkpoint.index();
  index["weight_map"][checkpoint.tensors[6].name] = "model-00001-of-00002.safetensors";
  checkpoint.write_index(index);
  expect_error([&] { open_safetensors_index(checkpoint.index_path()); },
               {checkpoint.index_path(), "'" + checkpoint.tensors[6].name + "'", "model-00001-of-00002.safetensors",
                "no such tensor"});
}

TEST(SafetensorsIndex, DuplicateTensorAcrossShards) {
  ShardedCheckpoint checkpoint;
  write_safetensors(checkpoint.dir.file("model-00002-of-00002.safetensors"),
                    {checkpoint.tensors[0], checkpoint.tensors[6]});
  auto index = checkpoint.index();
  index["weight_map"].erase(checkpoint.tensors[5].name);
  checkpoint.write_index(index);
  expect_error([&] { open_safetensors_index(checkpoint.index_path()); },
               {"'" + checkpoint.tensors[0].name + "'", "twice", "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"});
}

TEST(SafetensorsIndex, MalformedIndex) {
  ShardedCheckpoint checkpoint;
  const std::string path = checkpoint.index_path();
  test::write_bytes(path, "{\"weight_map\": ");
  expect_error([&] { open_safetensors_index(path); }, {path, "not valid JSON"});
  test::write_bytes(path, R"({"metadata": {}})");
  expect_error([&] { open_safetensors_index(path); }, {path, "weight_map"});
  test::write_bytes(path, R"({"weight_map": {"a": 3}})");
  expect_error([&] { open_safetensors_index(path); }, {path, "'a'", "not a file name"});
  expect_error([&] { open_safetensors_index(checkpoint.dir.file("absent.index.json")); }, {"absent.index.json", "cannot open"});
}

}  // namespace
}  // namespace splitflow
