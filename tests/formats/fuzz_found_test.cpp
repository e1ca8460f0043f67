// Inputs the libFuzzer harnesses found (fuzz/crashes/<harness>/, docs/fuzzing.md), rebuilt here as
// the smallest file that shows each bug: every one must end in a splitflow::Error naming the file
// and the problem. The reproducers themselves are replayed by the ctest tests fuzz_<harness>.
#include "formats/weight_source.h"
#include "format_test_util.h"
#include "gguf_builder.h"

#include <gtest/gtest.h>

namespace splitflow {
namespace {

using namespace test;

// fuzz/crashes/gguf/zero_extent_hides_element_count_overflow.gguf: a tensor of ne [0, 2^40, 2^40]
// holds no elements, but Tensor's shape_numel multiplies outermost first and overflowed int64_t
// before reaching the zero (UBSan: signed integer overflow in shape_numel).
TEST(FuzzFound, GgufZeroExtentDoesNotHideAnElementCountOverflow) {
  TempDir dir;
  GgufBuilder gguf;
  gguf.info("empty", {0, uint64_t(1) << 40, uint64_t(1) << 40}, kGgmlF32, 0);
  write_bytes(dir.file("zero.gguf"), gguf.bytes());
  expect_error([&] { open_gguf(dir.file("zero.gguf")); }, {"zero.gguf", "'empty'", "overflow"});
}

TEST(FuzzFound, SafetensorsZeroExtentDoesNotHideAnElementCountOverflow) {
  TempDir dir;
  const std::string header = R"({"empty": {"dtype": "F32", "shape": [1099511627776, 1099511627776, 0], "data_offsets": [0, 0]}})";
  ByteWriter file;
  file.put<uint64_t>(header.size()).raw(header);
  write_bytes(dir.file("zero.safetensors"), file.bytes);
  expect_error([&] { open_safetensors(dir.file("zero.safetensors")); }, {"zero.safetensors", "'empty'", "overflow"});
}

// Empty tensors whose other extents multiply within int64_t stay valid.
TEST(FuzzFound, EmptyTensorsWithinRangeStillOpen) {
  TempDir dir;
  GgufBuilder gguf;
  gguf.info("empty", {0, 1024, 1024}, kGgmlF32, 0);
  write_bytes(dir.file("empty.gguf"), gguf.bytes());
  const auto source = open_gguf(dir.file("empty.gguf"));
  ASSERT_EQ(source->tensors().size(), 1u);
  EXPECT_EQ(source->tensors()[0].tensor.numel(), 0);
}

// GGUF strings are raw bytes; naming a bad value in a message used json::dump, which throws
// nlohmann's type_error (not a splitflow::Error) on invalid UTF-8: an abort in the harness
// (fuzz/crashes/gguf/block_count_string_not_utf8.gguf, alignment_string_not_utf8.gguf).
TEST(FuzzFound, GgufBadValuesThatAreNotUtf8AreNamedNotThrown) {
  TempDir dir;
  GgufBuilder counts;
  counts.key("general.architecture", kGgufString).str("llama");
  counts.key("llama.block_count", kGgufString).str("\xff");
  write_bytes(dir.file("counts.gguf"), counts.bytes());
  expect_error([&] { open_gguf(dir.file("counts.gguf")); },
               {"counts.gguf", "llama.block_count is \"\xef\xbf\xbd\", expected a non-negative integer"});
  GgufBuilder alignment;
  alignment.key("general.alignment", kGgufString).str("\xff");
  write_bytes(dir.file("alignment.gguf"), alignment.bytes());
  expect_error([&] { open_gguf(dir.file("alignment.gguf")); },
               {"alignment.gguf", "general.alignment is not an unsigned integer"});
}

}  // namespace
}  // namespace splitflow
