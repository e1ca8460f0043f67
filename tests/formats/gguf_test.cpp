#include "formats/weight_source.h"
#include "format_test_util.h"
#include "gguf_builder.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>

namespace splitflow {
namespace {

using namespace test;

const std::string kStoriesGguf = shared_path("models/stories260K-gguf/stories260K.gguf");
const std::string kStoriesGgufF16 = shared_path("models/stories260K-gguf/stories260K-f16.gguf");
const std::string kLlama2c = shared_path("models/stories260K/stories260K.bin");

TEST(Gguf, OpensStories260KF32) {
  const auto source = open_gguf(kStoriesGguf);
  EXPECT_EQ(source->format(), "gguf");
  EXPECT_EQ(source->tensors().size(), 48u);  // token_embd, output, output_norm, 5 x 9 per block
  const std::pair<const char*, Shape> expected[] = {{"token_embd.weight", {512, 64}},   {"output.weight", {512, 64}},
                                                    {"output_norm.weight", {64}},       {"blk.0.attn_q.weight", {64, 64}},
                                                    {"blk.4.attn_k.weight", {32, 64}},  {"blk.2.attn_v.weight", {32, 64}},
                                                    {"blk.3.ffn_gate.weight", {172, 64}}, {"blk.3.ffn_down.weight", {64, 172}},
                                                    {"blk.1.ffn_norm.weight", {64}}};
  for (const auto& [name, shape] : expected) {
    const TensorInfo* info = source->find(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->tensor.shape, shape) << name;
    EXPECT_EQ(info->tensor.dtype, DType::F32) << name;
    EXPECT_EQ(info->file, kStoriesGguf);
  }

  // Reference values from the `gguf` Python package.
  const nlohmann::json& meta = source->metadata();
  EXPECT_EQ(meta["llama.context_length"], 512);
  EXPECT_EQ(meta["llama.embedding_length"], 64);
  EXPECT_EQ(meta["llama.attention.head_count_kv"], 4);
  EXPECT_EQ(meta["general.architecture"], "llama");
  EXPECT_EQ(meta["tokenizer.ggml.model"], "llama");
  EXPECT_EQ(meta["tokenizer.ggml.padding_token_id"], 4294967295u);
  EXPECT_EQ(meta["llama.attention.layer_norm_rms_epsilon"].get<double>(), double(1e-5f));
  const auto& tokens = meta["tokenizer.ggml.tokens"];
  ASSERT_EQ(tokens.size(), 512u);
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(tokens[3], "<0x00>");
  EXPECT_EQ(tokens[300], "\xe2\x96\x81ha");
  ASSERT_EQ(meta["tokenizer.ggml.scores"].size(), 512u);
  EXPECT_EQ(meta["tokenizer.ggml.scores"][300].get<double>(), -41.0);
  EXPECT_EQ(meta["tokenizer.ggml.token_type"][0], 2);
  EXPECT_EQ(meta["tokenizer.ggml.token_type"][3], 6);
}

TEST(Gguf, TensorsEqualTheLlama2cFileBytes) {
  // Converted from stories260K.bin by llama.cpp, which keeps Q/K interleaved, so whole matrices match.
  const std::string bin = read_bytes(kLlama2c);
  const size_t dim = 64, vocab = 512, layers = 5;
  const size_t embedding_offset = 28, wq_offset = embedding_offset + 4 * (vocab * dim + layers * dim);
  const auto source = open_gguf(kStoriesGguf);
  for (const char* name : {"token_embd.weight", "output.weight"})
    EXPECT_EQ(std::memcmp(source->find(name)->tensor.data, bin.data() + embedding_offset, vocab * dim * 4), 0) << name;
  for (size_t layer = 0; layer < layers; ++layer) {
    const Tensor& wq = source->find("blk." + std::to_string(layer) + ".attn_q.weight")->tensor;
    EXPECT_EQ(std::memcmp(wq.data, bin.data() + wq_offset + layer * dim * dim * 4, dim * dim * 4), 0) << layer;
  }
}

TEST(Gguf, F16ValuesAreF32ValuesRoundedToF16) {
  const auto f32 = open_gguf(kStoriesGguf);
  const auto f16 = open_gguf(kStoriesGgufF16);
  ASSERT_EQ(f16->tensors().size(), f32->tensors().size());
  int f16_tensors = 0;
  for (const TensorInfo& half : f16->tensors()) {
    const TensorInfo* full = f32->find(half.name);
    ASSERT_NE(full, nullptr) << half.name;
    ASSERT_EQ(half.tensor.shape, full->tensor.shape) << half.name;
    const float* reference = full->tensor.as<float>();
    if (half.tensor.dtype == DType::F32) {
      EXPECT_EQ(std::memcmp(half.tensor.data, reference, half.tensor.nbytes()), 0) << half.name;
      continue;
    }
    ASSERT_EQ(half.tensor.dtype, DType::F16) << half.name;
    ++f16_tensors;
    const auto* bits = half.tensor.as<uint16_t>();
    for (int64_t i = 0; i < half.tensor.numel(); ++i)  // the compiler's own f32 -> f16 rounding as reference
      ASSERT_EQ(bits[i], std::bit_cast<uint16_t>(static_cast<_Float16>(reference[i]))) << half.name << "[" << i << "]";
  }
  EXPECT_EQ(f16_tensors, 37);
}

TEST(Gguf, OpensVocabOnlyFiles) {
  struct Vocab {
    const char* file;
    size_t tokens, merges;
    const char* model;
  };
  // Counts from the `gguf` Python package.
  const Vocab vocabs[] = {{"ggml-vocab-bert-bge.gguf", 30522, 0, "bert"},
                          {"ggml-vocab-deepseek-llm.gguf", 102400, 99757, "gpt2"},
                          {"ggml-vocab-falcon.gguf", 65024, 64784, "gpt2"},
                          {"ggml-vocab-gpt-2.gguf", 50257, 50000, "gpt2"},
                          {"ggml-vocab-llama-spm.gguf", 32000, 0, "llama"},
                          {"ggml-vocab-phi-3.gguf", 32064, 0, "llama"}};
  for (const Vocab& vocab : vocabs) {
    SCOPED_TRACE(vocab.file);
    const auto source = open_weights(shared_path(std::string("tokenizer-vectors/") + vocab.file));
    EXPECT_EQ(source->format(), "gguf");
    EXPECT_TRUE(source->tensors().empty());
    const nlohmann::json& meta = source->metadata();
    EXPECT_EQ(meta["tokenizer.ggml.tokens"].size(), vocab.tokens);
    EXPECT_EQ(meta.contains("tokenizer.ggml.merges") ? meta["tokenizer.ggml.merges"].size() : 0u, vocab.merges);
    EXPECT_EQ(meta["tokenizer.ggml.model"], vocab.model);
  }
  const auto gpt2 = open_gguf(shared_path("tokenizer-vectors/ggml-vocab-gpt-2.gguf"));
  EXPECT_EQ(gpt2->metadata()["tokenizer.ggml.merges"][0], "\xc4\xa0 t");
  EXPECT_EQ(gpt2->metadata()["tokenizer.ggml.pre"], "gpt-2");
}

TEST(Gguf, ReadsEveryValueTypeAndTensorLayout) {
  GgufBuilder gguf;
  gguf.version = 2;
  gguf.alignment = 64;
  gguf.key("general.alignment", kGgufU32).put<uint32_t>(64);
  gguf.key("u8", kGgufU8).put<uint8_t>(200);
  gguf.key("i8", kGgufI8).put<int8_t>(-5);
  gguf.key("u16", kGgufU16).put<uint16_t>(60000);
  gguf.key("i16", kGgufI16).put<int16_t>(-300);
  gguf.key("u32", kGgufU32).put<uint32_t>(4000000000u);
  gguf.key("i32", kGgufI32).put<int32_t>(-70000);
  gguf.key("f32", kGgufF32).put<float>(0.5f);
  gguf.key("bool", kGgufBool).put<uint8_t>(1);
  gguf.key("string", kGgufString).str("h\xc3\xa9llo");
  gguf.key("u64", kGgufU64).put<uint64_t>((1ull << 63) + 1);
  gguf.key("i64", kGgufI64).put<int64_t>(-(1ll << 40));
  gguf.key("f64", kGgufF64).put<double>(0.1);
  gguf.key("ints", kGgufArray).put<uint32_t>(kGgufI32).put<uint64_t>(3).put<int32_t>(1).put<int32_t>(-2).put<int32_t>(3);
  gguf.key("strings", kGgufArray).put<uint32_t>(kGgufString).put<uint64_t>(2).str("a").str("bc");
  gguf.key("nested", kGgufArray).put<uint32_t>(kGgufArray).put<uint64_t>(2)
      .put<uint32_t>(kGgufU8).put<uint64_t>(2).put<uint8_t>(1).put<uint8_t>(2)
      .put<uint32_t>(kGgufBool).put<uint64_t>(1).put<uint8_t>(0);
  gguf.key("empty", kGgufArray).put<uint32_t>(kGgufF64).put<uint64_t>(0);
  const std::vector<float> matrix = {1, 2, 3, 4, 5, 6};
  const std::vector<uint16_t> halves = {0x3c00, 0xc000, 0x3800, 0x0001};  // 1, -2, 0.5, smallest subnormal
  const std::vector<uint16_t> brains = {0x3f80, 0x4000, 0xbf80, 0x4040};  // 1, 2, -1, 3
  const std::vector<int32_t> ints = {7, -8};
  gguf.tensor("matrix", {3, 2}, kGgmlF32, as_bytes_of(matrix));
  gguf.tensor("halves", {4}, kGgmlF16, as_bytes_of(halves));
  gguf.tensor("brains", {2, 1, 1, 2}, kGgmlBF16, as_bytes_of(brains));
  gguf.tensor("ints", {2}, kGgmlI32, as_bytes_of(ints));
  TempDir dir;
  const std::string path = dir.file("all.gguf");
  write_bytes(path, gguf.bytes());

  const auto source = open_gguf(path);
  const nlohmann::json& meta = source->metadata();
  EXPECT_EQ(meta["u8"], 200);
  EXPECT_EQ(meta["i8"], -5);
  EXPECT_EQ(meta["u16"], 60000);
  EXPECT_EQ(meta["i16"], -300);
  EXPECT_EQ(meta["u32"], 4000000000u);
  EXPECT_EQ(meta["i32"], -70000);
  EXPECT_EQ(meta["f32"], 0.5);
  EXPECT_EQ(meta["bool"], true);
  EXPECT_EQ(meta["string"], "h\xc3\xa9llo");
  EXPECT_EQ(meta["u64"], (1ull << 63) + 1);
  EXPECT_EQ(meta["i64"], -(1ll << 40));
  EXPECT_EQ(meta["f64"], 0.1);
  EXPECT_EQ(meta["ints"], nlohmann::json({1, -2, 3}));
  EXPECT_EQ(meta["strings"], nlohmann::json({"a", "bc"}));
  EXPECT_EQ(meta["nested"], nlohmann::json::parse("[[1, 2], [false]]"));
  EXPECT_EQ(meta["empty"], nlohmann::json::array());

  ASSERT_EQ(source->tensors().size(), 4u);
  const Tensor& m = source->find("matrix")->tensor;
  EXPECT_EQ(m.shape, (Shape{2, 3}));  // ne [3, 2] reversed
  EXPECT_EQ(std::vector<float>(m.as<float>(), m.as<float>() + 6), matrix);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m.data) % 64, reinterpret_cast<uintptr_t>(source->find("halves")->tensor.data) % 64);
  const Tensor& h = source->find("halves")->tensor;
  EXPECT_EQ(h.dtype, DType::F16);
  EXPECT_EQ(std::vector<uint16_t>(h.as<uint16_t>(), h.as<uint16_t>() + 4), halves);
  const Tensor& b = source->find("brains")->tensor;
  EXPECT_EQ(b.dtype, DType::BF16);
  EXPECT_EQ(b.shape, (Shape{2, 1, 1, 2}));
  EXPECT_EQ(std::vector<uint16_t>(b.as<uint16_t>(), b.as<uint16_t>() + 4), brains);
  const Tensor& i = source->find("ints")->tensor;
  EXPECT_EQ(i.dtype, DType::I32);
  EXPECT_EQ(std::vector<int32_t>(i.as<int32_t>(), i.as<int32_t>() + 2), ints);
}

// A valid file with one tensor; each damage case edits a copy of it.
GgufBuilder small_gguf() {
  GgufBuilder gguf;
  gguf.key("general.architecture", kGgufString).str("llama");
  gguf.tensor("w", {2, 2}, kGgmlF32, as_bytes_of(std::vector<float>{1, 2, 3, 4}));
  return gguf;
}

class GgufDamage : public ::testing::Test {
 protected:
  void expect_rejected(const std::string& bytes, std::initializer_list<std::string_view> parts) {
    write_bytes(path_, bytes);
    expect_error([&] { open_gguf(path_); }, parts);
    expect_error([&] { open_gguf(path_); }, {path_});
  }
  void expect_rejected(const GgufBuilder& gguf, std::initializer_list<std::string_view> parts) {
    expect_rejected(gguf.bytes(), parts);
  }
  TempDir dir_;
  std::string path_ = dir_.file("damaged.gguf");
};

TEST_F(GgufDamage, SmallFileIsValid) {
  write_bytes(path_, small_gguf().bytes());
  EXPECT_EQ(open_gguf(path_)->find("w")->tensor.as<float>()[3], 4.0f);
}

TEST_F(GgufDamage, EmptyFileAndBadMagic) {
  expect_rejected(std::string(), {"GGUF magic", "truncated"});
  std::string bytes = small_gguf().bytes();
  bytes[3] = 'X';
  expect_rejected(bytes, {"bad magic"});
}

TEST_F(GgufDamage, UnsupportedVersions) {
  for (uint32_t version : {0u, 1u, 4u, 0x03000000u}) {
    GgufBuilder gguf = small_gguf();
    gguf.version = version;
    expect_rejected(gguf, {"GGUF version " + std::to_string(version), "not supported"});
  }
}

TEST_F(GgufDamage, AbsurdCounts) {
  GgufBuilder tensors = small_gguf();
  tensors.tensor_count = 1ull << 50;
  expect_rejected(tensors, {"claims 1125899906842624 tensors"});
  GgufBuilder kvs = small_gguf();
  kvs.kv_count = UINT64_MAX;
  expect_rejected(kvs, {"claims 18446744073709551615 key/values"});
}

TEST_F(GgufDamage, AbsurdStringLengths) {
  GgufBuilder key;
  key.kv_count = 1;
  key.kv.put<uint64_t>(1ull << 62).raw("abc");
  expect_rejected(key, {"key #0", "needs 4611686018427387904 bytes"});
  GgufBuilder value;
  value.key("general.name", kGgufString).put<uint64_t>(UINT64_MAX);
  expect_rejected(value, {"general.name", "needs 18446744073709551615 bytes"});
  GgufBuilder name = small_gguf();
  name.tensor_count += 1;
  name.infos.put<uint64_t>(1ull << 40);
  expect_rejected(name, {"tensor #1 name", "needs 1099511627776 bytes"});
}

TEST_F(GgufDamage, AbsurdArrayCounts) {
  for (uint32_t type : {kGgufU8, kGgufString, kGgufArray, kGgufF64}) {
    GgufBuilder gguf;
    gguf.key("tokenizer.ggml.tokens", kGgufArray).put<uint32_t>(type).put<uint64_t>(1ull << 60);
    expect_rejected(gguf, {"tokenizer.ggml.tokens", "claims 1152921504606846976 array elements"});
  }
}

TEST_F(GgufDamage, UnknownValueTypesAndDeepNesting) {
  GgufBuilder unknown;
  unknown.key("k", 13).put<uint32_t>(0);
  expect_rejected(unknown, {"'k'", "unknown value type 13"});
  GgufBuilder unknown_element;
  unknown_element.key("k", kGgufArray).put<uint32_t>(99).put<uint64_t>(1);
  expect_rejected(unknown_element, {"'k'", "unknown value type 99"});
  GgufBuilder deep;
  ByteWriter& value = deep.key("k", kGgufArray);
  for (int level = 0; level < 100; ++level) value.put<uint32_t>(kGgufArray).put<uint64_t>(1);
  value.put<uint32_t>(kGgufU8).put<uint64_t>(0);
  expect_rejected(deep, {"'k'", "nests arrays deeper"});
}

TEST_F(GgufDamage, DuplicateKeysAndTensors) {
  GgufBuilder keys = small_gguf();
  keys.key("general.architecture", kGgufString).str("gpt2");
  expect_rejected(keys, {"'general.architecture'", "twice"});
  GgufBuilder tensors = small_gguf();
  tensors.tensor("w", {1}, kGgmlF32, as_bytes_of(std::vector<float>{1}));
  expect_rejected(tensors, {"'w'", "twice"});
}

TEST_F(GgufDamage, BadAlignment) {
  for (uint32_t alignment : {0u, 3u, 1u << 30}) {
    GgufBuilder gguf = small_gguf();
    gguf.key("general.alignment", kGgufU32).put<uint32_t>(alignment);
    expect_rejected(gguf, {"general.alignment " + std::to_string(alignment)});
  }
  GgufBuilder text = small_gguf();
  text.key("general.alignment", kGgufString).str("32");
  expect_rejected(text, {"general.alignment is not an unsigned integer"});
}

TEST_F(GgufDamage, BadTensorInfos) {
  GgufBuilder dims;
  dims.info("w", {1, 1, 1, 1, 1}, kGgmlF32, 0);
  expect_rejected(dims, {"'w'", "5 dimensions"});
  GgufBuilder huge_dims;
  huge_dims.info("w", {UINT32_MAX}, kGgmlF32, 0);
  huge_dims.infos.bytes.replace(8 + 1, 4, "\xff\xff\xff\xff", 4);  // n_dims = 2^32 - 1
  expect_rejected(huge_dims, {"'w'", "4294967295 dimensions"});
  GgufBuilder extent;
  extent.info("w", {1ull << 63}, kGgmlF32, 0);
  expect_rejected(extent, {"'w'", "dimension 0"});
  GgufBuilder overflow;
  overflow.info("w", {1ull << 32, 1ull << 32, 1ull << 32}, kGgmlF32, 0);
  expect_rejected(overflow, {"'w'", "overflows"});
  GgufBuilder bytes_overflow;
  bytes_overflow.info("w", {1ull << 31, 1ull << 30, 2}, kGgmlF32, 0);  // 2^62 elements, 2^64 bytes
  expect_rejected(bytes_overflow, {"'w'", "byte size overflows"});
  GgufBuilder count_overflow;  // 2^63 elements fit uint64_t but not Tensor's int64_t count
  count_overflow.info("w", {1ull << 31, 1ull << 31, 2}, kGgmlF32, 0);
  expect_rejected(count_overflow, {"'w'", "elements overflow a signed 64-bit count"});
  GgufBuilder misaligned;
  misaligned.info("w", {1}, kGgmlF32, 4);
  misaligned.data.assign(64, '\0');
  expect_rejected(misaligned, {"'w'", "offset 4", "alignment 32"});
}

TEST_F(GgufDamage, QuantizedAndUnknownGgmlTypes) {
  GgufBuilder unsupported;
  unsupported.tensor("blk.0.attn_q.weight", {256}, 16 /* IQ2_XXS */, std::string(66, '\0'));
  expect_rejected(unsupported, {"'blk.0.attn_q.weight'", "ggml type IQ2_XXS", "does not run"});
  GgufBuilder partial_block;
  partial_block.tensor("blk.0.attn_k.weight", {100, 2}, kGgmlQ4K, std::string(144, '\0'));
  expect_rejected(partial_block, {"'blk.0.attn_k.weight'", "q4_k", "rows of 100 elements"});
  GgufBuilder truncated;
  truncated.tensor("blk.0.attn_v.weight", {256, 2}, kGgmlQ4K, std::string(200, '\0'));  // 288 bytes needed
  expect_rejected(truncated, {"'blk.0.attn_v.weight'", "288 bytes", "beyond the end"});
  for (uint32_t type : {4u, 99u}) {
    GgufBuilder unknown;
    unknown.tensor("w", {1}, type, std::string(4, '\0'));
    expect_rejected(unknown, {"'w'", "unknown ggml type " + std::to_string(type)});
  }
}

TEST_F(GgufDamage, TensorDataBeyondEndOfFile) {
  GgufBuilder short_data = small_gguf();
  short_data.tensor("big", {1000}, kGgmlF32, std::string(16, '\0'));
  expect_rejected(short_data, {"'big'", "4000 bytes", "beyond the end"});
  GgufBuilder far = small_gguf();
  far.info("far", {1}, kGgmlF32, UINT64_MAX - 31);
  expect_rejected(far, {"'far'", "beyond the end"});
  GgufBuilder missing_section;
  missing_section.info("w", {1}, kGgmlF32, 0);
  missing_section.alignment = 1;  // no padding written: the data section starts at EOF
  expect_rejected(missing_section.bytes(), {"'w'", "beyond the end"});
}

// Issue 24: two tensors whose data share bytes (here one aliasing the other) are rejected by name.
TEST_F(GgufDamage, OverlappingTensorData) {
  GgufBuilder aliased = small_gguf();
  aliased.info("alias", {2}, kGgmlF32, 0);  // "w" holds bytes [0, 16) of the data section
  expect_rejected(aliased, {"'w'", "'alias'", "overlap"});
  GgufBuilder straddling = small_gguf();
  straddling.tensor("next", {4}, kGgmlF32, std::string(16, '\0'));  // at 32: after "w" and its padding
  straddling.info("straddle", {12}, kGgmlF32, 0);                      // [0, 48) covers "w" and reaches into "next"
  expect_rejected(straddling, {"'straddle'", "overlap"});
  GgufBuilder adjacent = small_gguf();
  adjacent.info("empty", {0}, kGgmlF32, 0);  // an empty tensor shares no byte
  write_bytes(path_, adjacent.bytes());
  EXPECT_NO_THROW(open_gguf(path_));
}

// Issue 24: model-level counts the spec sizes layers, caches and tables from are bounded when the
// file is opened (a block_count of 2^31-1 made `inspect` run out of memory).
TEST_F(GgufDamage, AbsurdModelCounts) {
  const auto with_count = [](std::string_view key, uint32_t type, uint64_t value) {
    GgufBuilder gguf = small_gguf();
    ByteWriter& out = gguf.key(key, type);
    if (type == kGgufU32) out.put<uint32_t>(static_cast<uint32_t>(value));
    else out.put<uint64_t>(value);
    return gguf;
  };
  expect_rejected(with_count("llama.block_count", kGgufU32, 0x7fffffff), {"llama.block_count is 2147483647", "65536"});
  expect_rejected(with_count("llama.block_count", kGgufU64, 1ull << 63), {"llama.block_count is 9223372036854775808"});
  expect_rejected(with_count("llama.block_count", kGgufU32, 2), {"llama.block_count is 2", "only 1 tensors"});
  expect_rejected(with_count("llama.context_length", kGgufU32, 0xffffffff), {"llama.context_length is 4294967295"});
  expect_rejected(with_count("llama.attention.head_count", kGgufU64, 1ull << 40), {"llama.attention.head_count"});
  expect_rejected(with_count("llama.vocab_size", kGgufU32, 1u << 30), {"llama.vocab_size is 1073741824"});
  GgufBuilder negative = small_gguf();
  negative.key("llama.embedding_length", kGgufI32).put<int32_t>(-8);
  expect_rejected(negative, {"llama.embedding_length is -8", "non-negative integer"});
  GgufBuilder per_layer = small_gguf();  // one head count per layer, one of them absurd
  per_layer.key("llama.attention.head_count_kv", kGgufArray).put<uint32_t>(kGgufU32).put<uint64_t>(2);
  per_layer.kv.put<uint32_t>(4).put<uint32_t>(0x7fffffff);
  expect_rejected(per_layer, {"llama.attention.head_count_kv is 2147483647"});
  write_bytes(path_, with_count("llama.block_count", kGgufU32, 1).bytes());
  EXPECT_NO_THROW(open_gguf(path_));
}

}  // namespace
}  // namespace splitflow
