#include "core/error.h"
#include "formats/weight_source.h"
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace splitflow {
namespace {

namespace fs = std::filesystem;

bool is_gguf_file(const fs::path& path) {
  if (path.extension() == ".gguf") return true;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

std::unique_ptr<Tokenizer> load_from_gguf(const fs::path& path) {
  const auto source = open_gguf(path.string());
  SF_CHECK(source->metadata().contains("tokenizer.ggml.model"),
           "'{}' has no embedded vocabulary (no tokenizer.ggml.model key); pass --tokenizer PATH", path.string());
  try {
    return load_gguf_tokenizer(source->metadata());
  } catch (const Error& error) {
    fail("'{}': {}", path.string(), error.what());
  }
}

// tokenizer.bin, else the single tok*.bin (llama2.c's tok512.bin style) in `directory`.
fs::path find_llama2c_tokenizer(const fs::path& directory, const fs::path& model) {
  if (fs::exists(directory / "tokenizer.bin")) return directory / "tokenizer.bin";
  std::vector<fs::path> candidates;
  for (const auto& entry : fs::directory_iterator(directory)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name.starts_with("tok") && name.ends_with(".bin")) candidates.push_back(entry.path());
  }
  SF_CHECK(!candidates.empty(), "no tokenizer.bin or tok*.bin next to the llama2.c checkpoint '{}'; pass --tokenizer PATH",
           model.string());
  std::sort(candidates.begin(), candidates.end());
  SF_CHECK(candidates.size() == 1, "several tokenizers next to '{}' ({}, {}, ...); pass --tokenizer PATH to pick one",
           model.string(), candidates[0].filename().string(), candidates[1].filename().string());
  return candidates[0];
}

int32_t llama2c_vocab_size(const fs::path& checkpoint) {
  const auto source = open_llama2c(checkpoint.string());
  const auto& metadata = source->metadata();
  SF_CHECK(metadata.contains("vocab_size"), "'{}': the llama2.c header gives no vocab_size", checkpoint.string());
  return std::abs(metadata["vocab_size"].get<int32_t>());
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer_for_model(const std::string& model_path,
                                                    const std::string& tokenizer_path_override) {
  const fs::path model(model_path);
  if (!tokenizer_path_override.empty()) {
    const fs::path tokenizer(tokenizer_path_override);
    SF_CHECK(fs::exists(tokenizer), "tokenizer path '{}' does not exist", tokenizer.string());
    if (fs::is_directory(tokenizer)) {
      SF_CHECK(fs::exists(tokenizer / "tokenizer.json"), "tokenizer directory '{}' has no tokenizer.json",
               tokenizer.string());
      return load_hf_tokenizer((tokenizer / "tokenizer.json").string());
    }
    if (tokenizer.extension() == ".json") return load_hf_tokenizer(tokenizer.string());
    if (is_gguf_file(tokenizer)) return load_from_gguf(tokenizer);
    // A llama2.c tokenizer: the vocab size comes from the model when it is a llama2.c checkpoint.
    const bool llama2c_model = fs::is_regular_file(model) && !is_gguf_file(model) && model.extension() != ".safetensors";
    return load_llama2c_tokenizer(tokenizer.string(), llama2c_model ? llama2c_vocab_size(model) : 0);
  }
  SF_CHECK(fs::exists(model), "model path '{}' does not exist", model_path);
  if (fs::is_directory(model)) {
    SF_CHECK(fs::exists(model / "tokenizer.json"),
             "model directory '{}' has no tokenizer.json; pass --tokenizer PATH", model_path);
    return load_hf_tokenizer((model / "tokenizer.json").string());
  }
  if (is_gguf_file(model)) return load_from_gguf(model);
  SF_CHECK(model.extension() != ".safetensors" && model.extension() != ".json",
           "'{}' carries no tokenizer; pass the model directory or --tokenizer PATH", model_path);
  const int32_t vocab_size = llama2c_vocab_size(model);
  const fs::path directory = model.has_parent_path() ? model.parent_path() : fs::path(".");
  return load_llama2c_tokenizer(find_llama2c_tokenizer(directory, model).string(), vocab_size);
}

}  // namespace splitflow
