#include "formats/weight_source.h"
#include "format_test_util.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace splitflow {
namespace {

using namespace test;

TEST(OpenWeights, PicksTheReaderFromThePath) {
  EXPECT_EQ(open_weights(shared_path("models/stories260K-hf"))->format(), "safetensors");
  EXPECT_EQ(open_weights(shared_path("models/stories260K-hf/model.safetensors"))->format(), "safetensors");
  EXPECT_EQ(open_weights(shared_path("models/stories260K-gguf/stories260K.gguf"))->format(), "gguf");
  EXPECT_EQ(open_weights(shared_path("models/stories260K/stories260K.bin"))->format(), "llama2c");
  EXPECT_EQ(open_weights(shared_path("models/stories260K/stories260K_q80.bin"))->format(), "llama2c");
}

TEST(OpenWeights, RecognisesGgufByMagicWhateverTheExtension) {
  TempDir dir;
  const std::string path = dir.file("model.bin");
  std::filesystem::copy_file(shared_path("models/stories260K-gguf/stories260K-f16.gguf"), path);
  EXPECT_EQ(open_weights(path)->format(), "gguf");
}

TEST(OpenWeights, MissingFilesAndEmptyDirectories) {
  TempDir dir;
  expect_error([&] { open_weights(dir.path()); }, {dir.path().string(), "model.safetensors", "model.safetensors.index.json"});
  const std::string absent = dir.file("absent.bin");
  expect_error([&] { open_weights(absent); }, {absent, "cannot open"});
  expect_error([&] { open_weights(dir.file("absent.gguf")); }, {"absent.gguf", "cannot open"});
}

}  // namespace
}  // namespace splitflow
