// The argument checks the backends share (backend/argument_checks.h): each bad argument is
// rejected with a message naming the backend, the kernel and what is wrong; valid ones pass.
#include "backend/argument_checks.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

using namespace splitflow;

namespace {

// Shapes only: the checks never read the memory.
DeviceTensor tensor(DType dtype, Shape shape) {
  static float memory[1];
  return DeviceTensor{memory, dtype, std::move(shape)};
}

constexpr DType kCpuCaches[] = {DType::F32, DType::F8E4M3};
constexpr DType kCudaCaches[] = {DType::BF16, DType::F8E4M3};

void expect_rejected(const std::function<void()>& check, const std::string& expected) {
  try {
    check();
    ADD_FAILURE() << "accepted; expected an error containing: " << expected;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
  }
}

// heads 4, kv heads 2, head_dim 8, blocks of 16: qkv width (4 + 2 * 2) * 8 = 64.
struct Attention {
  AttentionParams params{4, 2, 8, 16, 0.35f, 0};
  DeviceTensor qkv = tensor(DType::F32, {5, 64}), out = tensor(DType::F32, {5, 32});
  DeviceTensor k_cache = tensor(DType::F32, {10, 16, 2, 8}), v_cache = tensor(DType::F32, {10, 16, 2, 8});
  AttentionBatch batch{tensor(DType::I32, {3}), tensor(DType::I32, {2}), tensor(DType::I32, {2, 4}), 4, 20};
  int64_t check() const {
    return check_attention_args("cpu", DType::F32, kCpuCaches, qkv, k_cache, v_cache, batch, params, out);
  }
};

TEST(ArgumentChecks, AttentionAcceptsAValidBatch) {
  Attention a;
  EXPECT_EQ(a.check(), 2);
  a.k_cache = a.v_cache = tensor(DType::F8E4M3, {10, 16, 2, 8});  // any of the backend's cache dtypes
  EXPECT_EQ(a.check(), 2);
}

TEST(ArgumentChecks, AttentionRejectsEachBadArgument) {
  Attention a;
  a.params.num_heads = 3;
  expect_rejected([&] { a.check(); }, "cpu attention: heads 3, kv_heads 2");
  a = Attention{};
  a.qkv = tensor(DType::BF16, {5, 64});
  expect_rejected([&] { a.check(); }, "cpu attention: qkv has dtype bf16, expected f32");
  a = Attention{};
  a.qkv = tensor(DType::F32, {5, 48});
  expect_rejected([&] { a.check(); }, "cpu attention: qkv has shape [5, 48], expected [5, 64]");
  a = Attention{};
  a.v_cache = tensor(DType::F32, {10, 16, 2, 4});
  expect_rejected([&] { a.check(); }, "cpu attention: caches have shapes [10, 16, 2, 8] and [10, 16, 2, 4]");
  a = Attention{};
  a.k_cache = a.v_cache = tensor(DType::BF16, {10, 16, 2, 8});
  expect_rejected([&] { a.check(); }, "cpu attention: k_cache has dtype bf16, expected one of f32, f8_e4m3");
  a = Attention{};
  a.v_cache = tensor(DType::F8E4M3, {10, 16, 2, 8});
  expect_rejected([&] { a.check(); }, "cpu attention: v_cache has dtype f8_e4m3, expected f32");
  a = Attention{};
  a.batch.block_tables = tensor(DType::I32, {3, 4});
  expect_rejected([&] { a.check(); }, "disagree on the sequence count");
  a = Attention{};
  a.batch.context_lens = tensor(DType::F32, {2});
  expect_rejected([&] { a.check(); }, "cpu attention: batch index tensor has dtype f32, expected i32");
  a = Attention{};
  a.batch.max_query_len = 6;
  expect_rejected([&] { a.check(); }, "cpu attention: max_query_len 6 is outside [0, 5]");
  a = Attention{};
  a.batch.max_context_len = 3;
  expect_rejected([&] { a.check(); }, "cpu attention: max_context_len 3 is below max_query_len 4");
}

TEST(ArgumentChecks, RopeAndWriteKv) {
  const RopeParams rope{4, 2, 8, 8, RopeStyle::Half};
  const DeviceTensor qkv = tensor(DType::BF16, {5, 64}), rows = tensor(DType::I32, {5});
  check_rope_args("cuda", DType::BF16, qkv, tensor(DType::F32, {100, 2, 4}), rows, rope);
  expect_rejected([&] { check_rope_args("cuda", DType::BF16, qkv, tensor(DType::F32, {100, 2, 3}), rows, rope); },
                  "cuda rope: cos_sin has shape [100, 2, 3], expected [rows, 2, 4]");
  RopeParams odd = rope;
  odd.rotary_dim = 7;
  expect_rejected([&] { check_rope_args("cuda", DType::BF16, qkv, tensor(DType::F32, {100, 2, 3}), rows, odd); },
                  "cuda rope: rotary_dim 7 must be even");

  const AttentionParams params{4, 2, 8, 16, 1.0f, 0};
  const DeviceTensor cache = tensor(DType::BF16, {10, 16, 2, 8});
  check_write_kv_args("cuda", DType::BF16, kCudaCaches, qkv, rows, params, cache, cache);
  const DeviceTensor fp8_cache = tensor(DType::F8E4M3, {10, 16, 2, 8});
  check_write_kv_args("cuda", DType::BF16, kCudaCaches, qkv, rows, params, fp8_cache, fp8_cache);
  const DeviceTensor short_slots = tensor(DType::I32, {4}), f32_cache = tensor(DType::F32, {10, 16, 2, 8});
  expect_rejected(
      [&] { check_write_kv_args("cuda", DType::BF16, kCudaCaches, qkv, short_slots, params, cache, cache); },
      "cuda write_kv: slots has shape [4], expected [5]");
  expect_rejected([&] { check_write_kv_args("cuda", DType::BF16, kCudaCaches, qkv, rows, params, cache, f32_cache); },
                  "cuda write_kv: v_cache has dtype f32, expected bf16");
  const DeviceTensor f16_cache = tensor(DType::F16, {10, 16, 2, 8});
  expect_rejected(
      [&] { check_write_kv_args("cuda", DType::BF16, kCudaCaches, qkv, rows, params, f16_cache, f16_cache); },
      "cuda write_kv: k_cache has dtype f16, expected one of bf16, f8_e4m3");

  // Both at once: the two parameter sets must describe the same heads, then each set's checks.
  const DeviceTensor table = tensor(DType::F32, {100, 2, 4});
  check_rope_write_kv_args("cuda", "rope_write_kv", DType::BF16, kCudaCaches, qkv, table, rows, rope, rows, params,
                           cache, cache);
  AttentionParams other_heads = params;
  other_heads.num_kv_heads = 1;
  expect_rejected(
      [&] {
        check_rope_write_kv_args("cuda", "matmul_rope_write_kv", DType::BF16, kCudaCaches, qkv, table, rows, rope, rows,
                                 other_heads, cache, cache);
      },
      "cuda matmul_rope_write_kv: rope (4 heads, 2 kv heads, head_dim 8) and attention (4, 1, 8) disagree");
  expect_rejected(
      [&] {
        check_rope_write_kv_args("cuda", "rope_write_kv", DType::BF16, kCudaCaches, qkv, table, rows, rope,
                                 tensor(DType::I32, {4}), params, cache, cache);
      },
      "cuda write_kv: slots has shape [4], expected [5]");
}

}  // namespace
