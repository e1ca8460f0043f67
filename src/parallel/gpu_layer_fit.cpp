#include "parallel/gpu_layer_fit.h"

#include "core/error.h"
#include "parallel/partition.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace splitflow {
namespace {

double gib(int64_t bytes) { return static_cast<double>(bytes) / double(int64_t{1} << 30); }

int64_t layer_stored_bytes(const LayerWeights& layer, const std::function<int64_t(const Tensor&)>& stored_bytes) {
  int64_t bytes = 0;
  for (const Tensor* tensor :
       {&layer.attn_norm, &layer.attn_norm_bias, &layer.wqkv, &layer.bqkv, &layer.wo, &layer.bo, &layer.ffn_norm,
        &layer.ffn_norm_bias, &layer.w_gate_up, &layer.b_gate_up, &layer.w_down, &layer.b_down, &layer.q_norm,
        &layer.k_norm, &layer.post_attn_norm, &layer.post_ffn_norm, &layer.cross_attn_norm,
        &layer.cross_attn_norm_bias, &layer.w_cross_q, &layer.b_cross_q, &layer.w_cross_kv, &layer.b_cross_kv,
        &layer.w_cross_o, &layer.b_cross_o}) {
    if (!tensor->empty()) bytes += stored_bytes(*tensor);
  }
  return bytes;
}

}  // namespace

GpuLayerFit fit_gpu_layers(const GpuLayerFitRequest& request) {
  const int layers = static_cast<int>(request.layer_bytes.size());
  SF_CHECK(layers > 0 && request.layer_kv_bytes.size() == request.layer_bytes.size(),
           "gpu layer fit: {} layers of weights but {} of KV cache", layers, request.layer_kv_bytes.size());
  SF_CHECK(request.head_bytes >= 0 && request.embed_bytes >= 0 && request.step_bytes >= 0 && request.split_bytes >= 0,
           "gpu layer fit: negative sizes (head {}, embeddings {}, step buffers {}, offload staging {})",
           request.head_bytes, request.embed_bytes, request.step_bytes, request.split_bytes);
  for (int i = 0; i < layers; ++i)
    SF_CHECK(request.layer_bytes[i] >= 0 && request.layer_kv_bytes[i] >= 0,
             "gpu layer fit: layer {} has negative sizes ({} weight bytes, {} KV bytes)", i, request.layer_bytes[i],
             request.layer_kv_bytes[i]);
  const DeviceMemoryInfo& memory = request.memory;
  SF_CHECK(memory.total_bytes > 0 && memory.free_bytes >= 0 && memory.free_bytes <= memory.total_bytes,
           "gpu layer fit: the device reports {} bytes free of {} in total", memory.free_bytes, memory.total_bytes);
  SF_CHECK(request.budget.memory_fraction > 0 && request.budget.memory_fraction <= 1,
           "gpu layer fit: memory fraction {} is outside (0, 1]", request.budget.memory_fraction);

  GpuLayerFit fit;
  fit.num_layers = layers;
  fit.usable_bytes = usable_memory_bytes(memory, request.budget);

  // Every layer with the embeddings (no split), else trailing layers one at a time from the last,
  // with the offload's staging when there is one.
  int64_t whole = request.head_bytes + request.step_bytes + request.embed_bytes;
  for (int i = 0; i < layers; ++i) whole += request.layer_bytes[i] + request.layer_kv_bytes[i];
  int64_t used = 0;
  int fitted = 0;
  if (whole <= fit.usable_bytes) {
    used = whole;
    fitted = layers;
  } else {
    int64_t placed = request.head_bytes + request.step_bytes + request.split_bytes;
    for (int n = 1; n < layers; ++n) {
      placed += request.layer_bytes[layers - n] + request.layer_kv_bytes[layers - n];
      if (placed > fit.usable_bytes) break;
      used = placed;
      fitted = n;
    }
  }
  const int64_t last_layer = request.layer_bytes.back() + request.layer_kv_bytes.back();
  SF_CHECK(fitted > 0,
           "-ngl auto: not even one layer fits on the GPU: {:.2f} GiB usable ({:.2f} GiB free of {:.2f} GiB, memory "
           "fraction {}, {:.2f} GiB reserved) against {:.2f} GiB for the head, {:.2f} GiB of step buffers and {:.2f} GiB "
           "for the last layer with its KV cache; run it with --device cpu, or shorten the context",
           gib(fit.usable_bytes), gib(memory.free_bytes), gib(memory.total_bytes), request.budget.memory_fraction,
           gib(request.budget.reserve_bytes), gib(request.head_bytes), gib(request.step_bytes + request.split_bytes),
           gib(last_layer));
  fit.gpu_layers = fitted;
  fit.gpu_bytes = used;
  fit.summary = fmt::format(
      "{} of {} layers on the GPU: {:.2f} GiB of {:.2f} GiB usable ({:.2f} GiB free of {:.2f} GiB, memory fraction {}, "
      "{:.2f} GiB reserved); the whole model with its KV cache would take {:.2f} GiB",
      fitted, layers, gib(used), gib(fit.usable_bytes), gib(memory.free_bytes), gib(memory.total_bytes),
      request.budget.memory_fraction, gib(request.budget.reserve_bytes), gib(whole));
  return fit;
}

int64_t split_kv_blocks(const GpuLayerFitRequest& per_token, int gpu_layers, int block_size, int64_t host_bytes,
                        int64_t max_blocks) {
  const int layers = static_cast<int>(per_token.layer_bytes.size());
  SF_CHECK(gpu_layers > 0 && gpu_layers <= layers && block_size > 0 && max_blocks > 0 &&
               per_token.layer_kv_bytes.size() == per_token.layer_bytes.size(),
           "split kv blocks: {} GPU layers of {}, blocks of {} tokens, at most {} blocks", gpu_layers, layers, block_size,
           max_blocks);
  const int64_t usable = usable_memory_bytes(per_token.memory, per_token.budget);
  int64_t gpu_weights = per_token.head_bytes + per_token.step_bytes + (gpu_layers < layers ? per_token.split_bytes : 0),
          gpu_block = 0, cpu_block = 0;
  for (int layer = 0; layer < layers; ++layer) {
    const bool on_gpu = layer >= layers - gpu_layers;
    if (on_gpu) gpu_weights += per_token.layer_bytes[layer];
    (on_gpu ? gpu_block : cpu_block) += per_token.layer_kv_bytes[layer] * block_size;
  }
  int64_t blocks = gpu_block > 0 ? std::max<int64_t>(usable - gpu_weights, 0) / gpu_block : INT32_MAX;
  if (cpu_block > 0) blocks = std::min(blocks, std::max<int64_t>(host_bytes, 0) / cpu_block);
  blocks = std::min<int64_t>({blocks, max_blocks, INT32_MAX});
  SF_CHECK(blocks >= 1,
           "GPU/CPU split: no KV cache block fits: {:.2f} GiB usable on the GPU against {:.2f} GiB of its layers, head and "
           "step buffers ({:.2f} MiB a block there), {:.2f} GiB of host memory ({:.2f} MiB a block of the CPU's layers); "
           "give fewer GPU layers or --num-blocks / --kv-cache-gb",
           gib(usable), gib(gpu_weights), static_cast<double>(gpu_block) / double(1 << 20), gib(host_bytes),
           static_cast<double>(cpu_block) / double(1 << 20));
  return blocks;
}

GpuLayerFitRequest gpu_layer_fit_request(const ModelSpec& spec, const ModelWeights& weights,
                                         const std::function<int64_t(const Tensor&)>& stored_bytes,
                                         int64_t context_tokens, DType cache_dtype, const RunnerLimits& limits,
                                         const DeviceMemoryInfo& memory, const KvCacheMemoryBudget& budget,
                                         std::optional<MatmulOffloadOptions> offload) {
  SF_CHECK(context_tokens > 0, "gpu layer fit: the context must hold at least one token, not {}", context_tokens);
  GpuLayerFitRequest request;
  request.memory = memory;
  request.budget = budget;
  for (int layer = 0; layer < spec.num_layers; ++layer) {
    request.layer_bytes.push_back(layer_stored_bytes(weights.layers.at(layer), stored_bytes));
    // One layer's spec keeps its attention kind (a sliding layer's cache is as long as a full one's
    // here: the paged cache does not shrink for windows).
    request.layer_kv_bytes.push_back(kv_cache_bytes_per_token(stage_spec(spec, layer, 1), cache_dtype) *
                                     context_tokens);
  }
  for (const Tensor* tensor : {&weights.final_norm, &weights.final_norm_bias, &weights.lm_head})
    if (!tensor->empty()) request.head_bytes += stored_bytes(*tensor);
  const bool tied = !weights.lm_head.empty() && weights.lm_head.data == weights.embed.data;
  for (const Tensor* tensor : {&weights.embed, &weights.pos_embed, &weights.embed_norm, &weights.embed_norm_bias})
    if (!tensor->empty() && !(tied && tensor == &weights.embed)) request.embed_bytes += stored_bytes(*tensor);
  // Step buffers, counted in f32 to be safe: a forward's activations (the fused QKV, gate and up,
  // a few residual-sized rows) and the f32 logits of every sequence.
  const int64_t q_dim = int64_t{spec.attention.num_heads} * spec.attention.head_dim;
  const int64_t kv_dim = int64_t{spec.attention.num_kv_heads} * spec.attention.head_dim;
  const int64_t row = q_dim + 2 * kv_dim + 2 * int64_t{spec.mlp.intermediate_size} + 4 * int64_t{spec.hidden_size};
  request.step_bytes = int64_t{limits.max_batch_tokens} * row * 4 +
                       int64_t{std::max(limits.max_seqs, 1)} * spec.vocab_size * 4;
  if (offload) {
    int64_t largest = 0, widest = 0;
    for (const LayerWeights& layer : weights.layers)
      for (const Tensor* matrix : {&layer.wqkv, &layer.wo, &layer.w_gate_up, &layer.w_down}) {
        if (matrix->empty() || matrix->shape.size() != 2) continue;
        largest = std::max(largest, stored_bytes(*matrix));
        widest = std::max({widest, matrix->shape[0], matrix->shape[1]});
      }
    request.split_bytes = MatmulOffloadBackend::staging_bytes(largest, widest, DType::BF16, *offload);
  }
  return request;
}

}  // namespace splitflow
