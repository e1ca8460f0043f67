// parallel/gpu_layer_fit.h — how many layers the GPU takes when the engine picks the GPU/CPU split
// itself (-ngl auto): the most trailing layers whose weights, in the bytes the GPU backend stores
// them in, and whose KV cache for the run's context fit the device's share of memory together with
// the head and the step buffers (the share as the KV cache sizing rule takes it:
// runtime/kv_cache_sizing.h). The first layers and the embeddings then stay on the CPU, as
// llama.cpp's -ngl places them. Pure arithmetic over sizes the caller measures: never a device.
#pragma once

#include "backend/backend.h"
#include "backend/matmul_offload.h"
#include "model/spec.h"
#include "model/weights.h"
#include "runtime/kv_cache_sizing.h"
#include "runtime/model_runner.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace splitflow {

struct GpuLayerFitRequest {
  std::vector<int64_t> layer_bytes;     // each layer's weights as the GPU stores them, in order
  std::vector<int64_t> layer_kv_bytes;  // each layer's KV cache for the run's context
  int64_t head_bytes = 0;               // final norm and LM head: on the GPU in every split
  int64_t embed_bytes = 0;              // embeddings: on the GPU only when every layer is
  int64_t step_bytes = 0;                // the GPU stage's step buffers (activations, logits)
  // With the matmul offload, the staging of the CPU layers' products (backend/matmul_offload.h):
  // on the GPU only in a split (when every layer fits there is no CPU layer to offload).
  int64_t split_bytes = 0;
  DeviceMemoryInfo memory;              // the GPU's, measured before anything of the model is on it
  KvCacheMemoryBudget budget;           // memory_fraction of the total, reserve_bytes kept free
};

struct GpuLayerFit {
  int gpu_layers = 0;        // the last gpu_layers layers on the GPU; every layer: no split
  int num_layers = 0;
  int64_t usable_bytes = 0;  // free - (1 - fraction) x total - reserve
  int64_t gpu_bytes = 0;     // what the chosen placement puts on the GPU
  std::string summary;       // every number, for the log
};

// The largest placement that fits. Throws naming the numbers when not even one layer with the head
// and the step buffers fits (the GPU would hold nothing useful: --device cpu runs the model), or
// on sizes that contradict each other (one KV entry per layer, nothing negative).
GpuLayerFit fit_gpu_layers(const GpuLayerFitRequest& request);

// The KV cache blocks of `block_size` tokens a split with the last `gpu_layers` layers on the GPU
// holds: what the GPU's share leaves after those layers' weights, the head and the step buffers,
// over one block of those layers' K and V; and no more than `host_bytes` hold of a block of the
// CPU's layers; and no more than `max_blocks` (what every sequence at full length takes: more would
// never be used, and a small model would otherwise take half the host's memory for its cache).
// `per_token` is a request sized for a context of one token (its layer_kv_bytes are per token).
// Throws naming the numbers when not one block fits.
int64_t split_kv_blocks(const GpuLayerFitRequest& per_token, int gpu_layers, int block_size, int64_t host_bytes,
                        int64_t max_blocks);

// The request for `spec` / `weights` on a GPU whose backend stores a tensor in `stored_bytes(t)`
// bytes (Backend::upload_bytes), with a KV cache of `context_tokens` tokens in `cache_dtype` and
// step buffers for `limits`, against `memory` and `budget`; with `offload`, the matmul offload's
// staging for the largest layer matrix too.
GpuLayerFitRequest gpu_layer_fit_request(const ModelSpec& spec, const ModelWeights& weights,
                                         const std::function<int64_t(const Tensor&)>& stored_bytes,
                                         int64_t context_tokens, DType cache_dtype, const RunnerLimits& limits,
                                         const DeviceMemoryInfo& memory, const KvCacheMemoryBudget& budget,
                                         std::optional<MatmulOffloadOptions> offload = std::nullopt);

}  // namespace splitflow
