// Every quantized tensor of the real GGUF models (SmolLM2-135M Q4_1 + Q8_0, Gemma-3-270M Q4_K_M:
// Q4_K, Q5_0, Q6_K, Q8_0) dequantizes to exactly the float32 bits gguf.quants.dequantize gives:
// checksums by python/gen_quant_fixtures.py. Skips when the model cache (scripts/setup.sh) is absent.
#include "formats/weight_source.h"
#include "quant/quant.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

using namespace splitflow;

namespace {

std::string model_cache() {
  if (const char* env = std::getenv("SPLITFLOW_MODEL_CACHE")) return env;
  return test::fixture_path("../../.cache/models");
}

// The checksum python/gen_quant_fixtures.py's float_bits_checksum computes.
uint64_t float_bits_checksum(const float* values, int64_t count) {
  uint64_t total = 0;
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, values + i, sizeof bits);
    total += static_cast<uint64_t>(bits) * (static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + 1);
  }
  return total;
}

}  // namespace

TEST(RealGguf, DequantizationIsBitIdenticalToGgufPackage) {
  const auto expected = nlohmann::json::parse(test::read_file(test::fixture_path("quant/real_gguf_checksums.json")));
  int checked_files = 0;
  for (const auto& [file, tensors] : expected.items()) {
    const std::string path = model_cache() + "/" + file;
    if (!std::filesystem::exists(path)) continue;
    ++checked_files;
    const auto source = open_gguf(path);
    int checked = 0;
    for (const TensorInfo& info : source->tensors()) {
      if (!is_quantized(info.tensor.dtype)) continue;
      ASSERT_TRUE(tensors.contains(info.name)) << file << ": " << info.name;
      const auto& entry = tensors[info.name];
      EXPECT_EQ(dtype_name(info.tensor.dtype), entry["type"].get<std::string>()) << info.name;
      quant::validate(info.tensor, info.name);
      const Tensor values = quant::dequantize(info.tensor);
      ASSERT_EQ(values.numel(), entry["numel"].get<int64_t>()) << info.name;
      char hex[17];
      std::snprintf(hex, sizeof hex, "%016llx",
                    static_cast<unsigned long long>(float_bits_checksum(values.as<float>(), values.numel())));
      EXPECT_EQ(std::string(hex), entry["checksum"].get<std::string>()) << file << ": " << info.name;
      ++checked;
    }
    EXPECT_EQ(checked, static_cast<int>(tensors.size())) << file;
  }
  if (checked_files == 0) GTEST_SKIP() << "no real GGUF models in " << model_cache() << " (scripts/setup.sh installs them)";
}
