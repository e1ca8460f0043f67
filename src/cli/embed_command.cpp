// `splitflow embed`: embeddings of texts (or token ids) from an encoder-only model, batched
// through the embedding engine, printed as JSON (OpenAI's embeddings list) or as one line of
// numbers per input. --repeat times the batch for a throughput figure (stderr).
#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "embedding/embedding_engine.h"
#include "embedding/embedding_input.h"
#include "embedding/pooling.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace splitflow::cli {

namespace {

struct EmbedFlags {
  ModelFlags model;
  std::vector<std::string> texts;
  std::string file;                  // one text per line
  std::vector<std::string> ids;      // "101,2023,102" per input
  std::string format = "json";       // json | text
  int dimensions = 0;                // Matryoshka truncation (0: all)
  int max_batch_tokens = 8192;
  int max_seqs = 256;
  int block_size = 16;
  int repeat = 0;                    // > 0: time this many more passes over the inputs
};

void run_embed(const EmbedFlags& flags) {
  std::vector<std::string> texts = flags.texts;
  if (!flags.file.empty()) {
    std::ifstream in(flags.file);
    SF_CHECK(in.good(), "--file: cannot read '{}'", flags.file);
    for (std::string line; std::getline(in, line);) texts.push_back(line);
  }
  SF_CHECK(!texts.empty() || !flags.ids.empty(), "give the inputs: --text T ..., --file F or --ids 1,2,3 ...");
  SF_CHECK(flags.format == "json" || flags.format == "text", "--format must be json or text, not '{}'", flags.format);
  SF_CHECK(flags.repeat >= 0, "--repeat must not be negative, not {}", flags.repeat);
  SF_CHECK(flags.max_batch_tokens > 0 && flags.max_seqs > 0, "--max-batch-tokens and --max-seqs must be positive");

  std::unique_ptr<Backend> backend = flags.model.make_backend();
  LoadedModel model = load_model(flags.model.options());
  const ModelSpec& spec = model.spec;
  SF_CHECK(spec.network == NetworkType::EncoderOnly,
           "embed: {} is a generative (decoder_only) model; embeddings need an encoder_only model (a BERT-family "
           "checkpoint, or a spec with \"network\": \"encoder_only\")",
           model.description);
  SF_CHECK(flags.dimensions == 0 || spec.embedding.matryoshka,
           "--dimensions: this model was not trained for shorter embeddings (its spec's embedding.matryoshka is false)");

  // One step must hold the longest input the model takes.
  const int32_t model_limit = spec.embedding.max_tokens > 0 ? spec.embedding.max_tokens : spec.max_position;
  const EmbeddingEngineConfig config{std::max(flags.max_batch_tokens, model_limit), flags.max_seqs};
  const KvCacheConfig kv{embedding_cache_blocks(config, flags.block_size), flags.block_size};
  ModelRunner runner(spec, std::move(model.weights), *backend, kv, RunnerLimits{config.max_batch_tokens, config.max_seqs, false});
  EmbeddingEngine engine(runner, config);

  std::vector<std::vector<int32_t>> inputs;
  if (!texts.empty()) {
    SF_CHECK(model.tokenizer != nullptr, "this model has no tokenizer: give --ids");
    const SpecialFrame frame = special_frame(*model.tokenizer);
    for (const std::string& text : texts)
      inputs.push_back(encode_for_embedding(*model.tokenizer, frame, text, engine.max_input_tokens()));
  }
  for (const std::string& list : flags.ids) inputs.push_back(parse_id_list(list, "--ids"));

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<float>> embeddings = engine.embed(inputs);
  const double first_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (flags.dimensions > 0)
    for (auto& embedding : embeddings) embedding = truncate_dimensions(embedding, flags.dimensions);

  int64_t tokens = 0;
  for (const auto& ids : inputs) tokens += static_cast<int64_t>(ids.size());
  if (flags.format == "text") {
    for (const auto& embedding : embeddings) fmt::print("{}\n", fmt::join(embedding, " "));
  } else {
    nlohmann::json data = nlohmann::json::array();
    for (size_t i = 0; i < embeddings.size(); ++i)
      data.push_back({{"object", "embedding"}, {"index", i}, {"num_tokens", inputs[i].size()}, {"embedding", embeddings[i]}});
    const nlohmann::json out = {{"object", "list"}, {"model", model.description}, {"data", std::move(data)},
                                {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
    fmt::print("{}\n", out.dump());
  }
  double seconds = first_seconds;
  int passes = 1;
  if (flags.repeat > 0) {
    const auto timed = std::chrono::steady_clock::now();
    for (int r = 0; r < flags.repeat; ++r) engine.embed(inputs);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - timed).count();
    passes = flags.repeat;
  }
  fmt::print(stderr, "[{}] {} inputs, {} tokens x {} pass{}: {:.3f} s, {:.1f} inputs/s, {:.0f} tokens/s\n",
             model.description, inputs.size(), tokens, passes, passes == 1 ? "" : "es", seconds,
             static_cast<double>(inputs.size()) * passes / seconds, static_cast<double>(tokens) * passes / seconds);
}

}  // namespace

void register_embed(CLI::App& app) {
  auto flags = std::make_shared<EmbedFlags>();
  auto* command = app.add_subcommand("embed", "embeddings of texts from an encoder-only model (BERT family), as JSON");
  add_model_flags(*command, flags->model);
  command->add_option("--text", flags->texts, "a text to embed (repeatable)");
  command->add_option("--file", flags->file, "a file of texts to embed, one per line");
  command->add_option("--ids", flags->ids, "token ids of one input, comma-separated (repeatable)");
  command->add_option("--format", flags->format, "json (OpenAI's embeddings list) or text (one line of numbers per input)")
      ->capture_default_str();
  command->add_option("--dimensions", flags->dimensions,
                      "keep the first N dimensions, renormalized (Matryoshka models only)");
  command->add_option("--max-batch-tokens", flags->max_batch_tokens, "tokens of one forward")->capture_default_str();
  command->add_option("--max-seqs", flags->max_seqs, "inputs of one forward")->capture_default_str();
  command->add_option("--block-size", flags->block_size, "tokens per KV block")->capture_default_str();
  command->add_option("--repeat", flags->repeat, "time N more passes over the inputs (throughput on stderr)");
  command->callback([flags] { run_embed(*flags); });
}

}  // namespace splitflow::cli
