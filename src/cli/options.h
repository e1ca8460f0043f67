// cli/options.h — flags shared by the commands that load a model or sample tokens, so
// `generate`, `serve` and `bench` spell them the same way.
#pragma once

#include "backend/backend.h"
#include "backend/matmul_offload.h"
#include "engine/model_loader.h"
#include "engine/sampling_params.h"
#include "parallel/launch.h"
#include "parallel/local_pipeline.h"

#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace splitflow::cli {

// --quantization's vLLM spellings: f8_channel matrices with FP8 activations (W8A8) or without.
inline constexpr const char* kFp8W8A8 = "fp8";
inline constexpr const char* kFp8WeightOnly = "fp8-weight-only";

struct ModelFlags {
  ModelLoadOptions load;
  std::string weight_dtype = "auto";  // auto | f32 | f16 | bf16
  std::string quantization;           // empty, a quantized dtype name (core/dtype.h), or kFp8W8A8 / kFp8WeightOnly
  int threads = 0;                    // 0: OpenMP default
  std::string backend = "cpu";        // cpu | cuda (--backend, or --device as vLLM spells it)
  // llama.cpp's -ngl / --gpu-layers: a count (negative: every layer), or auto (gpu_layers_auto).
  std::optional<int> n_gpu_layers;
  bool gpu_layers_auto = false;
  // --offload-rows N with a GPU/CPU split: the CPU layers' matrix products of >= N rows run on the
  // GPU, each matrix copied over for its product (backend/matmul_offload.h; llama.cpp's op
  // offload). 0: off; unset: kDefaultOffloadRows (prefill 2-2.4x faster than without on the
  // H100, docs/parallel.md).
  std::optional<int> offload_rows;
  static constexpr int kDefaultOffloadRows = 32;
  std::optional<MatmulOffloadOptions> offload() const;

  // Resolves the flags into load options (parses --weight-dtype and --quantization).
  ModelLoadOptions options() const;
  // Fails, listing what the backend runs, when --quantization names a type it cannot run.
  void check_backend_runs(const Backend& backend) const;
  // The backend --backend names (cuda: GPU 0); fails when this build has no CUDA backend, or
  // (check_backend_runs) when it cannot run the --quantization type. Commands make it before
  // loading the model.
  std::unique_ptr<Backend> make_backend(const ParallelRank* rank = nullptr) const;
  // --tensor-parallel-size T --pipeline-parallel-size P: started by hand, this process launches
  // T x P ranks (one per GPU, parallel/launch.h) and exits with their status here; started by a
  // launcher, it joins the job as its rank. 1 x 1: a rank alone. Commands call it first, then
  // make_backend(&rank), load the model, rank.partition(model).
  ParallelRank join_ranks() const;
  int tensor_parallel_size = 1;
  int pipeline_parallel_size = 1;
  std::string pipeline_layers;  // "12,20": each stage's layer count (empty: balanced)
  // -ngl N / auto where the whole model runs on one device (chat; serve with tensor or pipeline
  // parallelism or an encoder-decoder model): fails
  // naming the split when N is below the layer count, or when auto finds the model (with a KV
  // cache of context_tokens) does not fit the GPU of `backend`.
  void check_gpu_layers(const LoadedModel& model, const Backend& backend, int64_t context_tokens) const;
  // -ngl N / auto with --device cuda, for a run with the KV cache `kv` and `limits`: the number of
  // layers on the GPU when the model is split between the GPU and the CPU (nullopt: the whole model
  // on one device). N: N when 0 < N < layers; auto: the most layers that fit `backend`'s GPU
  // (parallel/gpu_layer_fit.h, from its free memory now; logged). make_gpu_cpu_pipeline() builds
  // the split (parallel/local_pipeline.h): the first layers on the CPU (--threads), the last N and
  // the head on GPU 0, one thread each; its leader() is the runner to drive.
  // `budget`: the GPU memory share auto may fill (serve's --gpu-memory-utilization).
  std::optional<int> gpu_layer_split(const LoadedModel& model, const Backend& backend, const KvCacheConfig& kv,
                                     const RunnerLimits& limits, const KvCacheMemoryBudget& budget = {}) const;
  std::unique_ptr<LocalPipeline> make_gpu_cpu_pipeline(const LoadedModel& model, int gpu_layers, const KvCacheConfig& kv,
                                                       const RunnerLimits& limits) const;
};

void add_model_flags(CLI::App& command, ModelFlags& flags);

// --kv-cache-dtype, for the commands that run a model: auto (the backend's activation dtype),
// bf16, fp16 or fp8 (fp8_e4m3, vLLM's spelling too). The backend may still refuse the dtype.
void add_kv_cache_dtype_flag(CLI::App& command, std::string& kv_cache_dtype);
// The flag's value as KvCacheConfig::dtype (nullopt: auto); throws naming the flag and the
// accepted values.
std::optional<DType> parse_kv_cache_dtype_flag(const std::string& kv_cache_dtype);

// "101,2023,102" (a flag's comma-separated token ids) as integers; throws naming `flag` and the
// first item that is not one.
std::vector<int32_t> parse_id_list(const std::string& text, const char* flag);

struct SamplingFlags {
  SamplingParams params;
  std::string fsd = "off";
  uint64_t seed = 0;
  bool seed_given = false;

  SamplingParams resolve() const;  // applies fsd and seed; validate() is the caller's
};

void add_sampling_flags(CLI::App& command, SamplingFlags& flags);

}  // namespace splitflow::cli
