// `splitflow bench embed`: offline embedding throughput (bench/embedding_throughput.h) against the
// GEMM roofline measured in the same run (the GPU's bf16 GEMM, the CPU's FMA peak), printed as a
// table and written as JSON under bench/results/.
#include "backend/cpu/fma_peak.h"
#include "bench/embedding_throughput.h"
#include "bench/report.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "cli/roofline.h"

#include <fmt/format.h>
#include <omp.h>

#include <memory>
#include <string>

namespace splitflow::cli {

namespace {

struct EmbedBenchFlags {
  ModelFlags model;
  bench::EmbeddingBenchOptions options;
  std::string results_dir = "bench/results";
};

void run_bench_embed(const EmbedBenchFlags& flags) {
  const int threads = flags.model.threads > 0 ? flags.model.threads : omp_get_max_threads();
  std::unique_ptr<Backend> backend = flags.model.make_backend();
  LoadedModel model = load_model(flags.model.options());
  fmt::print(stderr, "model: {}\n", model.description);
  Roofline roofline = measure_roofline(flags.model, threads);
  if (flags.model.backend == "cpu") roofline.gemm_tflops = cpu::measure_fma_peak_gflops(threads) / 1e3;
  const std::string description = model.description;
  nlohmann::json result = bench::run_embedding_throughput(std::move(model), *backend, flags.options, roofline.gemm_tflops);
  result["benchmark"] = "embed";
  result["model"] = description;
  result["backend"] = backend->name();
  result["device"] = roofline.device;
  result["date"] = bench::utc_timestamp();
  result["commit"] = bench::source_commit();

  fmt::print("| {:<30} | {:>18} |\n|{:-<32}|{:->20}|\n", "embed", "value", "", "");
  auto row = [](const std::string& name, const std::string& value) { fmt::print("| {:<30} | {:>18} |\n", name, value); };
  row("device", roofline.device.substr(0, 18));
  row("inputs x tokens", fmt::format("{} x {}", flags.options.num_inputs, flags.options.input_len));
  row("inputs per step", fmt::format("{}", result["inputs_per_step"].get<int>()));
  row("median pass (s)", fmt::format("{:.3f}", result["median_pass_s"].get<double>()));
  row("tokens/s", fmt::format("{:.0f}", result["tokens_per_s"].get<double>()));
  row("inputs/s", fmt::format("{:.0f}", result["inputs_per_s"].get<double>()));
  row("TFLOP/s (matrices + attention)", fmt::format("{:.2f}", result["achieved_tflops"].get<double>()));
  if (result.contains("fraction_of_gemm")) {
    row("GEMM roofline (TFLOP/s)", fmt::format("{:.1f}", roofline.gemm_tflops));
    row("fraction of the roofline", fmt::format("{:.3f}", result["fraction_of_gemm"].get<double>()));
  }
  fmt::print("results: {}\n", bench::write_result(result, flags.results_dir, "embed"));
}

}  // namespace

void register_bench_embed(CLI::App& bench) {
  auto flags = std::make_shared<EmbedBenchFlags>();
  auto* embed = bench.add_subcommand("embed", "offline embedding throughput of an encoder-only model vs the GEMM roofline");
  add_model_flags(*embed, flags->model);
  embed->add_option("--num-inputs", flags->options.num_inputs, "inputs per timed pass")->capture_default_str();
  embed->add_option("--input-len", flags->options.input_len, "tokens per input, [CLS] and [SEP] included")
      ->capture_default_str();
  embed->add_option("--max-batch-tokens", flags->options.max_batch_tokens, "tokens of one forward")->capture_default_str();
  embed->add_option("--max-seqs", flags->options.max_seqs, "inputs of one forward")->capture_default_str();
  embed->add_option("-r,--repetitions", flags->options.repetitions, "timed passes (the median is reported)")
      ->capture_default_str();
  embed->add_option("--seed", flags->options.seed, "seed of the input token ids")->capture_default_str();
  embed->add_option("--results-dir", flags->results_dir, "where the JSON result goes")->capture_default_str();
  embed->callback([flags] { run_bench_embed(*flags); });
}

}  // namespace splitflow::cli
