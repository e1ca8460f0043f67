// `splitflow bench allreduce`: NCCL vs the custom allreduce algorithms (bench/allreduce.h).
#include "bench/allreduce.h"
#include "cli/commands.h"

#include <memory>

namespace splitflow::cli {

void register_bench_allreduce(CLI::App& bench) {
  auto options = std::make_shared<bench::AllreduceBenchOptions>();
  auto* command = bench.add_subcommand(
      "allreduce", "allreduce latency and bus bandwidth: NCCL vs one-shot, two-shot, half-butterfly (one process per GPU)");
  command->add_option("--nproc", options->nproc, "GPUs (processes); 0: every visible GPU")->capture_default_str();
  command->add_option("--min-bytes", options->min_bytes, "smallest message")->capture_default_str();
  command->add_option("--max-bytes", options->max_bytes, "largest message (sizes double from the smallest)")->capture_default_str();
  command->add_option("--dtype", options->dtype, "f32, f16 or bf16")->capture_default_str();
  command->add_option("--graph-calls", options->graph_calls, "allreduces per captured CUDA graph")->capture_default_str();
  command->add_option("--trials", options->trials, "timed repetitions (median reported)")->capture_default_str();
  command->add_option("--sweep-blocks", options->sweep_blocks, "grid limits swept for the custom kernels")->capture_default_str();
  command->add_option("--fused-rows", options->fused_rows, "row counts of the fused allreduce+residual+RMSNorm cases")->capture_default_str();
  command->add_option("--fused-hidden", options->fused_hidden, "hidden size of the fused case")->capture_default_str();
  command->add_option("--results-dir", options->results_dir, "where the JSON result goes")->capture_default_str();
  command->callback([options] { bench::run_allreduce_bench(*options); });
}

}  // namespace splitflow::cli
