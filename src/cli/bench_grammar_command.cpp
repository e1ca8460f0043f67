// `splitflow bench grammar`: the per-token cost of structured outputs (bench/grammar_overhead.h),
// printed as a table and written as JSON under bench/results/.
#include "bench/grammar_overhead.h"
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

struct GrammarBenchFlags {
  ModelFlags model;
  bench::GrammarOverheadOptions options;
  std::string results_dir = "bench/results";
};

void run_bench_grammar(const GrammarBenchFlags& flags) {
  std::unique_ptr<Backend> backend = flags.model.make_backend();
  LoadedModel model = load_model(flags.model.options());
  fmt::print(stderr, "model: {}\n", model.description);
  // The device's name and ceilings, as every bench result carries them (the peer here is the
  // same run's unconstrained decoding).
  const Roofline roofline =
      measure_roofline(flags.model, flags.model.threads > 0 ? flags.model.threads : omp_get_max_threads());
  nlohmann::json result = bench::run_grammar_overhead(std::move(model), *backend, flags.options);
  result["benchmark"] = "grammar";
  result["backend"] = backend->name();
  result["device"] = roofline.device;
  result["bandwidth_gbps"] = roofline.bandwidth_gbps;
  result["model"] = flags.model.load.model_path;
  result["date"] = bench::utc_timestamp();
  result["commit"] = bench::source_commit();

  fmt::print("structured outputs: {} tokens per sequence, tokenizer vocabulary {} (model {})\n",
             result["output_len"].get<int>(), result["tokenizer_vocab_size"].get<int>(),
             result["model_vocab_size"].get<int>());
  fmt::print("| {:>5} | {:>13} | {:>16} | {:>16} | {:>13} | {:>13} | {:>15} | {:>13} |\n"
             "|{:->7}|{:->15}|{:->18}|{:->18}|{:->15}|{:->15}|{:->17}|{:->15}|\n",
             "batch", "plain ms/tok", "cold-cache ms/tok", "warm-cache ms/tok", "overhead cold", "overhead warm",
             "masks us/step", "waited us/step", "", "", "", "", "", "", "", "");
  for (const auto& row : result["decode"]) {
    fmt::print("| {:>5} | {:>13.3f} | {:>16.3f} | {:>16.3f} | {:>12.1f}% | {:>12.1f}% | {:>15.1f} | {:>14.1f} |\n",
               row["batch"].get<int>(), row["unconstrained_ms_per_token"].get<double>(),
               row["constrained_cold_ms_per_token"].get<double>(), row["constrained_warm_ms_per_token"].get<double>(),
               100 * row["overhead_cold"].get<double>(), 100 * row["overhead_warm"].get<double>(),
               row["mask_helper_us_per_step_warm"].get<double>(), row["mask_wait_us_per_step_warm"].get<double>());
  }
  fmt::print("(masks: the helper thread's accepts and masks a step, warm cache; waited: the engine thread blocked "
             "for them after issuing the forward; the forward runs meanwhile)\n");
  fmt::print("\nmask over {} tokens ({} trie nodes, built in {:.0f} ms); applying one to a row: {:.1f} us\n",
             result["tokenizer_vocab_size"].get<int>(), result["trie_nodes"].get<int64_t>(),
             result["vocabulary_build_ms"].get<double>(), result["mask_apply_us"].get<double>());
  fmt::print("| {:<14} | {:>13} | {:>11} | {:>8} |\n|{:->16}|{:->15}|{:->13}|{:->10}|\n", "state after", "miss (walk) ms",
             "hit (copy) us", "allowed", "", "", "", "");
  for (const auto& row : result["mask_states"]) {
    fmt::print("| {:<14} | {:>13.2f} | {:>11.2f} | {:>8} |\n", row["prefix"].get<std::string>(),
               row["miss_ms"].get<double>(), row["hit_us"].get<double>(), row["allowed_tokens"].get<int64_t>());
  }
  fmt::print("result: {}\n", bench::write_result(result, flags.results_dir, "grammar"));
}

}  // namespace

void register_bench_grammar(CLI::App& bench) {
  auto flags = std::make_shared<GrammarBenchFlags>();
  auto* command = bench.add_subcommand("grammar", "structured outputs: per-token cost of constrained decoding, and the mask's");
  add_model_flags(*command, flags->model);
  command->add_option("--batch-sizes", flags->options.batch_sizes, "batch sizes to time")->capture_default_str();
  command->add_option("--output-len", flags->options.output_len, "tokens generated per sequence")->capture_default_str();
  command->add_option("--input-len", flags->options.input_len, "prompt tokens per sequence")->capture_default_str();
  command->add_option("--repeats", flags->options.repeats, "runs per configuration (the fastest is kept)")
      ->capture_default_str();
  command->add_option("--results-dir", flags->results_dir, "where the JSON result goes")->capture_default_str();
  command->callback([flags] { run_bench_grammar(*flags); });
}

}  // namespace splitflow::cli
