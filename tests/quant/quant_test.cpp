// quant.h's tensor-level functions: the type table, whole-matrix quantize / dequantize (plain,
// generated, Mixed), validate and the bad-input errors.
#include "quant/quant.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace splitflow;

namespace {

Tensor random_matrix(int64_t rows, int64_t cols, uint32_t seed, float stddev = 0.05f) {
  Tensor t = Tensor::zeros(DType::F32, {rows, cols});
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  for (int64_t i = 0; i < rows * cols; ++i) t.as<float>()[i] = normal(rng);
  return t;
}

// Expects `body` to throw splitflow::Error whose message contains every one of `parts`.
template <typename Body>
void expect_error(Body body, std::initializer_list<std::string> parts) {
  try {
    body();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    for (const std::string& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

void set_f16(Tensor& t, size_t byte_offset, uint16_t bits) {
  auto* bytes = t.as<uint8_t>() + byte_offset;
  bytes[0] = static_cast<uint8_t>(bits & 0xff);
  bytes[1] = static_cast<uint8_t>(bits >> 8);
}

}  // namespace

TEST(Quant, TypeTableCoversEveryQuantizedDType) {
  std::vector<DType> listed;
  for (const quant::TypeInfo& entry : quant::all_types()) listed.push_back(entry.type);
  std::vector<DType> quantized;
  for (auto d = static_cast<int>(DType::F32); d <= static_cast<int>(DType::Mixed); ++d)
    if (is_quantized(static_cast<DType>(d))) quantized.push_back(static_cast<DType>(d));
  EXPECT_EQ(listed, quantized);
  // Storage bits per weight, scales included (ggml's and the Inferflow paper's figures).
  EXPECT_DOUBLE_EQ(quant::info(DType::Q4_0).bits_per_weight, 4.5);
  EXPECT_DOUBLE_EQ(quant::info(DType::Q4_K).bits_per_weight, 4.5);
  EXPECT_DOUBLE_EQ(quant::info(DType::Q6_K).bits_per_weight, 6.5625);
  EXPECT_DOUBLE_EQ(quant::info(DType::Q8_0).bits_per_weight, 8.5);
  EXPECT_DOUBLE_EQ(quant::info(DType::Q4_B32).bits_per_weight, 5.0);
  EXPECT_DOUBLE_EQ(quant::info(DType::Q4_B64).bits_per_weight, 4.5);
  EXPECT_DOUBLE_EQ(quant::info(DType::Q3H_B64).bits_per_weight, 4.0);
  EXPECT_DOUBLE_EQ(quant::info(DType::Q3_B32).bits_per_weight, 4.0);
  EXPECT_DOUBLE_EQ(quant::info(DType::F8_G128).bits_per_weight, 8.25);
  EXPECT_DOUBLE_EQ(quant::info(DType::I8_G32).bits_per_weight, 9.0);
  EXPECT_DOUBLE_EQ(quant::info(DType::I8_G64).bits_per_weight, 8.5);
  EXPECT_DOUBLE_EQ(quant::info(DType::I8_G128).bits_per_weight, 8.25);
  EXPECT_EQ(quant::info(DType::I8_G64).family, quant::Family::Int8);
  // The int8 groups' rows: f32 scales padded to 16 bytes, then one byte per weight.
  EXPECT_EQ(dtype_row_bytes(DType::I8_G32, 64), 16u + 64u);
  EXPECT_EQ(dtype_row_bytes(DType::I8_G32, 160), 32u + 160u);
  EXPECT_EQ(dtype_row_bytes(DType::I8_G128, 128), 16u + 128u);
  EXPECT_EQ(parse_dtype("I8_G64"), DType::I8_G64);
  EXPECT_EQ(quant::info(DType::Q3H_B64).family, quant::Family::Inferflow);
  expect_error([] { quant::info(DType::BF16); }, {"bf16", "not a quantized type"});
}

// The whole-tensor path (rows in parallel) gives the bytes the row functions give, from f32, from
// bf16 (its values exactly), and from a generated tensor (the values materialize() would hold).
TEST(Quant, QuantizeMatrixMatchesRowByRow) {
  const Tensor f32 = random_matrix(37, 512, 1);
  for (const quant::TypeInfo& entry : quant::all_types()) {
    const Tensor q = quant::quantize(f32, entry.type);
    ASSERT_EQ(q.dtype, entry.type);
    ASSERT_EQ(q.shape, f32.shape);
    const size_t row_bytes = dtype_row_bytes(entry.type, 512);
    std::vector<uint8_t> row(row_bytes);
    for (int64_t r = 0; r < 37; ++r) {
      quant::quantize_row(entry.type, f32.as<float>() + r * 512, row.data(), 512);
      ASSERT_EQ(std::memcmp(row.data(), q.as<uint8_t>() + r * row_bytes, row_bytes), 0)
          << dtype_name(entry.type) << " row " << r;
    }
    const Tensor back = quant::dequantize(q);
    ASSERT_EQ(back.dtype, DType::F32);
    ASSERT_EQ(back.shape, f32.shape);
  }
  const Tensor bf16 = to_dtype(f32, DType::BF16);
  const Tensor from_bf16 = quant::quantize(bf16, DType::Q4_K);
  const Tensor via_f32 = quant::quantize(to_dtype(bf16, DType::F32), DType::Q4_K);
  EXPECT_EQ(std::memcmp(from_bf16.data, via_f32.data, via_f32.nbytes()), 0);

  const Tensor generated = Tensor::generated_normal(DType::F16, {8, 256}, {42, 0.02f});
  const Tensor from_generated = quant::quantize(generated, DType::Q8_B64);
  const Tensor via_materialized = quant::quantize(materialize(generated), DType::Q8_B64);
  EXPECT_EQ(std::memcmp(from_generated.data, via_materialized.data, via_materialized.nbytes()), 0);

  // A quantized source is dequantized first (requantizing a GGUF into another type).
  const Tensor q6 = quant::quantize(f32, DType::Q6_K);
  const Tensor requantized = quant::quantize(q6, DType::Q8_0);
  const Tensor expected = quant::quantize(quant::dequantize(q6), DType::Q8_0);
  EXPECT_EQ(std::memcmp(requantized.data, expected.data, expected.nbytes()), 0);
}

// A Mixed matrix (a fused QKV whose v rows are Q6_K) dequantizes run by run.
TEST(Quant, DequantizeMixedRowRuns) {
  const Tensor qk = random_matrix(6, 256, 2), v = random_matrix(3, 256, 3);
  const Tensor qk_q = quant::quantize(qk, DType::Q4_K), v_q = quant::quantize(v, DType::Q6_K);
  Tensor mixed = Tensor::zeros(DType::U8, {static_cast<int64_t>(qk_q.nbytes() + v_q.nbytes())});
  std::memcpy(mixed.data, qk_q.data, qk_q.nbytes());
  std::memcpy(mixed.as<uint8_t>() + qk_q.nbytes(), v_q.data, v_q.nbytes());
  mixed.dtype = DType::Mixed;
  mixed.shape = {9, 256};
  mixed.row_runs = std::make_shared<const std::vector<RowRun>>(std::vector<RowRun>{{DType::Q4_K, 6}, {DType::Q6_K, 3}});
  const Tensor out = quant::dequantize(mixed);
  const Tensor qk_back = quant::dequantize(qk_q), v_back = quant::dequantize(v_q);
  ASSERT_EQ(out.shape, (Shape{9, 256}));
  EXPECT_EQ(std::memcmp(out.as<float>(), qk_back.data, qk_back.nbytes()), 0);
  EXPECT_EQ(std::memcmp(out.as<float>() + 6 * 256, v_back.data, v_back.nbytes()), 0);
  quant::validate(mixed, "blk.0.attn_qkv.weight");
  const Tensor requantized = quant::quantize(mixed, DType::Q8_0);  // through its f32 values
  const Tensor expected = quant::quantize(out, DType::Q8_0);
  EXPECT_EQ(std::memcmp(requantized.data, expected.data, expected.nbytes()), 0);

  // A NaN d in the Q6_K run: the message counts rows over the whole matrix.
  set_f16(mixed, qk_q.nbytes() + dtype_row_bytes(DType::Q6_K, 256) + 208, 0x7e00);
  expect_error([&] { quant::validate(mixed, "blk.0.attn_qkv.weight"); },
               {"blk.0.attn_qkv.weight", "q6_k", "row 7", "block 0", "d is nan"});
}

TEST(Quant, DequantizePlainTensorsConverts) {
  const Tensor f32 = random_matrix(2, 16, 4);
  const Tensor back = quant::dequantize(to_dtype(f32, DType::F16));
  ASSERT_EQ(back.dtype, DType::F32);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(back.as<float>()[i], f32.as<float>()[i], 1e-3);
}

// ---- bad input ---------------------------------------------------------------------------------

TEST(Quant, RowLengthNotAMultipleOfTheBlock) {
  std::vector<float> x(100, 1.0f);
  std::vector<uint8_t> bytes(1024);
  expect_error([&] { quant::quantize_row(DType::Q4_K, x.data(), bytes.data(), 100); }, {"100", "q4_k", "256"});
  expect_error([&] { quant::dequantize_row(DType::Q3H_B64, bytes.data(), x.data(), 100); }, {"100", "q3h_b64"});
  expect_error([&] { quant::quantize(random_matrix(2, 100, 5), DType::Q4_0); }, {"q4_0", "[2, 100]", "32"});
  expect_error([&] { quant::quantize(random_matrix(2, 64, 5), DType::F8_G128); }, {"f8_g128", "[2, 64]", "128"});
  expect_error([&] { quant::quantize(random_matrix(2, 64, 5), DType::F32); }, {"f32", "not a quantized type"});
}

TEST(Quant, NonFiniteWeightsAreRejectedNamingTheRow) {
  Tensor m = random_matrix(4, 64, 6);
  m.as<float>()[2 * 64 + 5] = std::numeric_limits<float>::infinity();
  expect_error([&] { quant::quantize(m, DType::Q4_B64); }, {"row 2", "[4, 64]", "element 5", "inf"});
  m.as<float>()[2 * 64 + 5] = std::nanf("");
  expect_error([&] { quant::quantize(m, DType::Q8_0); }, {"row 2", "nan"});
}

TEST(Quant, ValuesBeyondFp16AreRejectedForInferflow) {
  Tensor m = random_matrix(1, 32, 7);
  m.as<float>()[3] = 1e6f;
  expect_error([&] { quant::quantize(m, DType::Q4_B32); }, {"q4_b32", "fp16", "row 0"});
}

// NaN / Inf scales in packed data: validate names the tensor, type, row, block and field.
TEST(Quant, ValidateFindsNonFiniteScales) {
  const Tensor f32 = random_matrix(4, 256, 8);
  struct Case {
    DType type;
    size_t field_offset;  // within a block
    const char* field;
  };
  for (const Case c : {Case{DType::Q4_0, 0, "d"}, Case{DType::Q4_1, 2, "m"}, Case{DType::Q2_K, 82, "dmin"},
                       Case{DType::Q3_K, 108, "d"}, Case{DType::Q5_K, 0, "d"}, Case{DType::Q6_K, 208, "d"},
                       Case{DType::Q5_B32, 0, "min"}, Case{DType::Q3H_B64, 2, "scale"}}) {
    Tensor q = quant::quantize(f32, c.type);
    quant::validate(q, "clean");
    const int64_t block = 256 / dtype_block_elems(c.type) - 1;  // the row's last block
    const size_t block_bytes = dtype_row_bytes(c.type, 256) / (256 / dtype_block_elems(c.type));
    set_f16(q, 2 * dtype_row_bytes(c.type, 256) + block * block_bytes + c.field_offset, 0x7c00);  // +inf
    expect_error([&] { quant::validate(q, "layers.3.mlp.up_proj.weight"); },
                 {"layers.3.mlp.up_proj.weight", std::string(dtype_name(c.type)), "row 2",
                  "block " + std::to_string(block), std::string("its ") + c.field + " is inf"});
  }
  Tensor fp8 = quant::quantize(f32, DType::F8_G128);
  const float nan = std::nanf("");
  std::memcpy(fp8.as<uint8_t>() + dtype_row_bytes(DType::F8_G128, 256) + 4, &nan, 4);  // row 1, group 1
  expect_error([&] { quant::validate(fp8, "w"); }, {"f8_g128", "row 1", "block 1", "scale is nan"});
}

TEST(Quant, TruncatedDataIsRejected) {
  const Tensor q = quant::quantize(random_matrix(3, 256, 9), DType::Q5_K);
  quant::check_packed_bytes(q, q.nbytes(), "blk.1.ffn_down.weight");
  expect_error([&] { quant::check_packed_bytes(q, q.nbytes() - 1, "blk.1.ffn_down.weight"); },
               {"blk.1.ffn_down.weight", "q5_k", "[3, 256]", "528", "527", "truncated"});
}
