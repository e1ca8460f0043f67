// Truncations and random byte flips of the real checkpoints: every reader must either open the file
// or throw splitflow::Error naming it; never crash, read out of bounds (run under ASan) or hang.
#include "formats/weight_source.h"
#include "format_test_util.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

namespace splitflow {
namespace {

using namespace test;

// Touches every byte of every tensor, so a view past the mapping shows up under ASan.
uint64_t checksum(const WeightSource& source) {
  uint64_t sum = 0;
  for (const TensorInfo& info : source.tensors()) {
    const auto* bytes = static_cast<const uint8_t*>(info.tensor.data);
    for (size_t i = 0; i < info.tensor.nbytes(); ++i) sum += bytes[i];
  }
  return sum;
}

// Every length below 600 bytes, every 7th byte up to `header_bytes`, then 64 points over the rest.
std::vector<size_t> truncation_lengths(size_t file_bytes, size_t header_bytes) {
  std::vector<size_t> lengths;
  for (size_t length = 0; length < std::min<size_t>(600, file_bytes); ++length) lengths.push_back(length);
  for (size_t length = 600; length < std::min(header_bytes, file_bytes); length += 7) lengths.push_back(length);
  for (int step = 0; step < 64; ++step) lengths.push_back(header_bytes + (file_bytes - header_bytes) * step / 64);
  lengths.push_back(file_bytes - 1);
  std::sort(lengths.begin(), lengths.end(), std::greater<>());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  return lengths;
}

struct RealFile {
  const char* relative_path;
  const char* name;      // temp copy; the extension picks the reader in open_weights
  size_t header_bytes;   // bytes before the first tensor (from the gguf / safetensors Python packages)
};
const RealFile kRealFiles[] = {{"models/stories260K-hf/model.safetensors", "model.safetensors", 8 + 4856},
                               {"models/stories260K-gguf/stories260K.gguf", "model.gguf", 14176},
                               {"models/stories260K-gguf/stories260K-f16.gguf", "model-f16.gguf", 14240},
                               {"models/stories260K/stories260K.bin", "stories.bin", 28},
                               {"models/stories260K/stories260K_q80.bin", "q80.bin", 256},
                               {"models/aidreams260K/aidreams260K.bin", "aidreams.bin", 28}};

TEST(Corruption, EveryTruncationOfTheRealFilesIsAnError) {
  TempDir dir;
  for (const RealFile& real : kRealFiles) {
    SCOPED_TRACE(real.relative_path);
    const std::string original = read_bytes(shared_path(real.relative_path));
    const std::string path = dir.file(real.name);
    write_bytes(path, original);
    ASSERT_NO_THROW(open_weights(path));
    int rejected = 0;
    for (size_t length : truncation_lengths(original.size(), real.header_bytes)) {
      std::filesystem::resize_file(path, length);  // lengths descend, so each cut shortens the file
      try {
        open_weights(path);
        ADD_FAILURE() << "opened when truncated to " << length << " bytes";
      } catch (const Error& error) {
        ASSERT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
        ++rejected;
      }
    }
    EXPECT_GT(rejected, 600);
  }
}

// Flips 1-4 random bytes of the header region `flips` times; opening must succeed or throw Error.
// Flips inside token strings, values or (llama2.c v2) seq_len leave a valid file (`some_open`); any
// other llama2.c header change breaks the exact file-size match.
void flip_header_bytes(const char* relative_path, const char* name, size_t header_bytes, int flips, uint32_t seed,
                       bool some_open = true) {
  TempDir dir;
  const std::string original = read_bytes(shared_path(relative_path));
  const std::string path = dir.file(name);
  write_bytes(path, original);
  std::fstream file(path, std::ios::binary | std::ios::in | std::ios::out);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> position(0, header_bytes - 1);
  std::uniform_int_distribution<int> count(1, 4), mask(1, 255);
  int opened = 0, rejected = 0;
  for (int flip = 0; flip < flips; ++flip) {
    std::string header = original.substr(0, header_bytes);
    for (int i = count(rng); i > 0; --i) header[position(rng)] ^= static_cast<char>(mask(rng));
    file.seekp(0);
    file.write(header.data(), static_cast<std::streamsize>(header.size()));
    file.flush();
    ASSERT_TRUE(file.good());
    try {
      const auto source = open_weights(path);
      volatile uint64_t sink = checksum(*source);  // volatile: the reads must happen
      (void)sink;
      ++opened;
    } catch (const Error& error) {
      ASSERT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(opened > 0, some_open) << opened << " of " << flips << " opened";
}

TEST(Corruption, RandomGgufHeaderFlips) {
  flip_header_bytes("models/stories260K-gguf/stories260K-f16.gguf", "model.gguf", 14240, 3000, 1234);
}

TEST(Corruption, RandomSafetensorsHeaderFlips) {
  flip_header_bytes("models/stories260K-hf/model.safetensors", "model.safetensors", 8 + 4856, 3000, 5678);
}

TEST(Corruption, RandomLlama2cHeaderFlips) {
  flip_header_bytes("models/stories260K/stories260K.bin", "stories.bin", 28, 500, 91011, false);
  flip_header_bytes("models/stories260K/stories260K_q80.bin", "q80.bin", 41, 500, 121314);
}

}  // namespace
}  // namespace splitflow
