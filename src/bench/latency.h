// bench/latency.h — `splitflow bench latency`: time to first token and time per output token for
// a batch of identical-length requests, against the roofline measured in the same run (weights
// and KV bytes streamed per decode step over the device's measured memory bandwidth).
#pragma once

#include "backend/backend.h"
#include "engine/model_loader.h"
#include "parallel/launch.h"
#include "parallel/local_pipeline.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>

namespace splitflow::bench {

struct LatencyOptions {
  int32_t input_len = 512;
  int32_t output_len = 128;
  int32_t batch = 1;
  int32_t max_batch_tokens = 2048;  // prefill chunk budget
  int32_t block_size = 16;
  // KvCacheConfig::dtype: nullopt is the backend's activation dtype.
  std::optional<DType> kv_cache_dtype = std::nullopt;
  uint64_t seed = 0;                // prompt token ids
  // One untimed prefill chunk and decode step first, so one-time costs (GEMM plan selection,
  // module load) stay out of the numbers; the timed run overwrites the same KV slots.
  bool warmup = false;
  // Timed runs of the whole prefill and of the decode steps (each run overwrites the same KV
  // slots); the report gives their means and standard deviations, as llama-bench's -r does.
  int32_t repetitions = 3;
  // The region marked for a profiler started with profiling off (scripts/gpu_profile.sh): the
  // prefill when set, else the decode steps.
  bool profile_prefill = false;
  // A parallel job (parallel/launch.h): this process is its rank 0 and `model` its part (the
  // runner runs the rank's partition and leads the other ranks). Bytes, bandwidth and FLOP/s are
  // then one GPU's; the report adds the job's sizes and aggregate.
  ParallelRank* parallel = nullptr;
  // A GPU/CPU split (-ngl, parallel/local_pipeline.h): builds the stages for the runner's cache
  // and limits (null: no split, the whole model runs on `backend`); the benchmark drives their
  // leader. Bytes and bandwidth are then the whole model's against the GPU's bandwidth.
  std::function<std::unique_ptr<LocalPipeline>(const LoadedModel&, const KvCacheConfig&, const RunnerLimits&)>
      gpu_cpu_split;
};

// Bytes a decode step must read from memory for the weights: every matrix, norm and bias once
// (the embedding table only for the gathered rows, so it is left out unless it is the LM head).
int64_t weight_stream_bytes(const ModelWeights& weights);

// What one step of a model costs the device, whatever the kernels.
struct ModelCost {
  int64_t weight_bytes = 0;         // read once per step (weight_stream_bytes)
  int64_t kv_bytes_per_token = 0;   // K and V of one position, every layer, in the cache dtype
  int64_t layer_matrix_params = 0;  // weights of the layers' matrices: 2 FLOPs each per token
  int64_t head_matrix_params = 0;   // the LM head's: 2 FLOPs each per sampled row
};
ModelCost model_cost(const ModelWeights& weights, int64_t kv_bytes_per_token);

// Runs the benchmark; `bandwidth_gbps` is the measured memory roofline and `gemm_tflops` the
// measured matrix rate (0: not measured, no prefill fraction reported). Returns the result JSON
// (without the device/date/commit header, which the caller adds).
nlohmann::json run_latency(LoadedModel model, Backend& backend, const LatencyOptions& options, double bandwidth_gbps,
                           double gemm_tflops = 0.0);

}  // namespace splitflow::bench
