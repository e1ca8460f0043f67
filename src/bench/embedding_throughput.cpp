#include "bench/embedding_throughput.h"

#include "core/error.h"
#include "embedding/embedding_engine.h"
#include "embedding/embedding_input.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

namespace splitflow::bench {

double embedding_flops_per_input(const ModelSpec& spec, int64_t input_len) {
  const double hidden = spec.hidden_size, inter = spec.mlp.intermediate_size;
  const double q_dim = static_cast<double>(spec.attention.num_heads) * spec.attention.head_dim;
  const double kv_dim = static_cast<double>(spec.attention.num_kv_heads) * spec.attention.head_dim;
  const double matrices = hidden * (q_dim + 2 * kv_dim) + q_dim * hidden + hidden * inter * (spec.mlp.gated ? 2 : 1) +
                          inter * hidden;
  const double per_token_layer = 2 * matrices + 4.0 * static_cast<double>(input_len) * q_dim;
  return per_token_layer * spec.num_layers * static_cast<double>(input_len);
}

nlohmann::json run_embedding_throughput(LoadedModel model, Backend& backend, const EmbeddingBenchOptions& options,
                                        double gemm_tflops) {
  const ModelSpec spec = model.spec;
  SF_CHECK(spec.network == NetworkType::EncoderOnly,
           "bench embed: {} is not an encoder_only model (embeddings need a BERT-family checkpoint)", model.description);
  SF_CHECK(options.num_inputs >= 1 && options.repetitions >= 1 && options.max_seqs >= 1 && options.block_size >= 1,
           "bench embed: --num-inputs, --repetitions, --max-seqs and --block-size must be at least 1");
  SF_CHECK(options.input_len >= 1 && options.input_len <= options.max_batch_tokens,
           "bench embed: --input-len {} must be in [1, --max-batch-tokens {}] (an input runs in one step)",
           options.input_len, options.max_batch_tokens);
  const EmbeddingEngineConfig config{options.max_batch_tokens, options.max_seqs};
  const KvCacheConfig kv{embedding_cache_blocks(config, options.block_size), options.block_size};
  const auto setup_start = std::chrono::steady_clock::now();
  ModelRunner runner(spec, std::move(model.weights), backend, kv,
                     RunnerLimits{config.max_batch_tokens, config.max_seqs, false});
  EmbeddingEngine engine(runner, config);
  const double setup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count();
  SF_CHECK(options.input_len <= engine.max_input_tokens(),
           "bench embed: --input-len {} is past the {} tokens this model takes in one input", options.input_len,
           engine.max_input_tokens());

  // The tokenizer's frame around seeded ids from the vocabulary's upper part (no special tokens
  // there in BERT-family vocabularies; the cost does not depend on which ids they are).
  SpecialFrame frame;
  if (model.tokenizer != nullptr) frame = special_frame(*model.tokenizer);
  const int64_t framed = static_cast<int64_t>(frame.prefix.size() + frame.suffix.size());
  if (framed >= options.input_len) frame = {};
  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<int32_t> id(spec.vocab_size / 4, spec.vocab_size - 1);
  std::vector<std::vector<int32_t>> inputs(static_cast<size_t>(options.num_inputs));
  for (std::vector<int32_t>& ids : inputs) {
    ids = frame.prefix;
    while (static_cast<int64_t>(ids.size() + frame.suffix.size()) < options.input_len) ids.push_back(id(rng));
    ids.insert(ids.end(), frame.suffix.begin(), frame.suffix.end());
  }

  const auto warm_start = std::chrono::steady_clock::now();
  engine.embed(std::vector<std::vector<int32_t>>(inputs.begin(), inputs.begin() + std::min<size_t>(inputs.size(),
                                                                                                 options.max_seqs)));
  const double warm_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - warm_start).count();
  std::vector<double> seconds;
  for (int32_t r = 0; r < options.repetitions; ++r) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<std::vector<float>> embeddings = engine.embed(inputs);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    SF_CHECK(embeddings.size() == inputs.size(), "bench embed: {} embeddings for {} inputs", embeddings.size(),
             inputs.size());
  }
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  const double median_s = sorted[sorted.size() / 2];
  const double tokens = static_cast<double>(options.num_inputs) * options.input_len;
  const double flops = embedding_flops_per_input(spec, options.input_len) * options.num_inputs;
  nlohmann::json result = {{"num_inputs", options.num_inputs},
                           {"input_len", options.input_len},
                           {"max_batch_tokens", options.max_batch_tokens},
                           {"max_seqs", options.max_seqs},
                           {"inputs_per_step", std::min(options.max_seqs, options.max_batch_tokens / options.input_len)},
                           {"repetitions", options.repetitions},
                           {"pass_seconds", seconds},
                           {"median_pass_s", median_s},
                           {"tokens_per_s", tokens / median_s},
                           {"inputs_per_s", options.num_inputs / median_s},
                           {"flops_per_pass", flops},
                           {"achieved_tflops", flops / median_s / 1e12},
                           {"runner_setup_s", setup_s},
                           {"warm_up_s", warm_s},
                           {"embedding_size", engine.embedding_size()},
                           {"max_input_tokens", engine.max_input_tokens()}};
  if (gemm_tflops > 0) {
    result["gemm_tflops"] = gemm_tflops;
    result["fraction_of_gemm"] = flops / median_s / 1e12 / gemm_tflops;
  }
  return result;
}

}  // namespace splitflow::bench
