// `splitflow profile`: times the engine's prefills, decode steps (by batch size and context
// length) and Splitwise KV transfers on this device, and writes the cluster simulator's
// perf-model CSV with a JSON sidecar of provenance (profile/profile.h, docs/simulator.md).
#include "bench/report.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "profile/profile.h"

#ifdef SPLITFLOW_HAS_CUDA
#include "backend/cuda/device_info.h"
#endif

#include <fmt/format.h>
#include <omp.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace splitflow::cli {

namespace {

struct ProfileFlags {
  ModelFlags model;
  std::string kv_cache_dtype = "auto";
  int32_t block_size = 16;
  std::string out;
  std::string model_name;  // the simulator's model key (default: the config or model file's name)
  std::string hardware;    // the simulator's hardware key (default: from the device)
  bool quick = false;
  // Grid overrides ("16,64,256"); unset: the default (or --quick) grid.
  std::optional<std::string> prompt_sizes, batch_sizes, context_lengths, kv_transfer_sizes;
  std::optional<int32_t> repetitions, decode_steps;
};

std::vector<int32_t> parse_sizes(const std::string& text, const char* flag) {
  std::vector<int32_t> values;
  std::stringstream fields(text);
  std::string field;
  while (std::getline(fields, field, ',')) {
    if (field.empty()) continue;
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(field, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SF_CHECK(used == field.size() && used > 0, "{}: '{}' is not an integer", flag, field);
    SF_CHECK(value >= -(1LL << 30) && value <= (1LL << 30), "{}: {} is out of range", flag, field);
    values.push_back(static_cast<int32_t>(value));
  }
  return values;
}

// A key the simulator's CSV can carry: lower case, no commas or spaces.
std::string key_text(const std::string& text) {
  std::string key;
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '.' || c == '_') key += static_cast<char>(std::tolower(u));
    else if (!key.empty() && key.back() != '-') key += '-';
  }
  while (!key.empty() && key.back() == '-') key.pop_back();
  return key.empty() ? "unknown" : key;
}

std::string device_description(const ModelFlags& flags, int threads) {
#ifdef SPLITFLOW_HAS_CUDA
  if (flags.backend == "cuda") {
    const std::vector<cuda::DeviceInfo> devices = cuda::list_devices();
    SF_CHECK(!devices.empty(), "--device cuda: no GPU visible");
    return devices[0].name;
  }
#endif
  return bench::cpu_description(threads);
}

nlohmann::json grid_json(const profile::ProfileGrid& grid) {
  return {{"prompt_sizes", grid.prompt_tokens},       {"batch_sizes", grid.batch_sizes},
          {"context_lengths", grid.context_tokens},   {"kv_transfer_sizes", grid.kv_transfer_tokens},
          {"repetitions", grid.repetitions},          {"decode_steps", grid.decode_steps}};
}

void run_profile(const ProfileFlags& flags) {
  SF_CHECK(!flags.out.empty(), "--out: give the perf-model CSV to write");
  profile::check_writable(flags.out, "--out");
  profile::check_writable(flags.out + ".json", "--out (its .json sidecar)");
  SF_CHECK(flags.block_size >= 1, "--block-size must be at least 1, got {}", flags.block_size);
  const std::optional<DType> kv_dtype = parse_kv_cache_dtype_flag(flags.kv_cache_dtype);
  const int threads = flags.model.threads > 0 ? flags.model.threads : omp_get_max_threads();
  ParallelRank ranks = flags.model.join_ranks();
  std::unique_ptr<Backend> backend = flags.model.make_backend(&ranks);
  const auto start = std::chrono::steady_clock::now();
  LoadedModel model = load_model(flags.model.options());
  SF_CHECK(model.spec.network == NetworkType::DecoderOnly,
           "profile: the simulator models decoder-only generation; this model's network is not decoder-only");

  profile::ProfileGrid grid = flags.quick ? profile::quick_grid(model.spec.max_position)
                                          : profile::default_grid(model.spec.max_position);
  if (flags.prompt_sizes) grid.prompt_tokens = parse_sizes(*flags.prompt_sizes, "--prompt-sizes");
  if (flags.batch_sizes) grid.batch_sizes = parse_sizes(*flags.batch_sizes, "--batch-sizes");
  if (flags.context_lengths) grid.context_tokens = parse_sizes(*flags.context_lengths, "--context-lengths");
  if (flags.kv_transfer_sizes) grid.kv_transfer_tokens = parse_sizes(*flags.kv_transfer_sizes, "--kv-transfer-sizes");
  if (flags.repetitions) grid.repetitions = *flags.repetitions;
  if (flags.decode_steps) grid.decode_steps = *flags.decode_steps;
  // Splitwise roles run one rank (serve --role refuses more): a sharded cache is not what moves.
  const bool transfers_measurable = ranks.size() == 1 && profile::kv_transfer_available();
  if (!transfers_measurable && !grid.kv_transfer_tokens.empty() && !flags.kv_transfer_sizes) {
    fmt::print(stderr, "profile: KV transfers not measured ({})\n",
               ranks.size() > 1 ? "Splitwise roles run one rank" : "this build has no Splitwise transport");
    grid.kv_transfer_tokens.clear();
  }
  SF_CHECK(ranks.size() == 1 || grid.kv_transfer_tokens.empty(),
           "--kv-transfer-sizes: Splitwise KV transfers run between single-rank instances; pass --kv-transfer-sizes '' "
           "with --tensor-parallel-size or --pipeline-parallel-size");
  profile::check_grid(grid, model.spec);

  ranks.partition(model);
  if (!ranks.leader()) return ranks.follow(model.spec, std::move(model.weights), *backend);
  const ModelSpec spec = model.spec;
  const std::string description = model.description;
  const profile::RunnerShape shape = profile::runner_shape(grid, flags.block_size, kv_dtype);
  ModelRunner runner(spec, std::move(model.weights), *backend, shape.kv, shape.limits, ranks.runner_partition());
  ranks.lead(runner);
  backend->synchronize();
  fmt::print(stderr, "model: {}; cache {} blocks of {} tokens ({})\n", description, shape.kv.num_blocks,
             flags.block_size, dtype_name(runner.kv_cache_dtype()));

  auto progress = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
  std::vector<profile::ProfileRow> rows = profile::profile_steps(runner, *backend, shape.kv, grid, progress);
  nlohmann::json link = {{"measured", false}};
  if (!grid.kv_transfer_tokens.empty()) {
    std::vector<profile::ProfileRow> transfers =
        profile::profile_kv_transfer(runner, *backend, shape.kv, grid, link, progress);
    link["measured"] = true;
    rows.insert(rows.end(), transfers.begin(), transfers.end());
  }
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const std::string device = device_description(flags.model, threads);
  const std::string source = !flags.model.load.config_path.empty() ? flags.model.load.config_path
                                                                   : flags.model.load.model_path;
  profile::PerfModelKey key;
  key.model = flags.model_name.empty() ? key_text(std::filesystem::path(source).stem().string()) : flags.model_name;
  key.hardware = flags.hardware.empty() ? (flags.model.backend == "cpu" ? "cpu" : key_text(device)) : flags.hardware;
  key.tensor_parallel = ranks.size();
  SF_CHECK(key.model.find(',') == std::string::npos && key.hardware.find(',') == std::string::npos,
           "--model-name and --hardware must not contain commas (CSV fields)");
  profile::write_perf_csv(flags.out, key, rows);

  nlohmann::json sidecar = {
      {"perf_model_csv", std::filesystem::path(flags.out).filename().string()},
      {"model_key", key.model},
      {"hardware_key", key.hardware},
      {"tensor_parallel", key.tensor_parallel},
      {"device", device},
      {"backend", backend->name()},
      {"threads", flags.model.backend == "cpu" ? threads : 0},
      {"date", bench::utc_timestamp()},
      {"commit", bench::source_commit()},
      {"model", {{"description", description},
                 {"source", source},
                 {"dummy_weights", flags.model.load.dummy_weights},
                 {"num_layers", spec.num_layers},
                 {"hidden_size", spec.hidden_size},
                 {"num_heads", spec.attention.num_heads},
                 {"num_kv_heads", spec.attention.num_kv_heads},
                 {"head_dim", spec.attention.head_dim},
                 {"vocab_size", spec.vocab_size},
                 {"max_position", spec.max_position},
                 {"kv_bytes_per_token", kv_cache_bytes_per_token(spec, runner.kv_cache_dtype())}}},
      {"kv_cache_dtype", dtype_name(runner.kv_cache_dtype())},
      {"block_size", flags.block_size},
      {"grid", grid_json(grid)},
      {"kv_transfer_link", link},
      {"rows", rows.size()},
      {"wall_s", wall_s},
  };
  std::ofstream(flags.out + ".json") << sidecar.dump(2) << "\n";
  fmt::print("profile: {} rows ({} prompt sizes, {} x {} decode cells, {} transfer sizes, {} repetitions) in {:.1f} s\n",
             rows.size(), grid.prompt_tokens.size(), grid.batch_sizes.size(), grid.context_tokens.size(),
             grid.kv_transfer_tokens.size(), grid.repetitions, wall_s);
  fmt::print("wrote {} and {}.json (model '{}', hardware '{}', TP{})\n", flags.out, flags.out, key.model, key.hardware,
             key.tensor_parallel);
}

}  // namespace

void register_profile(CLI::App& app) {
  auto flags = std::make_shared<ProfileFlags>();
  auto* command = app.add_subcommand(
      "profile", "time prefills, decode steps by batch and context, and KV transfers; write the simulator's perf CSV");
  add_model_flags(*command, flags->model);
  add_kv_cache_dtype_flag(*command, flags->kv_cache_dtype);
  command->add_option("--out", flags->out, "perf-model CSV to write (provenance goes to OUT.json)")->required();
  command->add_option("--model-name", flags->model_name,
                      "the simulator's model key (default: the config or model file's name)");
  command->add_option("--hardware", flags->hardware, "the simulator's hardware key (default: cpu, or the GPU's name)");
  command->add_option("--block-size", flags->block_size, "KV cache block size in tokens")->capture_default_str();
  command->add_flag("--quick", flags->quick, "a small grid (tests, CPU runs)");
  command->add_option("--prompt-sizes", flags->prompt_sizes, "prefill sizes, comma-separated (default 16..4096)");
  command->add_option("--batch-sizes", flags->batch_sizes, "decode batch sizes (default 1,2,4,...,64)");
  command->add_option("--context-lengths", flags->context_lengths,
                      "tokens cached per decode sequence (default 0,128,512,1024,2048,4096, clipped to the model)");
  command->add_option("--kv-transfer-sizes", flags->kv_transfer_sizes,
                      "prompt lengths whose KV is sent over Splitwise's TCP transport ('' for none)");
  command->add_option("--repetitions", flags->repetitions, "rows per grid point (default 3; --quick 2)");
  command->add_option("--decode-steps", flags->decode_steps, "decode steps averaged per row (default 8; --quick 2)");
  command->callback([flags] { run_profile(*flags); });
}

}  // namespace splitflow::cli
