// tests/server/server_test_util.h — the stories260K-hf model on the CPU backend behind an Engine,
// for the AsyncEngine and HTTP server tests.
#pragma once

#include "backend/backend.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "engine/model_loader.h"
#include "test_paths.h"

#include <memory>
#include <string>

namespace splitflow::test {

struct StoriesEngine {
  explicit StoriesEngine(int32_t num_blocks = 64, int32_t max_seqs = 8, int32_t max_batch_tokens = 64,
                         int32_t max_model_len = 512, int32_t num_host_blocks = 0, int32_t swap_min_tokens = 256) {
    ModelLoadOptions options;
    options.model_path = shared_path("models/stories260K-hf");
    LoadedModel model = load_model(options);
    tokenizer = std::move(model.tokenizer);
    backend = make_cpu_backend(1);
    runner = std::make_unique<ModelRunner>(model.spec, std::move(model.weights), *backend,
                                           KvCacheConfig{num_blocks, 16, num_host_blocks},
                                           RunnerLimits{max_batch_tokens, max_seqs});
    SchedulerConfig config;
    config.max_batch_tokens = max_batch_tokens;
    config.max_seqs = max_seqs;
    config.num_blocks = num_blocks;
    config.block_size = 16;
    config.num_host_blocks = num_host_blocks;
    config.swap_min_tokens = swap_min_tokens;
    config.max_model_len = max_model_len;
    engine = std::make_unique<Engine>(*runner, tokenizer.get(), config);
  }

  // The single-request Generator's greedy output for a prompt, on a runner of its own.
  GenerationResult reference(const std::vector<int32_t>& prompt_ids, int32_t max_tokens) const {
    ModelLoadOptions options;
    options.model_path = shared_path("models/stories260K-hf");
    LoadedModel model = load_model(options);
    ModelRunner reference_runner(model.spec, std::move(model.weights), *backend, KvCacheConfig{64, 16},
                                 RunnerLimits{64, 1});
    SamplingParams params;
    params.temperature = 0;
    params.max_tokens = max_tokens;
    return Generator(reference_runner, tokenizer.get()).generate(prompt_ids, params);
  }

  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<Engine> engine;
};

}  // namespace splitflow::test
