// bench/allreduce.h — `splitflow bench allreduce`: latency and bus bandwidth of NCCL and of each
// custom allreduce algorithm (comm/) for message sizes from min_bytes to max_bytes (powers of two),
// eager and inside a CUDA graph; the fused allreduce + residual + RMSNorm against three separate
// launches; and a sweep of the custom kernels' grid limit. One process per GPU: without a launcher's
// rank variables it starts one copy of this command per GPU itself. Rank 0 prints the tables and
// writes the JSON (device, date, commit, link type) under results_dir.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace splitflow::bench {

struct AllreduceBenchOptions {
  int nproc = 0;  // 0: every visible GPU
  size_t min_bytes = size_t{1} << 10;
  size_t max_bytes = size_t{64} << 20;
  std::string dtype = "bf16";
  int graph_calls = 20;  // allreduces per captured graph
  int trials = 7;        // timed repetitions; the median is reported
  // Grid limits to sweep for the custom kernels (empty: no sweep).
  std::vector<int> sweep_blocks = {16, 32, 64, 96, 132};
  // The fused-kernel comparison: rows x hidden for each row count (32 x 8192 bf16 = 512 KB).
  std::vector<size_t> fused_rows = {8, 16, 32, 64};
  size_t fused_hidden = 8192;
  std::string results_dir = "bench/results/allreduce";
};

// Runs the benchmark (launching the workers when needed). Throws splitflow::Error when it cannot
// run (no CUDA build, no GPU, a worker failed).
void run_allreduce_bench(const AllreduceBenchOptions& options);

}  // namespace splitflow::bench
