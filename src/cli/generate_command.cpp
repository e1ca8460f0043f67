// `splitflow generate`: one prompt, streamed to stdout; speed to stderr.
#include "backend/backend.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "engine/generator.h"
#include "seq2seq/seq2seq_generator.h"

#include <fmt/format.h>

#include <cstdio>
#include <functional>
#include <limits>
#include <span>
#include <vector>
#include <memory>

namespace splitflow::cli {

namespace {

struct GenerateFlags {
  ModelFlags model;
  SamplingFlags sampling;
  std::string prompt;
  std::string prompt_ids;  // "1,2,3": for models without a tokenizer (dummy weights)
  bool no_special = false;
  int max_batch_tokens = 512;
  int ctx_size = 0;  // 0: the model's context
  int block_size = 16;
  std::string kv_cache_dtype = "auto";
  std::string logits_out;  // .npy of every sampled step's logits, [steps, vocab] float32
  bool no_warmup = false;
};

// A float32 [rows, cols] array as NumPy's .npy (format 1.0), for checks against a reference.
void write_npy(const std::string& path, const std::vector<float>& values, int64_t rows, int64_t cols) {
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, cols);
  header.append(63 - (10 + header.size()) % 64, ' ');  // magic + version + length + header + '\n': 64 bytes
  header += '\n';
  std::FILE* file = std::fopen(path.c_str(), "wb");
  SF_CHECK(file != nullptr, "--logits-out: cannot write '{}'", path);
  const uint16_t length = static_cast<uint16_t>(header.size());
  std::fwrite("\x93NUMPY\x01\x00", 1, 8, file);
  std::fwrite(&length, sizeof length, 1, file);
  std::fwrite(header.data(), 1, header.size(), file);
  std::fwrite(values.data(), sizeof(float), values.size(), file);
  SF_CHECK(std::fclose(file) == 0, "--logits-out: writing '{}' failed", path);
}

void run_generate(const GenerateFlags& flags) {
  SamplingParams params = flags.sampling.resolve();
  // llama.cpp's -n -1: until the context is full, settled once the prompt's length is known.
  const bool until_context_full = params.max_tokens == -1;
  if (until_context_full) params.max_tokens = 1;
  params.validate();
  SF_CHECK(flags.ctx_size >= 0, "--ctx-size must not be negative, not {}", flags.ctx_size);
  SF_CHECK(flags.prompt.empty() != flags.prompt_ids.empty(), "give exactly one of --prompt and --prompt-ids");
  SF_CHECK(flags.max_batch_tokens > 0, "--max-batch-tokens must be positive, not {}", flags.max_batch_tokens);
  SF_CHECK(flags.block_size > 0, "--block-size must be positive, not {}", flags.block_size);
  const std::optional<DType> kv_cache_dtype = parse_kv_cache_dtype_flag(flags.kv_cache_dtype);

  ParallelRank ranks = flags.model.join_ranks();
  std::unique_ptr<Backend> backend = flags.model.make_backend(&ranks);
  LoadedModel model = load_model(flags.model.options());
  ranks.partition(model);
  if (!ranks.leader()) return ranks.follow(model.spec, std::move(model.weights), *backend);
  std::vector<int32_t> prompt_ids;
  if (!flags.prompt_ids.empty()) {
    prompt_ids = parse_id_list(flags.prompt_ids, "--prompt-ids");
  } else {
    SF_CHECK(model.tokenizer != nullptr, "this model has no tokenizer: pass --tokenizer or --prompt-ids");
    prompt_ids = model.tokenizer->encode(flags.prompt, !flags.no_special);
  }
  // KV room for the whole request, capped by the context (dynamic NTK scaling exists to run past
  // max_position, so it is not capped). The generator reports a prompt that does not fit.
  int64_t context = flags.ctx_size > 0 ? flags.ctx_size : std::numeric_limits<int64_t>::max();
  if (model.spec.rope.scaling.type != RopeScalingType::DynamicNTK) context = std::min<int64_t>(context, model.spec.max_position);
  if (until_context_full) {
    SF_CHECK(context != std::numeric_limits<int64_t>::max(), "--max-tokens -1 needs --ctx-size with this model (its "
             "context is unbounded)");
    params.max_tokens = static_cast<int32_t>(std::max<int64_t>(1, context - static_cast<int64_t>(prompt_ids.size())));
  }
  const int64_t kv_tokens = std::min<int64_t>(static_cast<int64_t>(prompt_ids.size()) + params.max_tokens, context);

  std::vector<float> logits;
  const auto keep_logits = [&](std::span<const float> row) { logits.insert(logits.end(), row.begin(), row.end()); };
  const auto stream_text = [](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  const auto on_logits = flags.logits_out.empty() ? std::function<void(std::span<const float>)>() : keep_logits;
  GenerationResult result;
  if (model.spec.network == NetworkType::EncoderDecoder) {
    // The prompt is the encoder's input; the decoder's positions and the cross K/V share the
    // sequence's blocks, so the cache covers the longer of the two.
    const int64_t decoder_tokens = std::min<int64_t>(params.max_tokens + int64_t{1}, context);
    const int64_t seq_tokens = std::max<int64_t>(static_cast<int64_t>(prompt_ids.size()), decoder_tokens);
    KvCacheConfig kv{blocks_for_tokens(seq_tokens, flags.block_size), flags.block_size, 0, kv_cache_dtype};
    const int32_t batch_tokens = std::max<int32_t>(flags.max_batch_tokens, static_cast<int32_t>(prompt_ids.size()));
    Seq2SeqRunner runner(model.spec, std::move(model.weights), *backend, kv, RunnerLimits{batch_tokens, 1});
    result = generate_seq2seq(runner, model.tokenizer.get(), prompt_ids, params, stream_text, on_logits);
  } else {
    KvCacheConfig kv{blocks_for_tokens(kv_tokens, flags.block_size), flags.block_size, 0, kv_cache_dtype};
    RunnerLimits limits{flags.max_batch_tokens, 1};
    // -ngl N: the GPU/CPU split's stages (parallel/local_pipeline.h); else this rank's runner.
    std::unique_ptr<LocalPipeline> split;
    std::unique_ptr<ModelRunner> own;
    if (const std::optional<int> gpu_layers = flags.model.gpu_layer_split(model, *backend, kv, limits)) {
      split = flags.model.make_gpu_cpu_pipeline(model, *gpu_layers, kv, limits);
    } else {
      own = std::make_unique<ModelRunner>(model.spec, std::move(model.weights), *backend, kv, limits,
                                          ranks.runner_partition());
      ranks.lead(*own);
    }
    ModelRunner& runner = split ? split->leader() : *own;
    // The one-time costs (decode graphs recorded, the CPU's repacked weights) before the prompt, so
    // the reported prompt speed is the prompt's.
    if (!flags.no_warmup) runner.warm_up(false);
    Generator generator(runner, model.tokenizer.get());
    result = generator.generate(prompt_ids, params, stream_text, on_logits);
  }
  if (!flags.logits_out.empty())
    write_npy(flags.logits_out, logits, static_cast<int64_t>(result.output_ids.size()), model.spec.vocab_size);
  if (!model.tokenizer) {
    for (int32_t id : result.output_ids) fmt::print("{} ", id);
  }
  fmt::print("\n");
  const double decode_tps = result.decode_seconds > 0 ? (result.output_ids.size() - 1) / result.decode_seconds : 0.0;
  fmt::print(stderr, "[{}] prompt {} tokens in {:.3f} s ({:.1f} tok/s); generated {} tokens, decode {:.2f} tok/s; finish: {}\n",
             model.description, result.prompt_tokens, result.prefill_seconds,
             result.prompt_tokens / std::max(result.prefill_seconds, 1e-9), result.output_ids.size(), decode_tps,
             finish_reason_name(result.finish_reason));
}

}  // namespace

void register_generate(CLI::App& app) {
  auto flags = std::make_shared<GenerateFlags>();
  flags->sampling.params.temperature = 0.8f;
  auto* command = app.add_subcommand("generate", "continue a prompt, streaming the text to stdout");
  add_model_flags(*command, flags->model);
  add_sampling_flags(*command, flags->sampling);
  command->add_option("--prompt,-p", flags->prompt, "text to continue");
  command->add_option("--prompt-ids", flags->prompt_ids, "comma-separated token ids instead of --prompt");
  command->add_flag("--no-special", flags->no_special, "do not add BOS/EOS the tokenizer would add");
  command->add_flag("--no-warmup", flags->no_warmup,
                    "skip the warm-up before the prompt (decode graphs recorded, weights prepared during it instead)");
  command->add_option("--max-batch-tokens", flags->max_batch_tokens, "prefill chunk size in tokens");
  command->add_option("--ctx-size,-c", flags->ctx_size, "tokens of context, prompt and output (0: the model's)");
  command->add_option("--block-size", flags->block_size, "KV cache block size in tokens");
  add_kv_cache_dtype_flag(*command, flags->kv_cache_dtype);
  command->add_option("--logits-out", flags->logits_out,
                      "write each sampled step's logits to this .npy file ([steps, vocab] float32), for reference checks");
  command->callback([flags] { run_generate(*flags); });
}

}  // namespace splitflow::cli
