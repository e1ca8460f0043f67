// `splitflow bench ...`: benchmarks that print a table and write JSON under bench/results/ with
// the device, date, commit and the roofline measured in the same run.
#include "backend/cpu/fma_peak.h"
#include "bench/latency.h"
#include "bench/llama_cpp_peer.h"
#include "bench/report.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "cli/roofline.h"
#include "core/error.h"

#include <fmt/format.h>
#include <omp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace splitflow::cli {

namespace {

struct LatencyFlags {
  ModelFlags model;
  bench::LatencyOptions options;
  std::string kv_cache_dtype = "auto";
  std::string results_dir = "bench/results";
  std::string llama_bench;  // run llama.cpp's llama-bench on the same file as the peer
};

void run_bench_latency(const LatencyFlags& flags) {
  bench::LatencyOptions options = flags.options;
  options.kv_cache_dtype = parse_kv_cache_dtype_flag(flags.kv_cache_dtype);
  const int threads = flags.model.threads > 0 ? flags.model.threads : omp_get_max_threads();
  ParallelRank ranks = flags.model.join_ranks();
  std::unique_ptr<Backend> backend = flags.model.make_backend(&ranks);
  const bool on_cpu = flags.model.backend == "cpu";
  const auto load_start = std::chrono::steady_clock::now();
  LoadedModel model = load_model(flags.model.options());
  ranks.partition(model);
  if (!ranks.leader()) return ranks.follow(model.spec, std::move(model.weights), *backend);
  std::optional<int> gpu_layers;  // the GPU/CPU split's, once the run's KV cache is known
  options.gpu_cpu_split = [&](const LoadedModel& loaded, const KvCacheConfig& kv,
                              const RunnerLimits& limits) -> std::unique_ptr<LocalPipeline> {
    gpu_layers = flags.model.gpu_layer_split(loaded, *backend, kv, limits);
    return gpu_layers ? flags.model.make_gpu_cpu_pipeline(loaded, *gpu_layers, kv, limits) : nullptr;
  };
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  fmt::print(stderr, "model: {} (loaded in {:.1f} s)\n", model.description, load_seconds);
  // The other ranks wait in their first step while rank 0 measures its GPU's ceilings.
  Roofline roofline = measure_roofline(flags.model, threads);
  // On the CPU prefill is measured against the fp32 FMA peak (backend/cpu/fma_peak.h).
  if (on_cpu) roofline.gemm_tflops = cpu::measure_fma_peak_gflops(threads) / 1e3;
  // One prefill and one decode step before the timed ones, on the CPU too: the first touch of a
  // memory-mapped checkpoint's pages would otherwise be timed as prefill (llama-bench warms up
  // likewise).
  options.warmup = true;
  options.parallel = &ranks;
  nlohmann::json result = bench::run_latency(std::move(model), *backend, options, roofline.bandwidth_gbps, roofline.gemm_tflops);
  if (on_cpu) {
    // A shared machine's bandwidth drifts: measure again after the run and keep the better roofline.
    const double bandwidth_after = bench::measure_cpu_read_bandwidth_gbps(threads);
    if (bandwidth_after > roofline.bandwidth_gbps) {
      result["bandwidth_gbps"] = bandwidth_after;
      result["fraction_of_bandwidth"] = result["achieved_gbps"].get<double>() / bandwidth_after;
    }
  }
  // Weights in device memory and the runner built (cache, buffers) count as loading too.
  result["load_s"] = load_seconds + result["runner_setup_s"].get<double>();
  result["benchmark"] = "latency";
  result["backend"] = backend->name();
  result["device"] = roofline.device;
  result["date"] = bench::utc_timestamp();
  result["commit"] = bench::source_commit();
  // --quantization as given: fp8 (W8A8) and fp8-weight-only load the same f8_channel matrices.
  if (!flags.model.quantization.empty()) result["quantization"] = flags.model.quantization;
  if (gpu_layers) {
    result["gpu_layers"] = *gpu_layers;
    const std::optional<MatmulOffloadOptions> offload = flags.model.offload();
    result["offload_rows"] = offload ? offload->min_rows : 0;  // 0: the CPU layers' products stay on the CPU
  }

  if (!flags.llama_bench.empty()) {
    SF_CHECK(!flags.model.load.dummy_weights && !flags.model.load.model_path.empty(),
             "--llama-bench needs a model file (the peer runs the same .gguf)");
    // The same split as this run: -ngl N, every layer (99) on the GPU, or none on the CPU.
    const int peer_gpu_layers = on_cpu ? 0 : gpu_layers.value_or(99);
    bench::LlamaBenchRequest request{flags.llama_bench, flags.model.load.model_path, threads, options.input_len,
                                     options.output_len, options.repetitions, peer_gpu_layers};
    nlohmann::json peer = bench::run_llama_bench(request);
    // The peer's fractions of the same rooflines, from its speeds and this run's bytes per step
    // and FLOPs per prompt token (same file, same lengths).
    const double bytes_per_step = result["achieved_gbps"].get<double>() * result["tpot_ms"].get<double>() * 1e6;
    peer["achieved_gbps"] = peer["decode_tokens_per_s"].get<double>() / options.batch * bytes_per_step / 1e9;
    peer["fraction_of_bandwidth"] = peer["achieved_gbps"].get<double>() / result["bandwidth_gbps"].get<double>();
    if (result.contains("gemm_tflops")) {
      const double gflop_per_token = result["prefill_gflops"].get<double>() / result["prefill_tokens_per_s"].get<double>();
      peer["prefill_fraction_of_gemm"] =
          peer["prefill_tokens_per_s"].get<double>() * gflop_per_token / 1e3 / result["gemm_tflops"].get<double>();
    }
    result["decode_vs_peer"] = result["decode_tokens_per_s"].get<double>() / peer["decode_tokens_per_s"].get<double>();
    result["prefill_vs_peer"] = result["prefill_tokens_per_s"].get<double>() / peer["prefill_tokens_per_s"].get<double>();
    result["peer"] = std::move(peer);
  }

  fmt::print("| {:<28} | {:>14} |\n|{:-<30}|{:->16}|\n", "latency", "value", "", "");
  auto row = [&](const char* name, const char* key, const char* format) {
    fmt::print("| {:<28} | {:>14} |\n", name, fmt::format(fmt::runtime(format), result.at(key).get<double>()));
  };
  fmt::print("| {:<28} | {:>14} |\n", "device", result["device"].get<std::string>().substr(0, 14));
  row("load (s)", "load_s", "{:.1f}");
  row("TTFT (ms)", "ttft_ms", "{:.1f}");
  row("prefill tokens/s", "prefill_tokens_per_s", "{:.1f}");
  row("prefill GFLOP/s", "prefill_gflops", "{:.1f}");
  row("time per output token (ms)", "tpot_ms", "{:.2f}");
  row("decode tokens/s", "decode_tokens_per_s", "{:.2f}");
  row("weights+KV streamed (GB/s)", "achieved_gbps", "{:.2f}");
  row("measured bandwidth (GB/s)", "bandwidth_gbps", "{:.2f}");
  row("fraction of bandwidth", "fraction_of_bandwidth", "{:.3f}");
  if (result.contains("gemm_tflops")) {
    row("prefill TFLOP/s", "prefill_tflops", on_cpu ? "{:.3f}" : "{:.1f}");
    row(on_cpu ? "measured FMA peak (TFLOP/s)" : "measured bf16 GEMM (TFLOP/s)", "gemm_tflops", on_cpu ? "{:.3f}" : "{:.1f}");
    row(on_cpu ? "fraction of FMA peak" : "fraction of GEMM rate", "prefill_fraction_of_gemm", "{:.3f}");
  }
  if (result.contains("peer")) {
    fmt::print("| {:<28} | {:>14.1f} |\n", "llama.cpp prefill tokens/s", result["peer"]["prefill_tokens_per_s"].get<double>());
    fmt::print("| {:<28} | {:>14.2f} |\n", "llama.cpp decode tokens/s", result["peer"]["decode_tokens_per_s"].get<double>());
    row("prefill / llama.cpp", "prefill_vs_peer", "{:.3f}");
    row("decode / llama.cpp", "decode_vs_peer", "{:.3f}");
  }
  fmt::print("result: {}\n", bench::write_result(result, flags.results_dir, "latency"));
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "benchmarks (table on stdout, JSON under bench/results/)");
  bench->require_subcommand(1);

  auto flags = std::make_shared<LatencyFlags>();
  auto* latency = bench->add_subcommand("latency", "TTFT and time per output token vs the measured memory bandwidth");
  add_model_flags(*latency, flags->model);
  latency->add_option("--input-len", flags->options.input_len, "prompt tokens per request")->capture_default_str();
  latency->add_option("--output-len", flags->options.output_len, "generated tokens per request")->capture_default_str();
  latency->add_option("--batch", flags->options.batch, "requests decoded together")->capture_default_str();
  latency->add_option("-r,--repetitions", flags->options.repetitions,
                      "timed runs of the prefill and of the decode steps (the report gives means and deviations; the "
                      "llama.cpp peer runs as many)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  latency->add_option("--max-batch-tokens", flags->options.max_batch_tokens, "prefill chunk in tokens")->capture_default_str();
  add_kv_cache_dtype_flag(*latency, flags->kv_cache_dtype);
  latency->add_flag("--profile-prefill", flags->options.profile_prefill,
                    "profile the prefill instead of the decode steps (ncu --profile-from-start off)");
  latency->add_option("--results-dir", flags->results_dir, "where the JSON result goes")->capture_default_str();
  latency->add_option("--llama-bench", flags->llama_bench,
                      "llama.cpp's llama-bench binary: run it on the same .gguf, threads and lengths as the peer");
  latency->callback([flags] { run_bench_latency(*flags); });
  register_bench_serving(*bench);
  register_bench_allreduce(*bench);
  register_bench_grammar(*bench);
  register_bench_embed(*bench);
}

}  // namespace splitflow::cli
