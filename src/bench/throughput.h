// bench/throughput.h — `splitflow bench throughput`: offline serving throughput. N requests of
// input_len random prompt tokens are added to an in-process Engine at once (greedy, EOS ignored,
// so each produces exactly output_len tokens) and stepped until all finish. Reports output,
// total-token and request throughput over the whole run, and the decode step at saturation (pure
// decode steps at the largest batch seen) against its roofline: (weights + the KV bytes the step
// reads) / the measured memory bandwidth; and the whole run against the least time the workload
// can take on the device (throughput_bound). The engine warms up (Engine::warm_up) before the clock
// starts, so no step pays for recording a decode graph.
#pragma once

#include "backend/backend.h"
#include "bench/latency.h"
#include "engine/model_loader.h"
#include "parallel/launch.h"
#include "engine/scheduler.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>

namespace splitflow::bench {

struct ThroughputOptions {
  int32_t num_requests = 1000;
  int32_t input_len = 1000;
  int32_t output_len = 1000;
  int32_t max_batch_tokens = 2048;  // the SplitFuse token budget of one step
  int32_t max_seqs = 256;
  bool splitfuse = true;            // false: prefill-first
  int32_t steps_in_flight = 0;      // EngineOptions::max_steps_in_flight; 0: the job's pipeline stages
  double kv_cache_gb = 0;           // > 0: a cache of this many GiB
  // Set (with kv_cache_gb 0): the cache is what device memory leaves at this fraction of the
  // device's total (KvCacheMemoryBudget, runtime/kv_cache_sizing.h), holding one request at least.
  // Neither: room for min(N, max_seqs) whole requests.
  std::optional<double> kv_cache_memory_fraction = std::nullopt;
  double swap_space_gb = 4;         // host memory for KV swapped out by preemption (0: recompute only)
  int32_t swap_min_tokens = SchedulerConfig{}.swap_min_tokens;  // swap a victim whose recompute reruns >= this
  int32_t block_size = 16;
  // KvCacheConfig::dtype: nullopt is the backend's activation dtype.
  std::optional<DType> kv_cache_dtype = std::nullopt;
  uint64_t seed = 0;                // prompt token ids
  // A parallel job: this process is its rank 0 and `model` its part (as LatencyOptions::parallel);
  // bytes and bandwidth are one GPU's.
  ParallelRank* parallel = nullptr;
};

// Throws naming the flag at fault (counts, lengths past the model's context, a budget below
// max_seqs); run_throughput() checks the same.
void check_throughput_options(const ThroughputOptions& options, const ModelSpec& spec);

// KV cache blocks the options ask for, for a model whose cache takes kv_bytes_per_block per block;
// 0 when kv_cache_memory_fraction leaves the count to the runner.
int64_t throughput_kv_blocks(const ThroughputOptions& options, int64_t kv_bytes_per_block);

// The least time the options' workload can take on a device that streams `bandwidth_gbps` and
// multiplies at `gemm_tflops` (0: not measured, the FLOP terms drop out). What every run must do:
// - steps: each decodes at most max_seqs tokens and runs at most max_batch_tokens, so at least
//   max(N (out - 1) / max_seqs, N (in + out - 1) / max_batch_tokens) of them, each reading the
//   weights once;
// - KV reads: every decode step of a request reads its whole context, in + j positions at its
//   j-th decode step (the first output token comes from the prefill);
// - matrix FLOPs: the layers' for every token, the head's for every output token.
// Left out, so the bound stays low: attention FLOPs, the prefill's own KV traffic, activations.
struct ThroughputBound {
  int64_t min_steps = 0;
  double weight_read_bytes = 0;  // min_steps x the weights
  double kv_read_bytes = 0;
  double gemm_flops = 0;
  // The decode attention runs beside no GEMM (this engine's step: kernels in sequence), and each
  // step's GEMMs take the longer of reading the weights and computing:
  // kv / B + max(weights / B, flops / G).
  double serial_s = 0;
  // Every byte and FLOP overlapped: max((kv + weights) / B, flops / G).
  double overlapped_s = 0;
};
ThroughputBound throughput_bound(const ThroughputOptions& options, const ModelCost& cost, double bandwidth_gbps,
                                 double gemm_tflops);

// Runs the benchmark; `bandwidth_gbps` and `gemm_tflops` are the memory and matrix rooflines
// measured in the same process (gemm_tflops 0: not measured). Returns the result JSON without the
// device/date/commit header (the caller adds it).
nlohmann::json run_throughput(LoadedModel model, Backend& backend, const ThroughputOptions& options,
                              double bandwidth_gbps, double gemm_tflops);

}  // namespace splitflow::bench
