// `splitflow perplexity`: llama.cpp's perplexity method (eval/perplexity.h) over a text file.
#include "backend/backend.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "engine/generator.h"
#include "eval/perplexity.h"
#include "runtime/model_runner.h"

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>

namespace splitflow::cli {

namespace {

struct PerplexityFlags {
  ModelFlags model;
  std::string file;
  int ctx = 512;
  int chunks = -1;
  int max_batch_tokens = 512;
  std::string kv_cache_dtype = "auto";
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SF_CHECK(in.good(), "--file '{}': cannot open it", path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void run_perplexity(const PerplexityFlags& flags) {
  SF_CHECK(flags.ctx >= 4, "--ctx must be at least 4, not {}", flags.ctx);
  SF_CHECK(flags.max_batch_tokens > 0, "--max-batch-tokens must be positive, not {}", flags.max_batch_tokens);
  const std::optional<DType> kv_cache_dtype = parse_kv_cache_dtype_flag(flags.kv_cache_dtype);
  const std::string text = read_text(flags.file);

  LoadedModel model = load_model(flags.model.options());
  SF_CHECK(model.tokenizer != nullptr, "perplexity needs the model's tokenizer (pass --tokenizer)");
  SF_CHECK(flags.ctx <= model.spec.max_position, "--ctx {} exceeds the model's context of {} tokens", flags.ctx,
           model.spec.max_position);
  // As llama.cpp: the whole text tokenized once with the tokenizer's special tokens (BOS where its
  // vocabulary adds one), and each chunk's first token then replaced by BOS.
  const std::vector<int32_t> tokens = model.tokenizer->encode(text, true);
  const int32_t bos = model.tokenizer->bos_id();
  const bool adds_bos = bos >= 0 && !tokens.empty() && tokens.front() == bos;

  std::unique_ptr<Backend> backend = flags.model.make_backend();
  const int32_t block_size = 16;
  KvCacheConfig kv{blocks_for_tokens(flags.ctx, block_size), block_size, 0, kv_cache_dtype};
  const int32_t batch_tokens = std::min(flags.max_batch_tokens, flags.ctx);
  ModelRunner runner(model.spec, std::move(model.weights), *backend, kv, RunnerLimits{batch_tokens, 1, false});
  std::vector<int32_t> block_table(static_cast<size_t>(kv.num_blocks));
  for (int32_t b = 0; b < kv.num_blocks; ++b) block_table[static_cast<size_t>(b)] = b;

  // One sequence per chunk from position 0 (the cache is overwritten), in forwards of at most
  // batch_tokens tokens, every position's logits kept.
  const auto chunk_logits = [&](std::span<const int32_t> chunk) {
    Tensor logits;
    for (size_t begin = 0; begin < chunk.size(); begin += static_cast<size_t>(batch_tokens)) {
      const size_t count = std::min(chunk.size() - begin, static_cast<size_t>(batch_tokens));
      ForwardBatch batch;
      batch.token_ids.assign(chunk.begin() + begin, chunk.begin() + begin + count);
      const auto blocks = static_cast<std::ptrdiff_t>((begin + count + block_size - 1) / block_size);
      batch.spans.push_back(SequenceSpan{static_cast<int32_t>(count), static_cast<int32_t>(begin),
                                         std::vector<int32_t>(block_table.begin(), block_table.begin() + blocks), true});
      batch.logits_mode = LogitsMode::All;
      Tensor part = runner.forward(batch);
      if (logits.empty()) logits = Tensor::zeros(DType::F32, {static_cast<int64_t>(chunk.size()), part.dim(1)});
      std::copy_n(part.as<float>(), part.numel(), logits.as<float>() + begin * part.dim(1));
    }
    return logits;
  };

  fmt::print(stderr, "[{}] {} tokens in '{}'; {} chunks of {}{}\n", model.description, tokens.size(), flags.file,
             flags.chunks >= 0 ? std::min<int64_t>(flags.chunks, tokens.size() / flags.ctx) : tokens.size() / flags.ctx,
             flags.ctx, adds_bos ? ", each starting with BOS" : "");
  const auto start = std::chrono::steady_clock::now();
  PerplexityOptions options{flags.ctx, flags.chunks, adds_bos ? bos : -1};
  const PerplexityResult result = perplexity(tokens, options, chunk_logits, [](const PerplexityChunk& chunk) {
    fmt::print(stderr, "[{}] {:.4f}\n", chunk.index + 1, chunk.running_ppl);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("PPL = {:.4f} +/- {:.5f} ({} chunks of {}, {} tokens scored; {:.1f} tokens/s over {:.1f} s)\n",
             result.ppl, result.ppl_stderr, result.chunks, flags.ctx, result.scored_tokens,
             result.evaluated_tokens / std::max(seconds, 1e-9), seconds);
}

}  // namespace

void register_perplexity(CLI::App& app) {
  auto flags = std::make_shared<PerplexityFlags>();
  auto* command = app.add_subcommand(
      "perplexity", "perplexity of a text file by llama.cpp's method (chunks of --ctx tokens, second halves scored)");
  add_model_flags(*command, flags->model);
  command->add_option("--file,-f", flags->file, "text file (e.g. wiki.test.raw)")->required();
  command->add_option("--ctx,-c", flags->ctx, "tokens per chunk (llama-perplexity -c)");
  command->add_option("--chunks", flags->chunks, "score at most this many chunks (-1: all)");
  command->add_option("--max-batch-tokens", flags->max_batch_tokens, "tokens per forward (a chunk may take several)");
  add_kv_cache_dtype_flag(*command, flags->kv_cache_dtype);
  command->callback([flags] { run_perplexity(*flags); });
}

}  // namespace splitflow::cli
