// tests/seq2seq/encdec_fixtures.h — the tiny encoder-decoder checkpoints of tests/fixtures/encdec
// (python/make_encdec_fixtures.py) loaded as `splitflow generate` loads them, and an Engine over
// one of them, for the seq2seq and server tests.
#pragma once

#include "backend/backend.h"
#include "core/mapped_file.h"
#include "engine/engine.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "model/weights.h"
#include "seq2seq/seq2seq_generator.h"
#include "seq2seq/seq2seq_runner.h"
#include "test_paths.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace splitflow::test {

inline std::vector<std::string> encdec_fixture_names() {
  const nlohmann::json index = nlohmann::json::parse(read_text_file(fixture_path("encdec/index.json")));
  return index["fixtures"].get<std::vector<std::string>>();
}

inline std::vector<int32_t> expected_ids(const WeightSource& expected, const std::string& name) {
  const TensorInfo* info = expected.find(name);
  SF_CHECK(info != nullptr, "expected.safetensors: no tensor {}", name);
  const int32_t* data = info->tensor.as<int32_t>();
  return {data, data + info->tensor.numel()};
}

struct EncDecModel {
  ModelSpec spec;
  ModelWeights weights;
  std::unique_ptr<WeightSource> expected;  // transformers' outputs (expected.safetensors)
  nlohmann::json meta;
};

// Spec from config.json through the model's template, weights bound in f32.
inline EncDecModel load_encdec(const std::string& name) {
  const std::string dir = fixture_path("encdec/" + name);
  std::unique_ptr<WeightSource> source = open_weights(dir);
  EncDecModel out;
  out.spec = resolve_source_spec(*source, dir);
  out.weights = bind_weights(out.spec, *source, DType::F32);
  out.expected = open_safetensors(dir + "/expected.safetensors");
  out.meta = nlohmann::json::parse(read_text_file(dir + "/meta.json"));
  return out;
}

struct EncDecEngineConfig {
  int32_t num_blocks = 64;
  int32_t block_size = 4;
  int32_t max_seqs = 8;
  int32_t max_batch_tokens = 64;
  int32_t max_model_len = 32;
  int32_t num_host_blocks = 0;
  int32_t swap_min_tokens = 256;
  bool splitfuse = true;
};

// The continuous-batching Engine over a fixture's Seq2SeqRunner (no tokenizer: ids in, ids out).
struct EncDecEngine {
  explicit EncDecEngine(const std::string& name, EncDecEngineConfig config = {})
      : model(load_encdec(name)), backend(make_cpu_backend(1)) {
    runner = std::make_unique<Seq2SeqRunner>(
        model.spec, model.weights, *backend,
        KvCacheConfig{config.num_blocks, config.block_size, config.num_host_blocks},
        RunnerLimits{config.max_batch_tokens, config.max_seqs});
    SchedulerConfig scheduler;
    scheduler.max_batch_tokens = config.max_batch_tokens;
    scheduler.max_seqs = config.max_seqs;
    scheduler.max_model_len = config.max_model_len;
    scheduler.num_blocks = config.num_blocks;
    scheduler.block_size = config.block_size;
    scheduler.num_host_blocks = config.num_host_blocks;
    scheduler.swap_min_tokens = config.swap_min_tokens;
    scheduler.splitfuse = config.splitfuse;
    engine = std::make_unique<Engine>(*runner, nullptr, scheduler);
  }

  // One request alone through generate_seq2seq (itself checked against transformers), on a
  // runner of its own.
  GenerationResult reference(const std::vector<int32_t>& prompt_ids, const SamplingParams& params) const {
    Seq2SeqRunner alone(model.spec, model.weights, *backend, KvCacheConfig{64, 4}, RunnerLimits{64, 1});
    return generate_seq2seq(alone, nullptr, prompt_ids, params);
  }

  EncDecModel model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Seq2SeqRunner> runner;
  std::unique_ptr<Engine> engine;
};

}  // namespace splitflow::test
