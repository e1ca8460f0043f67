#include "cli/options.h"

#include "core/error.h"
#include "backend/upload_bytes.h"
#include "model/weights.h"
#include "parallel/gpu_layer_fit.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string_view>

namespace splitflow::cli {

ModelLoadOptions ModelFlags::options() const {
  ModelLoadOptions result = load;
  if (weight_dtype != "auto") {
    const DType dtype = parse_dtype(weight_dtype);
    SF_CHECK(dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16,
             "--weight-dtype must be auto, f32, f16 or bf16, not '{}'", weight_dtype);
    result.weight_dtype = dtype;
  }
  if (!quantization.empty()) {
    DType dtype = DType::F8_CHANNEL;  // fp8, fp8-weight-only: vLLM's spellings (make_backend sets W8A8)
    if (quantization != kFp8W8A8 && quantization != kFp8WeightOnly) {
      try {
        dtype = parse_dtype(quantization);
      } catch (const Error&) {
        fail("--quantization: unknown type '{}' (one of: {}, {}, {})", quantization, quantized_type_names(), kFp8W8A8,
             kFp8WeightOnly);
      }
    }
    SF_CHECK(is_quantized(dtype), "--quantization: '{}' is not a quantized type (one of: {}, {}, {})", quantization,
             quantized_type_names(), kFp8W8A8, kFp8WeightOnly);
    result.quantization = dtype;
#ifdef SPLITFLOW_HAS_CUDA
    // With --device cuda the quantizers run in device memory (the host's bytes, 23x faster on a 7B
    // model: docs/quantization.md); SPLITFLOW_QUANTIZE_ON_DEVICE=0 keeps them on the host.
    const char* on_device = std::getenv("SPLITFLOW_QUANTIZE_ON_DEVICE");
    if (backend == "cuda" && (on_device == nullptr || std::string_view(on_device) != "0"))
      result.quantizer = CudaMatrixQuantizer();  // its buffers live as long as these load options
#endif
  }
  return result;
}

void ModelFlags::check_backend_runs(const Backend& backend) const {
  const std::optional<DType> type = options().quantization;
  if (!type) return;
  const std::span<const DType> runnable = backend.weight_dtypes();
  SF_CHECK(std::find(runnable.begin(), runnable.end(), *type) != runnable.end(),
           "--quantization {}: the {} backend cannot run {} matrices (it runs {})", quantization, backend.name(),
           dtype_name(*type), dtype_names(runnable));
}

namespace {

[[noreturn]] void fail_layer_offload(int layers, const std::string& backend) {
  fail("-ngl/--n-gpu-layers {} with --device {}: layers are offloaded to a GPU with --device cuda (-ngl 0 with cpu "
       "and -ngl of at least the model's layers with cuda run the whole model on one device)",
       layers, backend);
}

}  // namespace

ParallelRank ModelFlags::join_ranks() const {
  ParallelLayout layout;
  layout.tensor_parallel = tensor_parallel_size;
  layout.pipeline_parallel = pipeline_parallel_size;
  SF_CHECK(tensor_parallel_size >= 1 && pipeline_parallel_size >= 1,
           "--tensor-parallel-size ({}) and --pipeline-parallel-size ({}) must be >= 1", tensor_parallel_size,
           pipeline_parallel_size);
  if (!pipeline_layers.empty()) layout.stage_layers = parse_stage_layers(pipeline_layers);
  SF_CHECK(layout.world_size() == 1 || backend == "cuda",
           "--tensor-parallel-size {} x --pipeline-parallel-size {} needs --device cuda (one process per GPU)",
           tensor_parallel_size, pipeline_parallel_size);
  if (const std::optional<int> exit_code = launch_local_ranks(layout.world_size())) {
    std::fflush(stdout);
    std::exit(*exit_code);  // the ranks did the work (and printed its output)
  }
  return ParallelRank::join(layout);
}

std::unique_ptr<Backend> ModelFlags::make_backend(const ParallelRank* rank) const {
  if (n_gpu_layers && *n_gpu_layers != 0 && backend == "cpu") fail_layer_offload(*n_gpu_layers, backend);
  if (n_gpu_layers && *n_gpu_layers == 0 && backend == "cuda") fail_layer_offload(*n_gpu_layers, backend);
  SF_CHECK(!gpu_layers_auto || backend == "cuda",
           "-ngl/--n-gpu-layers auto with --device {}: the engine picks how many layers the GPU takes with --device cuda",
           backend);
  SF_CHECK(offload_rows.value_or(0) >= 0, "--offload-rows must be 0 (off) or a row count, not {}", *offload_rows);
  SF_CHECK(offload_rows.value_or(0) == 0 || (backend == "cuda" && (gpu_layers_auto || n_gpu_layers)),
           "--offload-rows {}: the CPU layers' products go to the GPU only in a GPU/CPU split (--device cuda with "
           "-ngl N or auto)",
           *offload_rows);
  std::unique_ptr<Backend> made;
  if (backend == "cuda") {
#ifdef SPLITFLOW_HAS_CUDA
    made = rank != nullptr ? make_cuda_backend(rank->device(), CudaJobPlace{rank->tensor_group(), rank->pipeline_group(),
                                                                             nullptr, rank->rank()})
                           : make_cuda_backend(0);
#else
    fail("--backend cuda: this build has no CUDA backend (configure with -DSPLITFLOW_CUDA=ON)");
#endif
  } else {
    SF_CHECK(backend == "cpu", "--backend must be cpu or cuda, not '{}'", backend);
    made = make_cpu_backend(threads);
  }
  check_backend_runs(*made);
  SF_CHECK(quantization != kFp8W8A8 || made->set_fp8_activations(true),
           "--quantization fp8 (W8A8: activations quantized to FP8 for the tensor cores) runs with --device cuda on a "
           "Hopper GPU (sm_90), not on {}; --quantization fp8-weight-only keeps the activations in {}",
           made->name(), dtype_name(made->activation_dtype()));
  return made;
}

namespace {

// -ngl auto: the placement parallel/gpu_layer_fit.h picks on `backend`'s GPU.
GpuLayerFit fit_on_gpu(const LoadedModel& model, const Backend& backend, int64_t context_tokens,
                       std::optional<DType> kv_cache_dtype, const RunnerLimits& limits,
                       std::optional<MatmulOffloadOptions> offload, const KvCacheMemoryBudget& budget = {}) {
  const GpuLayerFitRequest request =
      gpu_layer_fit_request(model.spec, model.weights, cuda_upload_bytes, context_tokens,
                            resolve_kv_cache_dtype(backend, kv_cache_dtype), limits, backend.memory_info(), budget,
                            offload);
  GpuLayerFit fit = fit_gpu_layers(request);
  spdlog::info("-ngl auto: {}", fit.summary);
  return fit;
}

}  // namespace

void ModelFlags::check_gpu_layers(const LoadedModel& model, const Backend& device, int64_t context_tokens) const {
  const int64_t num_layers = model.spec.num_layers;
  // llama.cpp's -ngl 99 / -1: every layer on the GPU, which is what --device cuda does.
  if (n_gpu_layers && backend == "cuda" && *n_gpu_layers > 0 && *n_gpu_layers < num_layers)
    fail("-ngl/--n-gpu-layers {} of {} layers: this command runs the whole model on one device here; generate, serve "
         "and bench latency split a decoder-only model on one rank between the GPU and the CPU", *n_gpu_layers, num_layers);
  if (gpu_layers_auto && backend == "cuda") {
    const GpuLayerFit fit = fit_on_gpu(model, device, context_tokens, std::nullopt, RunnerLimits{}, std::nullopt);
    SF_CHECK(fit.gpu_layers == fit.num_layers,
             "-ngl auto: the model does not fit the GPU ({}); this command runs the whole model on one device here: "
             "generate, serve and bench latency split a decoder-only model on one rank between the GPU and the CPU, or "
             "give a shorter --max-model-len / --ctx-size",
             fit.summary);
  }
}

std::optional<int> ModelFlags::gpu_layer_split(const LoadedModel& model, const Backend& device,
                                               const KvCacheConfig& kv, const RunnerLimits& limits,
                                               const KvCacheMemoryBudget& budget) const {
  if (backend != "cuda" || !(gpu_layers_auto || n_gpu_layers)) return std::nullopt;
  const int num_layers = model.spec.num_layers;
  int gpu_layers = num_layers;
  if (gpu_layers_auto) {
    gpu_layers =
        fit_on_gpu(model, device, int64_t{kv.num_blocks} * kv.block_size, kv.dtype, limits, offload(), budget)
            .gpu_layers;
  } else if (*n_gpu_layers > 0) {
    gpu_layers = std::min(*n_gpu_layers, num_layers);
  }
  if (gpu_layers >= num_layers) return std::nullopt;
  SF_CHECK(tensor_parallel_size == 1 && pipeline_parallel_size == 1,
           "-ngl/--n-gpu-layers {} (a GPU/CPU split) is not combined with tensor or pipeline parallelism", gpu_layers);
  return gpu_layers;
}

std::unique_ptr<LocalPipeline> ModelFlags::make_gpu_cpu_pipeline(const LoadedModel& model, int gpu_layers,
                                                                 const KvCacheConfig& kv,
                                                                 const RunnerLimits& limits) const {
#ifdef SPLITFLOW_HAS_CUDA
  // As llama.cpp's -ngl: the last layers (and the head) on the GPU, the first ones on the CPU; with
  // --offload-rows, the CPU stage's large products on a CUDA backend of its own (its own stream).
  const int cpu_threads = threads;
  const std::optional<MatmulOffloadOptions> offload_options = offload();
  std::vector<LocalStage> stages = {
      {[cpu_threads, offload_options](std::shared_ptr<HostMailboxes> mailboxes, int rank) -> std::unique_ptr<Backend> {
         auto cpu = make_cpu_backend(cpu_threads, CpuJobPlace{nullptr, 0, std::move(mailboxes), rank});
         if (!offload_options) return cpu;
         return std::make_unique<MatmulOffloadBackend>(std::move(cpu), make_cuda_backend(0), *offload_options);
       },
       model.spec.num_layers - gpu_layers},
      {[](std::shared_ptr<HostMailboxes> mailboxes, int rank) {
         return make_cuda_backend(0, CudaJobPlace{nullptr, nullptr, std::move(mailboxes), rank});
       },
       gpu_layers}};
  auto pipeline = std::make_unique<LocalPipeline>(model.spec, model.weights, std::move(stages), kv, limits);
  spdlog::info("GPU/CPU split: {} (stage 0: cpu, stage 1: cuda)", pipeline->description());
  return pipeline;
#else
  fail("-ngl/--n-gpu-layers {}: this build has no CUDA backend", gpu_layers);
#endif
}

std::optional<MatmulOffloadOptions> ModelFlags::offload() const {
  const int rows = offload_rows.value_or(kDefaultOffloadRows);
  SF_CHECK(rows >= 0, "--offload-rows must be 0 (off) or a row count, not {}", rows);
  if (rows == 0) return std::nullopt;
  MatmulOffloadOptions options;
  options.min_rows = rows;
  return options;
}

void add_model_flags(CLI::App& command, ModelFlags& flags) {
  command.add_option("--model,-m", flags.load.model_path, "HF directory, .gguf, .safetensors or llama2.c .bin");
  command.add_option("--spec", flags.load.spec_path, "spec file overriding fields of the resolved model spec");
  command.add_option("--config", flags.load.config_path, "config.json or spec file giving the shape (--dummy-weights)");
  command.add_option("--tokenizer", flags.load.tokenizer_path, "tokenizer file overriding the one next to the model");
  command.add_flag("--dummy-weights", flags.load.dummy_weights, "seeded random weights instead of a checkpoint");
  command.add_option("--weight-seed", flags.load.seed, "seed of --dummy-weights");
  command.add_option("--weight-dtype", flags.weight_dtype, "matrices in memory: auto (as stored), f32, f16, bf16");
  command.add_option("--quantization", flags.quantization,
                     "quantize float projection matrices while loading: " + quantized_type_names() +
                         "; fp8 (W8A8 on Hopper: f8_channel weights, activations quantized to FP8 per row in "
                         "products of more than 8 rows), fp8-weight-only (f8_channel) (checkpoints already "
                         "quantized stay as stored)");
  command.add_option("--threads,-t", flags.threads, "CPU threads (0: all cores)");
  command.add_option("--backend,--device", flags.backend, "where the model runs: cpu or cuda")->capture_default_str();
  command.add_option("--tensor-parallel-size", flags.tensor_parallel_size,
                     "GPUs to split the model over (tensor parallelism, one process per GPU)")
      ->capture_default_str();
  command.add_option("--pipeline-parallel-size", flags.pipeline_parallel_size,
                     "pipeline stages, each a range of layers (one process per GPU; with --tensor-parallel-size a "
                     "grid of layer ranges x head ranges)")
      ->capture_default_str();
  command.add_option("--pipeline-layers", flags.pipeline_layers,
                     "each stage's layer count, e.g. 12,20 (default: as even as possible)");
  command
      .add_option_function<std::string>(
          "--n-gpu-layers,--gpu-layers",
          [&flags](const std::string& value) {
            flags.gpu_layers_auto = value == "auto";
            if (flags.gpu_layers_auto) return;
            int layers = 0;
            const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), layers);
            SF_CHECK(error == std::errc() && end == value.data() + value.size(),
                     "-ngl/--n-gpu-layers '{}': give a layer count or auto", value);
            flags.n_gpu_layers = layers;
          },
          "layers on the GPU (llama.cpp's -ngl) with --device cuda: N keeps the last N layers and the head on the GPU "
          "and runs the first ones on the CPU (generate, serve, bench latency); auto: as many as fit the GPU's free memory; "
          "99 or -1: every layer (the default); 0 only with --device cpu")
      ->type_name("N|auto");
  command.add_option("--offload-rows", flags.offload_rows,
                     "with a GPU/CPU split (-ngl): the CPU layers' matrix products of at least N rows (a prompt's) run "
                     "on the GPU, each matrix copied over for its product (llama.cpp's op offload); 0: off; default " +
                         std::to_string(ModelFlags::kDefaultOffloadRows));
}

void add_kv_cache_dtype_flag(CLI::App& command, std::string& kv_cache_dtype) {
  command.add_option("--kv-cache-dtype", kv_cache_dtype,
                     "KV cache elements: auto (the backend's activation dtype), bf16, fp16, fp8 (e4m3, half the bytes)")
      ->capture_default_str();
}

std::optional<DType> parse_kv_cache_dtype_flag(const std::string& kv_cache_dtype) {
  if (kv_cache_dtype == "auto") return std::nullopt;
  if (kv_cache_dtype == "bf16") return DType::BF16;
  if (kv_cache_dtype == "fp16") return DType::F16;
  if (kv_cache_dtype == "fp8" || kv_cache_dtype == "fp8_e4m3") return DType::F8E4M3;
  fail("--kv-cache-dtype must be auto, bf16, fp16 or fp8 (fp8_e4m3), not '{}'", kv_cache_dtype);
}

std::vector<int32_t> parse_id_list(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    try {
      size_t used = 0;
      ids.push_back(std::stoi(item, &used));
      SF_CHECK(used == item.size(), "{}: '{}' is not an integer", flag, item);
    } catch (const std::logic_error&) {
      fail("{}: '{}' is not an integer", flag, item);
    }
  }
  return ids;
}

SamplingParams SamplingFlags::resolve() const {
  SamplingParams result = params;
  result.fsd = fsd_mode_from_name(fsd);
  if (seed_given) result.seed = seed;
  return result;
}

void add_sampling_flags(CLI::App& command, SamplingFlags& flags) {
  SamplingParams& p = flags.params;
  command.add_option("--max-tokens,-n,--n-predict", p.max_tokens, "tokens to generate (-1: until the context is full)")
      ->capture_default_str();
  command.add_option("--temperature,--temp", p.temperature, "softmax temperature, 0 = greedy")->capture_default_str();
  command.add_option("--top-k", p.top_k, "keep the k most probable tokens (0 = off)");
  command.add_option("--top-p", p.top_p, "nucleus mass in (0, 1] (1 = off)");
  command.add_option("--min-p", p.min_p, "keep p >= min_p * p_max (0 = off)");
  command.add_option("--typical-p", p.typical_p, "locally typical mass in (0, 1] (1 = off)");
  command.add_option("--tfs-z", p.tfs_z, "tail-free sampling z in (0, 1] (1 = off)");
  command.add_option("--mirostat", p.mirostat, "mirostat version: 0 (off), 1 or 2");
  command.add_option("--mirostat-tau", p.mirostat_tau, "mirostat target surprise");
  command.add_option("--mirostat-eta", p.mirostat_eta, "mirostat learning rate");
  command.add_option("--repetition-penalty", p.repetition_penalty, "CTRL repetition penalty (1 = off)");
  command.add_option("--frequency-penalty", p.frequency_penalty, "OpenAI frequency penalty in [-2, 2]");
  command.add_option("--presence-penalty", p.presence_penalty, "OpenAI presence penalty in [-2, 2]");
  command.add_option("--fsd", flags.fsd, "frustratingly simple decoding: off, fsd, randomized");
  command.add_option("--fsd-alpha", p.fsd_alpha, "FSD anti-LM weight in [0, 1]");
  command.add_option("--fsd-top-k", p.fsd_top_k, "FSD candidates");
  command.add_option("--fsd-ngram", p.fsd_ngram_order, "FSD anti-LM n-gram order");
  command.add_option("--stop", p.stop, "stop string (repeatable); not part of the output");
  command.add_flag("--ignore-eos", p.ignore_eos, "keep generating past EOS");
  command.add_option("--seed,-s", flags.seed, "sampling seed")->each([&flags](const std::string&) { flags.seed_given = true; });
}

}  // namespace splitflow::cli
