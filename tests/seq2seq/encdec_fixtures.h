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

#include <algorithm>
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

inline const Tensor& expected_tensor(const WeightSource& expected, const std::string& name) {
  const TensorInfo* info = expected.find(name);
  SF_CHECK(info != nullptr, "expected.safetensors: no tensor {}", name);
  return info->tensor;
}

// A fixture's prompts as transformers ran them: encoder ids, decoder ids (the start token, then the
// greedy tokens), the greedy tokens, and each sequence's block table covering both, blocks handed
// out from the top of the cache so tables are not the identity.
struct EncDecPrompts {
  std::vector<std::vector<int32_t>> encoder_ids, decoder_ids, greedy, tables;
  int size() const { return static_cast<int>(encoder_ids.size()); }
};

inline EncDecPrompts encdec_prompts(const EncDecModel& model, const KvCacheConfig& kv) {
  EncDecPrompts out;
  int32_t next = kv.num_blocks;
  for (int p = 0; p < model.meta["num_prompts"].get<int>(); ++p) {
    const std::string key = "prompt" + std::to_string(p);
    out.encoder_ids.push_back(expected_ids(*model.expected, key + ".encoder_tokens"));
    out.decoder_ids.push_back(expected_ids(*model.expected, key + ".decoder_tokens"));
    out.greedy.push_back(expected_ids(*model.expected, key + ".greedy"));
    const int64_t covered = std::max(out.encoder_ids[p].size(), out.decoder_ids[p].size());
    std::vector<int32_t>& table = out.tables.emplace_back();
    for (int64_t b = 0; b < (covered + kv.block_size - 1) / kv.block_size; ++b) table.push_back(--next);
  }
  return out;
}

// Every prompt through the runner's encoder in one batch (their cross K/V in their tables).
inline void encode_prompts(Seq2SeqRunner& runner, const EncDecPrompts& prompts) {
  ForwardBatch batch;
  for (int p = 0; p < prompts.size(); ++p) {
    batch.token_ids.insert(batch.token_ids.end(), prompts.encoder_ids[p].begin(), prompts.encoder_ids[p].end());
    batch.spans.push_back({static_cast<int32_t>(prompts.encoder_ids[p].size()), 0, prompts.tables[p], false});
  }
  runner.encode(batch);
}

// Teacher forcing: the decoder's logits for every decoder token of prompt p in one forward.
inline Tensor teacher_forced_logits(Seq2SeqRunner& runner, const EncDecPrompts& prompts, int p) {
  ForwardBatch batch;
  batch.token_ids = prompts.decoder_ids[p];
  SequenceSpan span{static_cast<int32_t>(prompts.decoder_ids[p].size()), 0, prompts.tables[p], true};
  span.encoder_tokens = static_cast<int32_t>(prompts.encoder_ids[p].size());
  batch.spans.push_back(span);
  batch.logits_mode = LogitsMode::All;
  return runner.decoder().forward(batch);
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
