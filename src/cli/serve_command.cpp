// `splitflow serve`: the OpenAI-compatible HTTP server (server/http_server.h) over the
// continuous-batching engine. SIGINT / SIGTERM drain: new requests get 503, in-flight ones finish
// (at most --drain-timeout seconds), then the process exits. The engine warms up (decode graphs
// recorded, kernels loaded: Engine::warm_up) before the port opens, unless --no-warmup.
#include "chat/chat_template.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "embedding/embedding_engine.h"
#include "backend/cpu/host_memory.h"
#include "backend/upload_bytes.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "parallel/gpu_layer_fit.h"
#include "runtime/kv_cache_sizing.h"
#include "seq2seq/seq2seq_runner.h"
#include "server/async_embedder.h"
#include "server/async_engine.h"
#include "server/http_server.h"
#include "splitwise/kv_export.h"
#include "splitwise/kv_import.h"
#include "splitwise/tcp_kv_transport.h"
#include "splitwise/transfer_metrics.h"

#include <nlohmann/json.hpp>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <pthread.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <csignal>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>

namespace splitflow::cli {

namespace {

struct ServeFlags {
  ModelFlags model;
  std::string host = "127.0.0.1";
  int port = 8000;
  int max_batch_tokens = 2048;
  int max_seqs = 256;
  int max_model_len = 0;
  int num_blocks = 0;
  std::string kv_cache_gb;  // GiB, or "auto"
  std::optional<double> gpu_memory_utilization;
  double swap_space_gb = 4;
  int swap_min_tokens = SchedulerConfig{}.swap_min_tokens;
  int block_size = 16;
  std::string kv_cache_dtype = "auto";
  bool no_splitfuse = false;
  bool no_device_sampling = false;
  int32_t steps_in_flight = 0;  // EngineOptions::max_steps_in_flight; 0: the pipeline's stages
  bool no_warmup = false;
  std::string chat_template;
  std::string served_model_name;
  int max_queue = 1024;
  HttpServerConfig http;  // the front's threads, backlog, connection cap (host, port, name set below)
  double header_timeout_s = 15, body_timeout_s = 60, write_timeout_s = 60, request_timeout_s = 600;
  double max_body_mb = 32, max_body_in_flight_mb = 1024;
  double drain_timeout_s = 30;
  // Splitwise (docs/splitwise.md).
  std::string role = "mixed";
  std::string kv_host;  // default: --host
  int kv_port = 0;
  std::string kv_transfer = "layerwise";
  double kv_transfer_timeout_s = 30;
  int kv_debug_rows_delay_ms = 0;
};

// Without --num-blocks, --kv-cache-gb or --gpu-memory-utilization: on CUDA, what the GPU's memory
// leaves (--kv-cache-gb auto: the GPU serves this process alone, and the cache is what buys
// batch size); on the CPU, whose memory the rest of the machine shares, a size from the model
// (runtime/kv_cache_sizing.h, default_host_kv_cache).

std::string default_model_name(const ModelFlags& flags) {
  // A directory by its name, a file by its stem, a config.json by its directory.
  const std::string& path = flags.load.model_path.empty() ? flags.load.config_path : flags.load.model_path;
  std::filesystem::path name = std::filesystem::path(path).lexically_normal();
  if (!name.has_filename()) name = name.parent_path();
  if (std::filesystem::is_regular_file(name)) {
    return name.stem() == "config" ? name.parent_path().filename().string() : name.stem().string();
  }
  return name.filename().string();
}

void run_serve(const ServeFlags& flags) {
  SF_CHECK(flags.port >= 0 && flags.port <= 65535, "--port must be in [0, 65535], not {}", flags.port);
  SF_CHECK(flags.max_seqs > 0, "--max-seqs must be positive, not {}", flags.max_seqs);
  SF_CHECK(flags.max_batch_tokens >= flags.max_seqs,
           "--max-batch-tokens ({}) must be at least --max-seqs ({}) so every running sequence can decode",
           flags.max_batch_tokens, flags.max_seqs);
  SF_CHECK(flags.block_size > 0, "--block-size must be positive, not {}", flags.block_size);
  KvCacheSizeRequest kv_size = parse_kv_cache_size(flags.num_blocks, flags.kv_cache_gb, flags.gpu_memory_utilization);
  if (kv_size.mode == KvCacheSizeRequest::Mode::Default && flags.model.backend == "cuda")
    kv_size.mode = KvCacheSizeRequest::Mode::Memory;
  SF_CHECK(std::isfinite(flags.swap_space_gb) && flags.swap_space_gb >= 0, "--swap-space must not be negative, not {}",
           flags.swap_space_gb);
  SF_CHECK(flags.swap_min_tokens >= 1, "--swap-min-tokens must be at least 1, not {}", flags.swap_min_tokens);
  SF_CHECK(flags.max_queue >= 0, "--max-queue must not be negative, not {}", flags.max_queue);
  SF_CHECK(flags.max_model_len >= 0, "--max-model-len must not be negative, not {}", flags.max_model_len);
  SF_CHECK(flags.drain_timeout_s >= 0, "--drain-timeout must not be negative, not {}", flags.drain_timeout_s);
  const std::optional<DType> requested_kv_dtype = parse_kv_cache_dtype_flag(flags.kv_cache_dtype);
  SF_CHECK(flags.role == "prompt" || flags.role == "token" || flags.role == "mixed",
           "--role must be prompt, token or mixed, not '{}'", flags.role);
  const splitwise::TransferMode transfer_mode = splitwise::parse_transfer_mode(flags.kv_transfer);
  SF_CHECK(std::isfinite(flags.kv_transfer_timeout_s) && flags.kv_transfer_timeout_s > 0,
           "--kv-transfer-timeout must be positive, not {}", flags.kv_transfer_timeout_s);

  // Threads started from here on inherit the mask: only the waiter below receives these signals.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  ParallelRank ranks = flags.model.join_ranks();
  std::unique_ptr<Backend> backend = flags.model.make_backend(&ranks);
  LoadedModel model = load_model(flags.model.options());
  // -ngl with tensor or pipeline parallelism: every rank refuses a split alike (rank 0 splits below).
  if (ranks.size() > 1)
    flags.model.check_gpu_layers(model, *backend, flags.max_model_len > 0 ? flags.max_model_len : model.spec.max_position);
  ranks.partition(model);
  if (!ranks.leader()) {
    // Rank 0 serves HTTP and schedules; this rank makes its runner's calls until rank 0 stops.
    pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);
    return ranks.follow(model.spec, std::move(model.weights), *backend);
  }
  std::optional<ChatTemplate> chat_template;
  if (!flags.chat_template.empty()) {
    chat_template = ChatTemplate::from_file(flags.chat_template);
  } else if (!flags.model.load.model_path.empty()) {
    chat_template = ChatTemplate::find_for_model(flags.model.load.model_path);
  }

  const ModelSpec& spec = model.spec;
  const DType kv_cache_dtype = resolve_kv_cache_dtype(*backend, requested_kv_dtype);
  const int64_t kv_bytes_per_block = kv_cache_bytes_per_token(spec, kv_cache_dtype) * flags.block_size;
  int64_t max_model_len = flags.max_model_len > 0 ? flags.max_model_len : spec.max_position;
  const RunnerLimits limits{flags.max_batch_tokens, flags.max_seqs};
  // -ngl N / auto on a decoder-only model: the first layers on the CPU, the last ones on the GPU
  // (parallel/local_pipeline.h), auto sized for one sequence of max_model_len.
  std::optional<int> gpu_layers;
  if (spec.network == NetworkType::DecoderOnly && ranks.size() == 1) {
    gpu_layers = flags.model.gpu_layer_split(
        model, *backend, KvCacheConfig{blocks_for_tokens(max_model_len, flags.block_size), flags.block_size, 0, kv_cache_dtype},
        limits, KvCacheMemoryBudget{kv_size.memory_fraction});
  } else {
    flags.model.check_gpu_layers(model, *backend, max_model_len);
  }
  const bool sized_from_memory = kv_size.mode == KvCacheSizeRequest::Mode::Memory;
  int64_t num_blocks = 0;  // sized from memory: the runner picks
  std::string kv_size_reason;  // why the default size, for the log and the startup line
  switch (kv_size.mode) {
    case KvCacheSizeRequest::Mode::Blocks: num_blocks = kv_size.num_blocks; break;
    case KvCacheSizeRequest::Mode::Gib:
      num_blocks = static_cast<int64_t>(kv_size.gib * double(1 << 30) / static_cast<double>(kv_bytes_per_block));
      break;
    case KvCacheSizeRequest::Mode::Default: {
      const HostKvCacheDefault chosen =
          default_host_kv_cache(max_model_len, flags.max_seqs, kv_cache_bytes_per_token(spec, kv_cache_dtype),
                                flags.block_size, backend->memory_info().free_bytes);
      num_blocks = chosen.num_blocks;
      kv_size_reason = chosen.reason;
      spdlog::info("kv cache: {} blocks of {} tokens ({:.2f} GiB {}), the CPU default: {} (--num-blocks or "
                   "--kv-cache-gb override it)",
                   num_blocks, flags.block_size,
                   static_cast<double>(num_blocks * kv_bytes_per_block) / double(1 << 30), dtype_name(kv_cache_dtype),
                   kv_size_reason);
      break;
    }
    case KvCacheSizeRequest::Mode::Memory:
      if (gpu_layers) {  // the stages need one block count up front: the GPU's share and half the host's memory
        const GpuLayerFitRequest per_token =
            gpu_layer_fit_request(spec, model.weights, cuda_upload_bytes, 1, kv_cache_dtype, limits,
                                  backend->memory_info(), KvCacheMemoryBudget{kv_size.memory_fraction},
                                  flags.model.offload());
        const int64_t every_sequence =
            int64_t{blocks_for_tokens(max_model_len, flags.block_size)} * flags.max_seqs;
        num_blocks = split_kv_blocks(per_token, *gpu_layers, flags.block_size, cpu::read_host_memory().free_bytes / 2,
                                     every_sequence);
        spdlog::info("kv cache: {} blocks of {} tokens for the GPU/CPU split ({} of {} layers on the GPU; {} hold {} "
                     "sequences of {} tokens)",
                     num_blocks, flags.block_size, *gpu_layers, spec.num_layers, every_sequence, flags.max_seqs,
                     max_model_len);
      }
      break;
  }
  // An embedding model keeps no KV after a step: the cache is one step's worth, no swap space.
  const bool embedding_model = spec.network == NetworkType::EncoderOnly;
  const EmbeddingEngineConfig embedding_config{flags.max_batch_tokens, flags.max_seqs};
  if (embedding_model && kv_size.mode == KvCacheSizeRequest::Mode::Default)
    num_blocks = embedding_cache_blocks(embedding_config, flags.block_size);
  SF_CHECK((sized_from_memory && !gpu_layers) || (num_blocks > 0 && num_blocks <= INT32_MAX),
           "the KV cache would have {} blocks: give --num-blocks or --kv-cache-gb", num_blocks);
  const int64_t num_host_blocks = embedding_model ? 0 : std::min<int64_t>(
      static_cast<int64_t>(flags.swap_space_gb * double(1 << 30) / static_cast<double>(kv_bytes_per_block)), INT32_MAX);

  KvCacheConfig kv_config{static_cast<int32_t>(num_blocks), flags.block_size, static_cast<int32_t>(num_host_blocks),
                          kv_cache_dtype};
  // Sized from memory, the cache must hold one sequence of an explicit --max-model-len; without
  // one, a cache smaller than the model's context shortens the context, as a fixed size does.
  if (sized_from_memory && !gpu_layers)
    kv_config.memory_budget = KvCacheMemoryBudget{kv_size.memory_fraction, kDefaultKvReserveBytes, flags.max_model_len};
  // An encoder-decoder runs on one rank (parallel/ refuses it): its decoder is the engine's runner.
  std::optional<Seq2SeqRunner> seq2seq;
  std::optional<ModelRunner> own_runner;
  std::unique_ptr<LocalPipeline> gpu_cpu;  // -ngl: the engine drives stage 0's runner
  if (spec.network == NetworkType::EncoderDecoder) {
    seq2seq.emplace(spec, std::move(model.weights), *backend, kv_config, limits);
  } else if (gpu_layers) {
    gpu_cpu = flags.model.make_gpu_cpu_pipeline(model, *gpu_layers, kv_config, limits);
  } else {
    own_runner.emplace(spec, std::move(model.weights), *backend, kv_config, limits, ranks.runner_partition());
    ranks.lead(*own_runner);
  }
  ModelRunner& runner = seq2seq ? seq2seq->decoder() : gpu_cpu ? gpu_cpu->leader() : *own_runner;
  num_blocks = runner.kv_config().num_blocks;
  // A cache smaller than one full-length sequence shortens the context rather than failing.
  if (flags.max_model_len == 0) max_model_len = std::min<int64_t>(max_model_len, num_blocks * flags.block_size);
  max_model_len = std::min<int64_t>(max_model_len, runner.context_limit());

  SchedulerConfig scheduler;
  scheduler.max_batch_tokens = flags.max_batch_tokens;
  scheduler.max_seqs = flags.max_seqs;
  scheduler.max_model_len = static_cast<int32_t>(max_model_len);
  scheduler.num_blocks = static_cast<int32_t>(num_blocks);
  scheduler.block_size = flags.block_size;
  scheduler.num_host_blocks = static_cast<int32_t>(num_host_blocks);
  scheduler.swap_min_tokens = flags.swap_min_tokens;
  scheduler.splitfuse = !flags.no_splitfuse;
  // Micro-batches: one step in flight per pipeline stage (a GPU/CPU split has two), unless set.
  const int32_t stages = gpu_cpu ? 2 : ranks.layout().pipeline_parallel;
  const EngineOptions engine_options{.device_sampling = !flags.no_device_sampling,
                                     .max_steps_in_flight = flags.steps_in_flight > 0 ? flags.steps_in_flight : stages};
  Engine engine = seq2seq ? Engine(*seq2seq, model.tokenizer.get(), scheduler, engine_options)
                          : Engine(runner, model.tokenizer.get(), scheduler, engine_options);
  // Before the port opens: the first requests' TTFT must not pay for graph recording and plans.
  if (!flags.no_warmup) engine.warm_up();
  AsyncEngine async_engine(engine, AsyncEngineConfig{flags.max_queue});

  // Splitwise roles: a prompt instance serves KV transfers (its prefills exported layer by layer),
  // a token instance imports them; a mixed one does both (the router may borrow it either way).
  // (A GPU/CPU split's leader holds only the CPU layers' KV: no transfers either.)
  const bool split_capable = ranks.size() == 1 && spec.network == NetworkType::DecoderOnly && !gpu_cpu;
  SF_CHECK(split_capable || flags.role == "mixed",
           "--role {} needs one rank (no tensor or pipeline parallelism yet, no GPU/CPU split) and a decoder-only model",
           flags.role);
  splitwise::TransferMetrics transfer_metrics;
  std::optional<splitwise::KvExporter> exporter;
  std::optional<splitwise::TcpKvTransport> transport;
  const bool serves_prompts = split_capable && flags.role != "token";
  const bool imports_kv = split_capable && flags.role != "prompt";
  const splitwise::KvCache kv_cache{backend.get(), runner.k_cache_view(), runner.v_cache_view(),
                                    splitwise::KvLayout{runner.spec().num_layers, runner.spec().attention.num_kv_heads,
                                                        runner.spec().attention.head_dim, runner.kv_cache_dtype()},
                                    static_cast<int32_t>(num_blocks), flags.block_size};
  if (split_capable) {
    splitwise::TcpKvConfig kv_config;
    kv_config.host = flags.kv_host.empty() ? flags.host : flags.kv_host;
    kv_config.port = serves_prompts ? flags.kv_port : -1;
    kv_config.idle_timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.kv_transfer_timeout_s * 1000));
    kv_config.debug_rows_delay = std::chrono::milliseconds(flags.kv_debug_rows_delay_ms);
    splitwise::TransferHandler handler;
    if (serves_prompts) {
      exporter.emplace(async_engine, kv_cache);
      engine.set_kv_observer(&*exporter);
      handler = [&exporter](splitwise::TransferRequest request, std::shared_ptr<splitwise::KvSendChannel> channel) {
        exporter->start(std::move(request), std::move(channel));
      };
    }
    transport.emplace(kv_config, transfer_metrics, std::move(handler));
    if (imports_kv) async_engine.set_kv_importer(splitwise::make_kv_importer(async_engine, *transport, kv_cache, transfer_mode));
    transport->start();
  }

  HttpServerConfig http = flags.http;
  if (http.api_keys.empty()) {
    if (const char* key = std::getenv("SPLITFLOW_API_KEY"); key != nullptr && *key != '\0') http.api_keys.emplace_back(key);
  }
  for (const std::string& key : http.api_keys) SF_CHECK(!key.empty(), "--api-key must not be empty");
  http.host = flags.host;
  http.port = flags.port;
  http.served_model_name = flags.served_model_name.empty() ? default_model_name(flags.model) : flags.served_model_name;
  const auto seconds = [](const char* flag, double value) {
    SF_CHECK(std::isfinite(value) && value > 0 && value <= 86400, "{} must be in (0, 86400] seconds, not {}", flag, value);
    return std::chrono::milliseconds(static_cast<int64_t>(value * 1000));
  };
  http.limits.header_timeout = seconds("--header-timeout", flags.header_timeout_s);
  http.limits.body_timeout = seconds("--body-timeout", flags.body_timeout_s);
  http.limits.write_timeout = seconds("--write-timeout", flags.write_timeout_s);
  http.limits.request_timeout = flags.request_timeout_s == 0 ? std::chrono::milliseconds(0)
                                                             : seconds("--request-timeout", flags.request_timeout_s);
  SF_CHECK(std::isfinite(flags.max_body_mb) && flags.max_body_mb > 0 && flags.max_body_mb <= 4096,
           "--max-body-mb must be in (0, 4096], not {}", flags.max_body_mb);
  http.limits.max_body_bytes = static_cast<size_t>(flags.max_body_mb * double(1 << 20));
  SF_CHECK(std::isfinite(flags.max_body_in_flight_mb) && flags.max_body_in_flight_mb >= flags.max_body_mb,
           "--max-body-in-flight-mb ({}) must be at least --max-body-mb ({})", flags.max_body_in_flight_mb,
           flags.max_body_mb);
  http.limits.max_body_bytes_in_flight = static_cast<size_t>(flags.max_body_in_flight_mb * double(1 << 20));
  http.splitwise_info = [&] {
    nlohmann::json info = {{"role", flags.role},
                           {"kv_address", transport ? transport->address() : std::string()},
                           {"imports_kv", imports_kv},
                           {"kv_transfer", std::string(splitwise::transfer_mode_name(transfer_mode))},
                           {"block_size", flags.block_size},
                           {"num_blocks", num_blocks},
                           {"max_model_len", max_model_len},
                           {"layout", kv_cache.layout.describe()},
                           {"pending_prefill_tokens", exporter ? exporter->pending_tokens() : 0},
                           {"transfers", transfer_metrics.to_json()}};
    return info.dump();
  };
  http.extra_metrics = [&] {
    std::string text;
    if (transport) transfer_metrics.render(text);
    return text;
  };
  const bool has_chat = chat_template.has_value();
  // An encoder serves /v1/embeddings through its own loop; the generative engine stays idle.
  std::optional<EmbeddingEngine> embedding_engine;
  std::optional<AsyncEmbedder> embedder;
  if (embedding_model) {
    embedding_engine.emplace(runner, embedding_config);
    embedder.emplace(*embedding_engine, flags.max_queue);
  }
  HttpServer server(async_engine, model.tokenizer.get(), std::move(chat_template), http,
                    embedder ? &*embedder : nullptr);
  const int port = server.bind();
  async_engine.start();
  if (embedder) embedder->start();
  if (embedder)
    fmt::print(stderr, "splitflow serve: an embedding model: POST /v1/embeddings ({} pooling{}, inputs of at most {} tokens)\n",
               spec_to_json(spec)["embedding"]["pooling"].get<std::string>(),
               spec.embedding.normalize ? ", normalized" : "", embedder->max_input_tokens());
  if (seq2seq)
    fmt::print(stderr, "splitflow serve: an encoder-decoder model: a prompt of at most {} tokens goes to the encoder, "
               "the completion gets up to {} decoder tokens\n", engine.max_prompt_tokens(), max_model_len);

  fmt::print(stderr,
             "splitflow serve: {} as '{}' on http://{}:{}\n  context {} tokens; KV cache {} blocks of {} tokens in {} "
             "({:.2f} GiB{}), swap space {} blocks ({:.2f} GiB, for victims of >= {} tokens); batch {} tokens, {} sequences; {}; queue {} sequences; chat template: {}\n",
             model.description, http.served_model_name, flags.host, port, max_model_len, num_blocks, flags.block_size,
             dtype_name(kv_cache_dtype), static_cast<double>(num_blocks * kv_bytes_per_block) / double(1 << 30),
             sized_from_memory
                 ? fmt::format(", from device memory at --gpu-memory-utilization {}", kv_size.memory_fraction)
                 : kv_size_reason.empty() ? std::string() : "; " + kv_size_reason,
             num_host_blocks,
             static_cast<double>(num_host_blocks * kv_bytes_per_block) / double(1 << 30), flags.swap_min_tokens,
             flags.max_batch_tokens,
             flags.max_seqs, flags.no_splitfuse ? "prefill-first" : "Dynamic SplitFuse", flags.max_queue,
             has_chat ? "yes" : "none (/v1/chat/completions answers 400)");

  if (transport) {
    fmt::print(stderr, "splitflow serve: role {}{}{}\n", flags.role,
               serves_prompts ? fmt::format("; KV transfers served on {} ({} by default)", transport->address(),
                                            splitwise::transfer_mode_name(transfer_mode))
                              : std::string(),
               imports_kv ? "; imports KV from prompt instances" : "");
  }
  std::atomic<bool> served{false};
  std::thread signal_waiter([&] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    if (served) return;
    fmt::print(stderr, "splitflow serve: {} received, draining (at most {} s)\n", strsignal(signal), flags.drain_timeout_s);
    server.shutdown(std::chrono::milliseconds(static_cast<int64_t>(flags.drain_timeout_s * 1000)));
  });
  server.serve();
  served = true;
  pthread_kill(signal_waiter.native_handle(), SIGTERM);  // wakes the waiter when no signal came
  signal_waiter.join();
  if (embedder) embedder->stop();
  async_engine.stop();
  if (transport) transport->stop();
  fmt::print(stderr, "splitflow serve: stopped\n");
}

}  // namespace

void register_serve(CLI::App& app) {
  auto flags = std::make_shared<ServeFlags>();
  auto* command = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  add_model_flags(*command, flags->model);
  command->add_option("--host", flags->host, "address to listen on")->capture_default_str();
  command->add_option("--port", flags->port, "port to listen on (0: any free port)")->capture_default_str();
  command->add_option("--max-batch-tokens", flags->max_batch_tokens, "tokens of one forward step (the SplitFuse budget)")
      ->capture_default_str();
  command->add_option("--max-seqs", flags->max_seqs, "sequences running at once")->capture_default_str();
  command->add_option("--max-model-len,-c,--ctx-size", flags->max_model_len,
                      "tokens a sequence may reach (0: the model's context)");
  command->add_option("--num-blocks", flags->num_blocks, "KV cache blocks");
  command->add_option("--kv-cache-gb", flags->kv_cache_gb,
                      "KV cache size in GiB (instead of --num-blocks), or auto: what the device's memory leaves once "
                      "the weights and step buffers are allocated (default on cuda; on cpu: every sequence at full "
                      "length if that takes at most 256 MiB, else one full-length sequence, at most half the "
                      "available memory)");
  command->add_option("--gpu-memory-utilization", flags->gpu_memory_utilization,
                      "with --kv-cache-gb auto (implied): the fraction of the device's total memory this process may "
                      "use, in (0, 1] (default 0.9; the CPU backend's device is host memory)");
  command->add_option("--swap-space", flags->swap_space_gb,
                      "host memory in GiB for KV swapped out by preemption (0: preemption by recompute only)")
      ->capture_default_str();
  command->add_option("--swap-min-tokens", flags->swap_min_tokens,
                      "preempt by swap (not recompute) when the recompute would rerun at least this many tokens")
      ->capture_default_str();
  command->add_option("--block-size", flags->block_size, "tokens per KV block")->capture_default_str();
  add_kv_cache_dtype_flag(*command, flags->kv_cache_dtype);
  command->add_flag("--no-splitfuse", flags->no_splitfuse, "prefill-first scheduling (decode pauses while prompts run)");
  command->add_flag("--no-device-sampling", flags->no_device_sampling, "sample every token on the host");
  command->add_option("--steps-in-flight", flags->steps_in_flight,
                      "steps submitted before the oldest one's tokens come back (micro-batches through pipeline "
                      "stages, or the two sides of a GPU/CPU split); 0: one per stage")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  command->add_flag("--no-warmup", flags->no_warmup,
                    "skip the start-up warm-up (decode graphs recorded, kernels loaded at the first requests instead)");
  command->add_option("--chat-template", flags->chat_template,
                      "chat template: a tokenizer_config.json, chat_template.json or .jinja file "
                      "(default: the model directory's)");
  command->add_option("--served-model-name", flags->served_model_name, "the model name clients give (default: the model's)");
  command->add_option("--max-queue", flags->max_queue, "waiting sequences beyond which requests get 429")->capture_default_str();
  HttpServerConfig& http = flags->http;
  command->add_option("--api-key", http.api_keys,
                      "key clients must send as 'Authorization: Bearer KEY' on /v1/* (repeatable; default: "
                      "$SPLITFLOW_API_KEY; /health and /metrics stay open)");
  command->add_option("--allowed-origins", http.allowed_origins,
                      "origins browsers may call from (CORS), e.g. https://app.example.com, or '*' (repeatable)");
  command->add_option("--io-threads", http.io_threads, "threads that own the sockets (and answer /health, /metrics)")
      ->capture_default_str()->check(CLI::Range(1, 256));
  command->add_option("--http-threads", http.worker_threads,
                      "threads that parse, tokenize and template requests (none waits on a client)")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  command->add_option("--backlog", http.backlog, "listen backlog for bursts of connections (capped by net.core.somaxconn)")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  command->add_option("--max-connections", http.max_connections, "open connections beyond which new ones get 503")
      ->capture_default_str()->check(CLI::Range(1, 1 << 24));
  command->add_option("--max-header-bytes", http.limits.max_header_bytes, "request line and headers, bytes (431 beyond)")
      ->capture_default_str()->check(CLI::Range(size_t{256}, size_t{1} << 24));
  command->add_option("--max-header-count", http.limits.max_header_count, "header fields of a request (431 beyond)")
      ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{1} << 16));
  command->add_option("--max-body-mb", flags->max_body_mb, "request body in MiB after de-chunking (413 beyond)")
      ->capture_default_str();
  command->add_option("--max-body-in-flight-mb", flags->max_body_in_flight_mb,
                      "every request body being read or handled, together, in MiB (503 beyond; a chunked body counts "
                      "as --max-body-mb)")
      ->capture_default_str();
  command->add_option("--header-timeout", flags->header_timeout_s,
                      "seconds from a connection's start (or its previous response) to the end of a request's headers")
      ->capture_default_str();
  command->add_option("--body-timeout", flags->body_timeout_s, "seconds from the headers to the end of the body")
      ->capture_default_str();
  command->add_option("--write-timeout", flags->write_timeout_s,
                      "seconds a response write may wait on a client that does not read")
      ->capture_default_str();
  command->add_option("--request-timeout", flags->request_timeout_s,
                      "seconds from a request to the end of its response: 504 or close beyond (0: none)")
      ->capture_default_str();
  command->add_option("--drain-timeout", flags->drain_timeout_s, "seconds in-flight requests get on shutdown")
      ->capture_default_str();
  command->add_option("--role", flags->role,
                      "Splitwise role: prompt (prefill only, KV sent to token instances), token (decodes with KV "
                      "from prompt instances) or mixed (today's server; also serves and imports KV)")
      ->capture_default_str();
  command->add_option("--kv-host", flags->kv_host, "address KV transfers are served on (default: --host)");
  command->add_option("--kv-port", flags->kv_port, "port KV transfers are served on (0: any free port)")
      ->capture_default_str();
  command->add_option("--kv-transfer", flags->kv_transfer,
                      "KV transfer a token instance asks for unless the request names one: layerwise (each layer as "
                      "it is computed) or serialized (after the whole prompt)")
      ->capture_default_str();
  command->add_option("--kv-transfer-timeout", flags->kv_transfer_timeout_s,
                      "seconds a KV transfer may make no progress before both sides drop it and free its blocks")
      ->capture_default_str();
  command->add_option("--kv-debug-rows-delay-ms", flags->kv_debug_rows_delay_ms,
                      "fault injection for tests: a prompt instance waits this long before writing each layer's rows")
      ->capture_default_str();
  command->callback([flags] { run_serve(*flags); });
}

}  // namespace splitflow::cli
