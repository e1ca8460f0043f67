#include "runtime/model_runner.h"

#include "core/error.h"
#include "runtime/rope.h"
#include "runtime/step_command.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

namespace splitflow {
namespace {

// Backend::set_tuning on for a scope (off again if the work throws).
struct TuningScope {
  Backend& backend;
  explicit TuningScope(Backend& b) : backend(b) { backend.set_tuning(true); }
  ~TuningScope() { backend.set_tuning(false); }
  TuningScope(const TuningScope&) = delete;
  TuningScope& operator=(const TuningScope&) = delete;
};

bool is_float_dtype(DType dtype) { return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16; }

// Checks presence (or absence), shape and dtype of one weight. Matrices keep their dtype (the
// backend reads F32/F16/BF16); vectors (norms, biases) become F32.
Tensor checked(Tensor tensor, const std::string& name, const Shape& shape, bool required, bool matrix) {
  if (!required) {
    SF_CHECK(tensor.empty(), "weight {}: present, but the spec has no such module (check its bias/norm fields)", name);
    return tensor;
  }
  SF_CHECK(!tensor.empty(), "weight {}: missing, the spec needs it with shape {}", name, shape_str(shape));
  SF_CHECK(tensor.shape == shape, "weight {}: shape {}, the spec needs {}", name, shape_str(tensor.shape),
           shape_str(shape));
  // Quantized and Mixed matrices go to the backend as they are (its upload() refuses a type
  // outside weight_dtypes()).
  const bool packed_matrix = matrix && (is_quantized(tensor.dtype) || tensor.dtype == DType::Mixed);
  SF_CHECK(is_float_dtype(tensor.dtype) || packed_matrix, "weight {}: dtype {}, expected f32, f16 or bf16{}", name,
           dtype_name(tensor.dtype), matrix ? " or a quantized type" : "");
  if (!matrix && tensor.dtype != DType::F32) return to_dtype(tensor, DType::F32);
  return tensor;
}

const DeviceBuffer kNoBuffer;  // an absent bias

DeviceBuffer upload_or_empty(Backend& backend, const Tensor& tensor) {
  return tensor.empty() ? DeviceBuffer() : backend.upload(tensor);
}

// "Attention is all you need": PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(same);
// SinusoidLayout::Halves (HF Marian) puts the sines in columns [0, d/2) and the cosines after.
Tensor sinusoidal_table(int64_t positions, int64_t hidden, SinusoidLayout layout) {
  Tensor table = Tensor::zeros(DType::F32, {positions, hidden});
  float* out = table.as<float>();
  const bool halves = layout == SinusoidLayout::Halves;
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t i = 0; i < hidden; i += 2) {
      const double angle = static_cast<double>(p) / std::pow(10000.0, static_cast<double>(i) / hidden);
      const int64_t sin_column = halves ? i / 2 : i, cos_column = halves ? hidden / 2 + i / 2 : i + 1;
      out[p * hidden + sin_column] = static_cast<float>(std::sin(angle));
      if (i + 1 < hidden) out[p * hidden + cos_column] = static_cast<float>(std::cos(angle));
    }
  return table;
}

}  // namespace

DType resolve_kv_cache_dtype(const Backend& backend, std::optional<DType> requested) {
  const DType dtype = requested.value_or(backend.activation_dtype());
  const std::span<const DType> stored = backend.kv_cache_dtypes();
  SF_CHECK(std::find(stored.begin(), stored.end(), dtype) != stored.end(),
           "kv cache: the {} backend does not store a {} KV cache (it stores {})", backend.name(), dtype_name(dtype),
           dtype_names(stored));
  return dtype;
}

int64_t kv_cache_bytes_per_token(const ModelSpec& spec, DType cache_dtype) {
  const int64_t layers = spec.num_layers * (spec.network == NetworkType::EncoderDecoder ? 2 : 1);  // + cross K/V
  return int64_t{2} * layers * spec.attention.num_kv_heads * spec.attention.head_dim *
         static_cast<int64_t>(dtype_size(cache_dtype));
}

ModelRunner::ModelRunner(const ModelSpec& spec, ModelWeights weights, Backend& backend, KvCacheConfig kv_config,
                         RunnerLimits limits, RunnerPartition partition)
    : spec_(spec),
      plan_(partition.plan ? std::move(*partition.plan) : build_layer_plan(spec)),
      pipeline_(partition.pipeline),
      vocab_shard_(partition.vocab),
      backend_(backend),
      kv_config_(kv_config),
      limits_(limits) {
  if (spec.network == NetworkType::EncoderDecoder) {
    SF_CHECK(!partition.plan && partition.pipeline.first() && partition.pipeline.last(),
             "network: encoder_decoder models run on one rank (no tensor or pipeline parallelism yet)");
    SF_CHECK(backend.has_encoder_decoder_kernels(),
             "network: encoder_decoder models need cross-attention and relative position bias kernels, which the {} "
             "backend does not have yet (use the cpu backend)", backend.name());
  }
  SF_CHECK(spec.position != PositionType::ALiBi, "position: alibi is not supported by the runtime yet");
  const AttentionSpec& attention = spec.attention;
  SF_CHECK(spec.hidden_size > 0 && spec.num_layers > 0 && spec.vocab_size > 0 && spec.max_position > 0,
           "spec: hidden_size {}, num_layers {}, vocab_size {} and max_position {} must all be > 0", spec.hidden_size,
           spec.num_layers, spec.vocab_size, spec.max_position);
  SF_CHECK(attention.num_heads > 0 && attention.num_kv_heads > 0 && attention.num_heads % attention.num_kv_heads == 0 &&
               attention.head_dim > 0,
           "attention: num_heads {} must be a positive multiple of num_kv_heads {}, head_dim {} > 0", attention.num_heads,
           attention.num_kv_heads, attention.head_dim);
  SF_CHECK(spec.mlp.intermediate_size > 0, "mlp.intermediate_size: must be > 0, got {}", spec.mlp.intermediate_size);
  if (kv_config.memory_budget) {
    SF_CHECK(kv_config.num_blocks == 0 && kv_config.block_size > 0,
             "kv cache: num_blocks ({}) must be 0 when sized from memory, and block_size ({}) > 0",
             kv_config.num_blocks, kv_config.block_size);
  } else {
    SF_CHECK(kv_config.num_blocks > 0 && kv_config.block_size > 0,
             "kv cache: num_blocks ({}) and block_size ({}) must be > 0", kv_config.num_blocks, kv_config.block_size);
  }
  SF_CHECK(kv_config.num_host_blocks >= 0, "kv cache: num_host_blocks must not be negative, got {}",
           kv_config.num_host_blocks);
  SF_CHECK(limits.max_batch_tokens > 0 && limits.max_seqs > 0,
           "runner limits: max_batch_tokens ({}) and max_seqs ({}) must be > 0", limits.max_batch_tokens,
           limits.max_seqs);

  q_dim_ = int64_t{attention.num_heads} * attention.head_dim;
  kv_dim_ = int64_t{attention.num_kv_heads} * attention.head_dim;
  mlp_up_width_ = spec.mlp.gated ? 2 * int64_t{spec.mlp.intermediate_size} : spec.mlp.intermediate_size;
  norm_params_ = {spec.norm.type, static_cast<float>(spec.norm.eps), static_cast<float>(spec.norm.weight_offset)};
  if (spec.position == PositionType::Rope)
    rope_params_ = {attention.num_heads, attention.num_kv_heads, attention.head_dim, spec.rotary_dim(), spec.rope.style};
  attention_params_ = {attention.num_heads,  attention.num_kv_heads, attention.head_dim, kv_config.block_size,
                       static_cast<float>(spec.attention_scale()), attention.sliding_window,
                       static_cast<float>(attention.logit_softcap), attention.causal};

  const DType act = backend.activation_dtype(), cache_dtype = resolve_kv_cache_dtype(backend, kv_config.dtype);
  // An automatic cache is sized below, once everything but it is allocated: until then the
  // position tables cover every position the context allows.
  const int64_t cache_tokens_bound = kv_config.memory_budget ? std::numeric_limits<int64_t>::max()
                                                             : int64_t{kv_config.num_blocks} * kv_config.block_size;
  set_cache_extent(cache_tokens_bound);
  upload_weights(weights);
  fold_norm_weights();
  build_position_tables(std::min(context_limit_, cache_tokens_bound));

  const int64_t max_tokens = limits.max_batch_tokens, hidden = spec.hidden_size;
  if (kv_config.num_host_blocks > 0) {
    const Shape host_shape = {kv_config.num_host_blocks, cache_layers(), kv_config.block_size, attention.num_kv_heads,
                              attention.head_dim};
    const size_t host_bytes = static_cast<size_t>(shape_numel(host_shape)) * dtype_size(cache_dtype);
    k_host_ = backend.allocate_host(host_bytes);
    v_host_ = backend.allocate_host(host_bytes);
    k_host_view_ = DeviceTensor{k_host_.get(), cache_dtype, host_shape};
    v_host_view_ = DeviceTensor{v_host_.get(), cache_dtype, host_shape};
  }

  const auto width = [&](Slot s) -> int64_t {
    switch (s) {
      case Slot::Qkv: return q_dim_ + 2 * kv_dim_;
      case Slot::AttnOut: return q_dim_;
      case Slot::MlpUp: return mlp_up_width_;
      case Slot::MlpAct: return spec.mlp.intermediate_size;
      case Slot::CrossQ: return q_dim_;
      default: return hidden;
    }
  };
  // proj only when a step uses it (post norms, tensor parallelism's partial sums).
  const bool uses_proj = std::any_of(plan_.steps.begin(), plan_.steps.end(), [](const PlanStep& step) {
    return step.input == Slot::Proj || step.output == Slot::Proj;
  });
  slots_.resize(static_cast<size_t>(Slot::CrossQ) + 1);
  // The residual stream's rows round up to whole shares of the stage-to-stage transfer.
  const int64_t split = pipeline_.split;
  const int64_t hidden_rows = (max_tokens + split - 1) / split * split;
  for (size_t s = static_cast<size_t>(Slot::Hidden); s < slots_.size(); ++s)
    if ((static_cast<Slot>(s) != Slot::Proj || uses_proj) && (static_cast<Slot>(s) != Slot::CrossQ || encoder_decoder()))
      slots_[s] = backend.allocate(act, {static_cast<Slot>(s) == Slot::Hidden ? hidden_rows : max_tokens,
                                         width(static_cast<Slot>(s))});
  // Logits rows are computed in chunks so All mode does not need [max_batch_tokens, vocab]. An
  // encoder has no head: its output is the hidden slot.
  if (!encoder()) {
    logit_rows_capacity_ = std::min<int64_t>(max_tokens, std::max<int64_t>(limits.max_seqs, 16));
    if (pipeline_.last()) {
      selected_ = backend.allocate(act, {logit_rows_capacity_, hidden});
      selected_normed_ = backend.allocate(act, {logit_rows_capacity_, hidden});
    }
    if (pipeline_.has_output()) logits_ = backend.allocate(DType::F32, {logit_rows_capacity_, spec.vocab_size});
    if (pipeline_.last() && vocab_shard_.rows > 0) {
      SF_CHECK(vocab_shard_.rows * vocab_shard_.size == spec.vocab_size && vocab_shard_.rank >= 0 &&
                   vocab_shard_.rank < vocab_shard_.size,
               "a vocab-parallel head of {} x {} rows (rank {}) for a vocabulary of {}", vocab_shard_.size,
               vocab_shard_.rows, vocab_shard_.rank, spec.vocab_size);
      vocab_parts_ = backend.allocate(DType::F32, {vocab_shard_.size * logit_rows_capacity_, vocab_shard_.rows});
    }
  }
  d_sampled_ = backend.allocate(DType::I32, {max_tokens});

  if (kv_config.memory_budget) {
    kv_config_.num_blocks = size_kv_cache_from_memory(*kv_config.memory_budget, cache_dtype);
    set_cache_extent(int64_t{kv_config_.num_blocks} * kv_config.block_size);
  }
  const Shape cache_shape = {cache_layers(), kv_config_.num_blocks, kv_config.block_size, attention.num_kv_heads,
                             attention.head_dim};
  k_cache_ = backend.allocate(cache_dtype, cache_shape);
  v_cache_ = backend.allocate(cache_dtype, cache_shape);
  allocate_step_buffers();
}

void ModelRunner::set_cache_extent(int64_t cache_tokens) {
  // Dynamic NTK exists to run past max_position (HF sets no limit): only the cache bounds it.
  const bool dynamic_ntk =
      spec_.position == PositionType::Rope && spec_.rope.scaling.type == RopeScalingType::DynamicNTK;
  context_limit_ = dynamic_ntk ? cache_tokens : spec_.max_position;
  const int64_t block_size = kv_config_.block_size;
  max_blocks_per_seq_ = static_cast<int32_t>(
      std::min<int64_t>((std::min(context_limit_, cache_tokens) + block_size - 1) / block_size, INT32_MAX));
}

int32_t ModelRunner::size_kv_cache_from_memory(const KvCacheMemoryBudget& budget, DType cache_dtype) {
  // A block costs its K and V, and an entry in each of max_seqs rows of the staged block tables
  // ([max_seqs, max_blocks_per_seq] I32, allocated after the cache; max_blocks_per_seq <= blocks).
  const int64_t block_bytes = kv_cache_bytes_per_token(spec_, cache_dtype) * kv_config_.block_size +
                              int64_t{limits_.max_seqs} * static_cast<int64_t>(sizeof(int32_t));
  backend_.synchronize();
  kv_cache_sizing_ = size_kv_cache(backend_.memory_info(), budget, block_bytes, kv_config_.block_size);
  const KvCacheSizing& sizing = *kv_cache_sizing_;
  const double gib = double(int64_t{1} << 30);
  spdlog::info("kv cache: {} blocks of {} tokens ({:.2f} GiB {}) from device memory: {:.2f} GiB free of {:.2f} GiB, "
               "memory fraction {}, reserve {:.2f} GiB",
               sizing.num_blocks, kv_config_.block_size,
               static_cast<double>(sizing.num_blocks * kv_cache_bytes_per_token(spec_, cache_dtype) *
                                   kv_config_.block_size) / gib,
               dtype_name(cache_dtype), static_cast<double>(sizing.memory.free_bytes) / gib,
               static_cast<double>(sizing.memory.total_bytes) / gib, budget.memory_fraction,
               static_cast<double>(budget.reserve_bytes) / gib);
  return static_cast<int32_t>(sizing.num_blocks);
}

void ModelRunner::swap_blocks(std::span<const BlockCopy> copies, CopyDirection direction) {
  if (copies.empty()) return;
  if (leader_channel_) {
    StepCall call{StepCallKind::SwapBlocks};
    call.copies.assign(copies.begin(), copies.end());
    call.direction = direction;
    publish_call(encode_step_call(call));
  }
  SF_CHECK(kv_config_.num_host_blocks > 0, "swap_blocks: {} block copies, but the runner has no host swap area",
           copies.size());
  backend_.copy_blocks(k_cache_.view(), k_host_view_, copies, direction);
  backend_.copy_blocks(v_cache_.view(), v_host_view_, copies, direction);
}

void ModelRunner::allocate_step_buffers() {
  const int64_t max_tokens = limits_.max_batch_tokens, max_seqs = limits_.max_seqs;
  const int64_t sizes[kStepFields] = {max_tokens, max_tokens, max_tokens, max_tokens, max_tokens,
                                      max_tokens * kSamplingRowWords, max_seqs + 1, max_seqs, max_seqs,
                                      max_seqs * int64_t{max_blocks_per_seq_}};
  int64_t offset = 0;
  for (int f = 0; f < kStepFields; ++f) {
    step_sections_[f] = {offset, sizes[f]};
    offset += (sizes[f] + 15) / 16 * 16;  // 64-byte aligned sections (SamplingRow holds 8-byte fields)
  }
  staging_ = backend_.allocate_host(static_cast<size_t>(offset) * sizeof(int32_t));
  d_step_ = backend_.allocate(DType::I32, {offset});
  logit_rows_.reserve(max_tokens);
}

DeviceTensor ModelRunner::step_view(StepField field, int64_t count) const {
  return d_step_.view().rows(step_sections_[field].offset, count);
}

void ModelRunner::upload_weights(ModelWeights& weights) {
  const ModelSpec& spec = spec_;
  const AttentionSpec& attention = spec.attention;
  const int64_t hidden = spec.hidden_size, vocab = spec.vocab_size, inter = spec.mlp.intermediate_size;
  const bool norm_bias = spec.norm.bias;

  // A pipeline stage holds the embeddings only when it is the first, the head only when the last.
  if (pipeline_.first()) {
    SF_CHECK(!vocab_shard_.embed || vocab_shard_.rows > 0, "a vocab-parallel embedding needs the vocabulary's split");
    const int64_t embed_rows = vocab_shard_.embed ? vocab_shard_.rows + 1 : vocab;
    embed_ = backend_.upload(checked(weights.embed, "embed", {embed_rows, hidden}, true, true));
    if (spec.position == PositionType::Learned)
      pos_embed_ = backend_.upload(checked(weights.pos_embed, "pos_embed", {spec.max_position, hidden}, true, true));
    embed_norm_ =
        upload_or_empty(backend_, checked(weights.embed_norm, "embed_norm", {hidden}, spec.embedding_norm, false));
    embed_norm_bias_ = upload_or_empty(backend_, checked(weights.embed_norm_bias, "embed_norm_bias", {hidden},
                                                         spec.embedding_norm && norm_bias, false));
  }
  // Encoders and post-norm decoders may end without a norm (post-norm layers end normed).
  const bool final_norm = (spec.network == NetworkType::DecoderOnly || !spec.tensors.final_norm.empty()) &&
                          pipeline_.last();
  Tensor final_norm_weight = checked(weights.final_norm, "final_norm", {hidden}, final_norm, false);
  Tensor final_norm_bias = checked(weights.final_norm_bias, "final_norm_bias", {hidden}, final_norm && norm_bias, false);
  SF_CHECK(spec.logits_multiplier == 1.0 || !final_norm_weight.empty() || !pipeline_.last(),
           "logits_multiplier: {} needs a final_norm to scale", spec.logits_multiplier);
  if (spec.logits_multiplier != 1.0) {
    // logits * m = (norm(x) * m) W^T: the multiplier scales the final norm's weight and bias.
    const auto scaled = [&](const Tensor& t) {
      if (t.empty()) return t;
      const Tensor f32 = to_dtype(t, DType::F32);
      Tensor out = Tensor::zeros(DType::F32, t.shape);
      for (int64_t i = 0; i < out.numel(); ++i)
        out.as<float>()[i] = f32.as<float>()[i] * static_cast<float>(spec.logits_multiplier);
      return out;
    };
    final_norm_weight = scaled(final_norm_weight);
    final_norm_bias = scaled(final_norm_bias);
  }
  final_norm_ = upload_or_empty(backend_, final_norm_weight);
  final_norm_bias_ = upload_or_empty(backend_, final_norm_bias);
  if (spec.position == PositionType::Relative) {
    const RelativeAttentionSpec& relative = spec.relative_attention;
    // Uploaded as a vector, which every backend keeps in f32 (a GPU stores float matrices in bf16).
    Tensor table = checked(weights.relative_bias, "relative_bias", {relative.num_buckets, attention.num_heads}, true,
                           false);
    table.shape = {table.numel()};
    relative_bias_ = backend_.upload(table);
    position_bias_ = {relative_bias_.view().reshape({relative.num_buckets, attention.num_heads}), relative.num_buckets,
                      relative.max_distance, !attention.causal};
  }
  if (!encoder() && pipeline_.last()) {
    // A tied head shares the embedding's buffer rather than uploading the matrix twice.
    const int64_t head_rows = vocab_shard_.rows > 0 ? vocab_shard_.rows : vocab;
    const Tensor lm_head = checked(weights.lm_head, "lm_head", {head_rows, hidden}, true, true);
    const bool tied = !embed_.empty() && lm_head.dtype == weights.embed.dtype && lm_head.shape == weights.embed.shape &&
                      (lm_head.generated ? weights.embed.generated && lm_head.generated->key == weights.embed.generated->key
                                         : lm_head.data == weights.embed.data);
    lm_head_ = tied ? embed_ : backend_.upload(lm_head);
    SF_CHECK(weights.logits_bias.empty() || vocab_shard_.rows == 0,
             "logits_bias: not supported with the vocabulary split over tensor-parallel ranks");
    logits_bias_ = upload_or_empty(backend_, checked(weights.logits_bias, "logits_bias", {vocab},
                                                     !spec.tensors.logits_bias.empty(), false));
  }

  SF_CHECK(static_cast<int>(weights.layers.size()) == spec.num_layers, "weights: {} layers, the spec has num_layers {}",
           weights.layers.size(), spec.num_layers);
  const bool qkv_bias = attention.q_bias || attention.k_bias || attention.v_bias;
  layers_.resize(spec.num_layers);
  for (int l = 0; l < spec.num_layers; ++l) {
    LayerWeights& w = weights.layers[l];
    DeviceLayer& d = layers_[l];
    const auto name = [l](const char* what) { return fmt::format("layer {} {}", l, what); };
    const auto up = [&](Tensor& t, const char* what, const Shape& shape, bool required, bool matrix) {
      DeviceBuffer buffer = upload_or_empty(backend_, checked(t, name(what), shape, required, matrix));
      t = Tensor();  // drop the host reference as soon as the backend holds it
      return buffer;
    };
    d.attn_norm = up(w.attn_norm, "attn_norm", {hidden}, true, false);
    d.attn_norm_bias = up(w.attn_norm_bias, "attn_norm_bias", {hidden}, norm_bias, false);
    d.wqkv = up(w.wqkv, "wqkv", {q_dim_ + 2 * kv_dim_, hidden}, true, true);
    d.bqkv = up(w.bqkv, "bqkv", {q_dim_ + 2 * kv_dim_}, qkv_bias, false);
    d.wo = up(w.wo, "wo", {hidden, q_dim_}, true, true);
    d.bo = up(w.bo, "bo", {hidden}, attention.o_bias, false);
    d.ffn_norm = up(w.ffn_norm, "ffn_norm", {hidden}, !spec.shared_layer_norm, false);
    d.ffn_norm_bias = up(w.ffn_norm_bias, "ffn_norm_bias", {hidden}, !spec.shared_layer_norm && norm_bias, false);
    d.w_gate_up = up(w.w_gate_up, "w_gate_up", {mlp_up_width_, hidden}, true, true);
    d.b_gate_up = up(w.b_gate_up, "b_gate_up", {mlp_up_width_}, spec.mlp.up_bias, false);
    d.w_down = up(w.w_down, "w_down", {hidden, inter}, true, true);
    d.b_down = up(w.b_down, "b_down", {hidden}, spec.mlp.down_bias, false);
    d.q_norm = up(w.q_norm, "q_norm", {attention.head_dim}, attention.qk_norm, false);
    d.k_norm = up(w.k_norm, "k_norm", {attention.head_dim}, attention.qk_norm, false);
    d.post_attn_norm = up(w.post_attn_norm, "post_attn_norm", {hidden}, spec.post_norms, false);
    d.post_ffn_norm = up(w.post_ffn_norm, "post_ffn_norm", {hidden}, spec.post_norms, false);
    const bool cross = encoder_decoder();
    d.cross_attn_norm = up(w.cross_attn_norm, "cross_attn_norm", {hidden}, cross, false);
    d.cross_attn_norm_bias = up(w.cross_attn_norm_bias, "cross_attn_norm_bias", {hidden}, cross && norm_bias, false);
    d.w_cross_q = up(w.w_cross_q, "w_cross_q", {q_dim_, hidden}, cross, true);
    d.b_cross_q = up(w.b_cross_q, "b_cross_q", {q_dim_}, cross && attention.q_bias, false);
    d.w_cross_kv = up(w.w_cross_kv, "w_cross_kv", {2 * kv_dim_, hidden}, cross, true);
    d.b_cross_kv = up(w.b_cross_kv, "b_cross_kv", {2 * kv_dim_}, cross && (attention.k_bias || attention.v_bias), false);
    d.w_cross_o = up(w.w_cross_o, "w_cross_o", {hidden, q_dim_}, cross, true);
    d.b_cross_o = up(w.b_cross_o, "b_cross_o", {hidden}, cross && attention.o_bias, false);
  }
}

void ModelRunner::fold_norm_weights() {
  if (spec_.norm.type != NormType::RMSNorm) return;
  bool folded = false;
  for (DeviceLayer& layer : layers_)
    for (const PlanStep& step : plan_.steps) {
      if (step.norm == LayerWeight::None || step.norm_bias) continue;
      const auto [norm_weight, norm_bias] = layer_weight(layer, step.norm);
      const auto [w, bias] = layer_weight(layer, step.weight);
      const bool done = backend_.fold_norm_weight(w->view(), norm_weight->view(), norm_params_.weight_offset);
      if (!folded && !done) return;  // the backend keeps norm weights apart
      SF_CHECK(done, "{} folded some norm weights into their matrices but not the {} norm's", backend_.name(),
               layer_weight_name(step.norm));
      folded = true;
    }
  if (!folded) return;
  for (DeviceLayer& layer : layers_) {
    for (const PlanStep& step : plan_.steps)
      if (step.norm == LayerWeight::AttnNorm) layer.attn_norm = DeviceBuffer();
      else if (step.norm == LayerWeight::FfnNorm) layer.ffn_norm = DeviceBuffer();
  }
  Tensor ones = Tensor::zeros(DType::F32, {spec_.hidden_size});
  std::fill_n(ones.as<float>(), ones.numel(), 1.0f);
  unit_norm_weight_ = backend_.upload(ones);
}

void ModelRunner::build_position_tables(int64_t max_positions) {
  if (spec_.position == PositionType::Sinusoidal)
    pos_embed_ = backend_.upload(sinusoidal_table(spec_.max_position, spec_.hidden_size, spec_.sinusoid_layout));
  if (spec_.position != PositionType::Rope) return;
  // Positions a sequence can reach (bounded by the context and the cache's capacity); past
  // rope_static_length length-specific frequencies take over, and the table stops there.
  static_rope_rows_ = std::min(max_positions, rope_static_length(spec_));
  rope_static_length_ = rope_static_length(spec_);
  const int64_t rotary_dim = spec_.rotary_dim(), half = rotary_dim / 2;
  const int64_t rows = static_rope_rows_ + limits_.max_batch_tokens;
  Tensor table = Tensor::zeros(DType::F32, {rows, 2, half});
  const RopeFrequencies freqs = rope_frequencies(spec_, 0);
  for (int64_t p = 0; p < static_rope_rows_; ++p) fill_rope_row(freqs, p, table.as<float>() + p * rotary_dim);
  rope_table_ = backend_.allocate(DType::F32, table.shape);
  backend_.copy_to_device(table.data, rope_table_.view());
  step_rope_rows_.resize(static_cast<size_t>(limits_.max_batch_tokens) * rotary_dim);

  sliding_rope_layer_.assign(spec_.num_layers, false);
  if (!spec_.rope.sliding) return;
  for (int l = 0; l < spec_.num_layers; ++l) sliding_rope_layer_[l] = spec_.layer_attention(l) == LayerAttention::Sliding;
  ModelSpec sliding = spec_;
  sliding.rope.theta = spec_.rope.sliding->theta;
  sliding.rope.scaling = spec_.rope.sliding->scaling;
  sliding.rope.sliding.reset();
  SF_CHECK(rope_static_length(sliding) == std::numeric_limits<int64_t>::max(),
           "rope.sliding.scaling: a length-dependent scaling (dynamic, longrope) for sliding layers is not supported");
  const RopeFrequencies sliding_freqs = rope_frequencies(sliding, 0);
  sliding_inv_freq_ = sliding_freqs.inv_freq;
  sliding_attention_factor_ = sliding_freqs.attention_factor;
  for (int64_t p = 0; p < static_rope_rows_; ++p) fill_rope_row(sliding_freqs, p, table.as<float>() + p * rotary_dim);
  sliding_rope_table_ = backend_.allocate(DType::F32, table.shape);
  backend_.copy_to_device(table.data, sliding_rope_table_.view());
  step_sliding_rope_rows_.resize(step_rope_rows_.size());
}

namespace {

// Decode steps are recorded per bucket of batch sizes: 1, 2, 4, 8, then multiples of 8 up to
// 64 and of 32 past it (at most max_seqs); a step's spans are padded up to its bucket.
int32_t decode_bucket(int64_t seqs, int32_t max_seqs) {
  int64_t bucket = 1;
  while (bucket < seqs && bucket < 8) bucket *= 2;
  if (seqs > 8) bucket = seqs <= 64 ? (seqs + 7) / 8 * 8 : (seqs + 31) / 32 * 32;
  return static_cast<int32_t>(std::min<int64_t>(bucket, max_seqs));
}

}  // namespace

std::vector<int32_t> ModelRunner::decode_buckets() const {
  const int32_t cap = std::min(limits_.max_seqs, limits_.max_batch_tokens);
  std::vector<int32_t> buckets;
  for (int32_t seqs = 1; seqs <= cap; ++seqs) {
    const int32_t bucket = decode_bucket(seqs, cap);
    if (buckets.empty() || buckets.back() != bucket) buckets.push_back(bucket);
  }
  return buckets;
}

int32_t ModelRunner::stage_batch(const ForwardBatch& batch, std::span<const SamplingRow> sampling, bool write_kv) {
  const int64_t tokens = batch.num_tokens(), seqs = static_cast<int64_t>(batch.spans.size());
  const int32_t block_size = kv_config_.block_size;
  const int64_t cache_tokens = int64_t{kv_config_.num_blocks} * block_size;
  SF_CHECK(seqs > 0, "forward batch: no spans");
  SF_CHECK(tokens <= limits_.max_batch_tokens, "forward batch: {} tokens, more than the runner's max_batch_tokens {}",
           tokens, limits_.max_batch_tokens);
  SF_CHECK(seqs <= limits_.max_seqs, "forward batch: {} spans, more than the runner's max_seqs {}", seqs,
           limits_.max_seqs);

  // Validate every span first.
  int64_t total = 0;
  for (int64_t s = 0; s < seqs; ++s) {
    const SequenceSpan& span = batch.spans[s];
    SF_CHECK(span.num_tokens >= 1, "forward batch: span {} has num_tokens {}, expected >= 1", s, span.num_tokens);
    SF_CHECK(span.start_position >= 0, "forward batch: span {} has start_position {}, expected >= 0", s,
             span.start_position);
    const int64_t end = int64_t{span.start_position} + span.num_tokens;
    SF_CHECK(end <= context_limit_,
             "forward batch: span {} reaches {} tokens, past the model's context of {} tokens (max_position)", s, end,
             context_limit_);
    SF_CHECK(end <= cache_tokens, "forward batch: span {} reaches {} tokens, past the KV cache's {} blocks of {} tokens",
             s, end, kv_config_.num_blocks, block_size);
    SF_CHECK(span.encoder_tokens >= 0 && span.encoder_tokens <= cache_tokens,
             "forward batch: span {} has encoder_tokens {}, outside [0, {}]", s, span.encoder_tokens, cache_tokens);
    SF_CHECK(encoder_decoder() || span.encoder_tokens == 0,
             "forward batch: span {} has encoder_tokens {}, but the model has no encoder", s, span.encoder_tokens);
    const int64_t covered = std::max<int64_t>(end, span.encoder_tokens);
    const int64_t needed = (covered + block_size - 1) / block_size;
    SF_CHECK(static_cast<int64_t>(span.block_table.size()) >= needed,
             "forward batch: span {} covers positions [0, {}) but its block_table has {} blocks of {} tokens, needs {}",
             s, covered, span.block_table.size(), block_size, needed);
    for (int64_t b = 0; b < needed; ++b)
      SF_CHECK(span.block_table[b] >= 0 && span.block_table[b] < kv_config_.num_blocks,
               "forward batch: span {} block_table[{}] = {} is outside the cache's blocks [0, {})", s, b,
               span.block_table[b], kv_config_.num_blocks);
    total += span.num_tokens;
  }
  SF_CHECK(total == tokens, "forward batch: token_ids has {} tokens but the spans add up to {}", tokens, total);

  int32_t* token_ids = staged(kTokenIds);
  int32_t* positions = staged(kPositions);
  int32_t* slot_ids = staged(kSlots);
  int32_t* rope_rows = staged(kRopeRows);
  int32_t* query_start = staged(kQueryStart);
  int32_t* context_lens = staged(kContextLens);
  int32_t* block_tables = staged(kBlockTables);
  int32_t* cross_context_lens = staged(kCrossContextLens);
  int32_t max_encoder_tokens = 0;
  const int64_t table_width = max_blocks_per_seq_;
  step_rope_count_ = 0;
  logit_rows_.clear();
  query_start[0] = 0;
  int32_t max_query_len = 0, max_context_len = 0;
  const int64_t rotary_dim = spec_.position == PositionType::Rope ? spec_.rotary_dim() : 0;
  for (int64_t s = 0, t = 0; s < seqs; ++s) {
    const SequenceSpan& span = batch.spans[s];
    const int64_t end = int64_t{span.start_position} + span.num_tokens;
    const bool length_specific_rope = rotary_dim > 0 && end > rope_static_length_;
    RopeFrequencies freqs;
    if (length_specific_rope) freqs = rope_frequencies(spec_, end);
    for (int32_t i = 0; i < span.num_tokens; ++i, ++t) {
      const int32_t token = batch.token_ids[t], position = span.start_position + i;
      SF_CHECK(token >= 0 && token < spec_.vocab_size,
               "forward batch: token id {} (span {}, token {}) is outside the vocabulary [0, {})", token, s, i,
               spec_.vocab_size);
      // With the embedding split, the row in this rank's part (its last row, zeros, for the others').
      const int64_t local = int64_t{token} - vocab_shard_.rank * vocab_shard_.rows;
      token_ids[t] = !vocab_shard_.embed ? token
                                         : static_cast<int32_t>(local >= 0 && local < vocab_shard_.rows ? local
                                                                                                       : vocab_shard_.rows);
      positions[t] = position;
      slot_ids[t] = write_kv ? span.block_table[position / block_size] * block_size + position % block_size : -1;
      if (length_specific_rope) {
        fill_rope_row(freqs, position, step_rope_rows_.data() + step_rope_count_ * rotary_dim);
        if (!sliding_rope_table_.empty())
          fill_rope_row({sliding_inv_freq_, sliding_attention_factor_}, position,
                        step_sliding_rope_rows_.data() + step_rope_count_ * rotary_dim);
        rope_rows[t] = static_cast<int32_t>(static_rope_rows_ + step_rope_count_++);
      } else {
        rope_rows[t] = position;
      }
      if (batch.logits_mode == LogitsMode::All) logit_rows_.push_back(static_cast<int32_t>(t));
    }
    if (batch.logits_mode == LogitsMode::Last && span.want_logits) logit_rows_.push_back(static_cast<int32_t>(t - 1));
    query_start[s + 1] = static_cast<int32_t>(t);
    context_lens[s] = static_cast<int32_t>(end);
    cross_context_lens[s] = span.encoder_tokens;
    max_encoder_tokens = std::max(max_encoder_tokens, span.encoder_tokens);
    const int64_t needed = (std::max<int64_t>(end, span.encoder_tokens) + block_size - 1) / block_size;
    std::copy_n(span.block_table.begin(), needed, block_tables + s * table_width);
    max_query_len = std::max(max_query_len, span.num_tokens);
    max_context_len = std::max(max_context_len, static_cast<int32_t>(end));
  }
  const int64_t rows = static_cast<int64_t>(logit_rows_.size());
  SF_CHECK(sampling.empty() || static_cast<int64_t>(sampling.size()) == rows,
           "forward_sample: {} sampling rows for {} logits rows", sampling.size(), rows);
  std::copy(logit_rows_.begin(), logit_rows_.end(), staged(kLogitRows));

  // A decode step (one token per span, each sampled) replays its bucket's recording: pad the
  // spans with dummies that write no KV (slot -1) and read one cached position of block 0. Its
  // logits row s is token s (issue_head's rows_are_tokens).
  const bool decode = !encoder() && !encoder_decoder() && limits_.record_decode && backend_.can_record() && max_query_len == 1 && tokens == seqs &&
                      batch.logits_mode == LogitsMode::Last && rows == seqs && step_rope_count_ == 0;
  const int32_t bucket = decode ? decode_bucket(seqs, std::min(limits_.max_seqs, limits_.max_batch_tokens)) : 0;
  const int64_t staged_seqs = std::max<int64_t>(seqs, bucket);
  for (int64_t s = seqs; s < staged_seqs; ++s) {
    token_ids[s] = 0;
    positions[s] = 0;
    slot_ids[s] = -1;
    rope_rows[s] = 0;
    staged(kLogitRows)[s] = static_cast<int32_t>(s);
    query_start[s + 1] = static_cast<int32_t>(s + 1);
    context_lens[s] = 1;
    block_tables[s * table_width] = 0;
  }
  auto* sampling_rows = reinterpret_cast<SamplingRow*>(staged(kSamplingRows));
  std::copy(sampling.begin(), sampling.end(), sampling_rows);
  std::fill(sampling_rows + sampling.size(), sampling_rows + std::max<int64_t>(rows, staged_seqs), SamplingRow{});

  const int64_t staged_words = step_sections_[kBlockTables].offset + staged_seqs * table_width;
  backend_.copy_to_device(staging_.get(), d_step_.view().rows(0, staged_words));
  if (step_rope_count_ > 0)
    backend_.copy_to_device(step_rope_rows_.data(), rope_table_.view().rows(static_rope_rows_, step_rope_count_));
  if (step_rope_count_ > 0 && !sliding_rope_table_.empty())
    backend_.copy_to_device(step_sliding_rope_rows_.data(),
                            sliding_rope_table_.view().rows(static_rope_rows_, step_rope_count_));
  const DeviceTensor tables = step_view(kBlockTables, staged_seqs * table_width).reshape({staged_seqs, table_width});
  // A recording sizes its attention split for any context it may replay at: the cache's bound.
  // Eager decode steps on a recording backend use the bound too, so they split the KV (and round)
  // exactly as a replay of the same step would.
  const int32_t context_bound = static_cast<int32_t>(std::min<int64_t>(context_limit_, cache_tokens));
  const bool bound_context = bucket > 0 || (max_query_len == 1 && backend_.can_record());
  attention_batch_ = {step_view(kQueryStart, staged_seqs + 1), step_view(kContextLens, staged_seqs), tables,
                      max_query_len, bound_context ? context_bound : max_context_len};
  cross_batch_ = {attention_batch_.query_start, step_view(kCrossContextLens, staged_seqs), tables, max_query_len,
                  max_encoder_tokens};
  staged_ = true;
  return bucket;
}

const DeviceTensor& ModelRunner::slot(Slot s) const { return slots_[static_cast<size_t>(s)].view(); }

DeviceTensor ModelRunner::slot_rows(Slot s, int64_t tokens) const {
  return s == Slot::None ? DeviceTensor{} : slot(s).rows(0, tokens);
}

std::pair<const DeviceBuffer*, const DeviceBuffer*> ModelRunner::layer_weight(const DeviceLayer& layer,
                                                                              LayerWeight w) const {
  switch (w) {
    case LayerWeight::AttnNorm: return {&layer.attn_norm, &layer.attn_norm_bias};
    case LayerWeight::FfnNorm: return {&layer.ffn_norm, &layer.ffn_norm_bias};
    case LayerWeight::Qkv: return {&layer.wqkv, &layer.bqkv};
    case LayerWeight::Output: return {&layer.wo, &layer.bo};
    case LayerWeight::GateUp: return {&layer.w_gate_up, &layer.b_gate_up};
    case LayerWeight::Down: return {&layer.w_down, &layer.b_down};
    case LayerWeight::QkNorm: return {&layer.q_norm, &layer.k_norm};  // (q weight, k weight)
    case LayerWeight::PostAttnNorm: return {&layer.post_attn_norm, &kNoBuffer};
    case LayerWeight::PostFfnNorm: return {&layer.post_ffn_norm, &kNoBuffer};
    case LayerWeight::CrossAttnNorm: return {&layer.cross_attn_norm, &layer.cross_attn_norm_bias};
    case LayerWeight::CrossQ: return {&layer.w_cross_q, &layer.b_cross_q};
    case LayerWeight::CrossOutput: return {&layer.w_cross_o, &layer.b_cross_o};
    case LayerWeight::PositionBias: return {&relative_bias_, &kNoBuffer};
    case LayerWeight::None: break;
  }
  fail("layer plan: step has no weight");
}

InputNorm ModelRunner::input_norm(const DeviceLayer& layer, const PlanStep& step, int64_t tokens) const {
  if (step.norm == LayerWeight::None) return {};
  if (!unit_norm_weight_.empty() && !step.norm_bias)  // folded into the step's matrix
    return {unit_norm_weight_.view(), {}, {norm_params_.type, norm_params_.eps, 0.0f}, slot_rows(step.normed, tokens),
            true};
  const auto [w, b] = layer_weight(layer, step.norm);
  return {w->view(), b->view(), norm_params_, slot_rows(step.normed, tokens)};
}

void ModelRunner::run_layer(int layer, int64_t tokens) {
  const DeviceLayer& weights = layers_[layer];
  const Shape cache_shape = {kv_config_.num_blocks, kv_config_.block_size, spec_.attention.num_kv_heads,
                             spec_.attention.head_dim};
  const DeviceTensor k_cache = k_cache_.view().rows(layer, 1).reshape(cache_shape);
  const DeviceTensor v_cache = v_cache_.view().rows(layer, 1).reshape(cache_shape);
  AttentionParams attention_params = attention_params_;
  attention_params.sliding_window = spec_.layer_sliding_window(layer);
  const DeviceTensor rope_table = sliding_rope_layer_.empty() || !sliding_rope_layer_[layer]
                                      ? rope_table_.view() : sliding_rope_table_.view();
  for (const PlanStep& step : plan_.steps) {
    const DeviceTensor input = slot_rows(step.input, tokens);
    const DeviceTensor output = slot_rows(step.output, tokens);
    switch (step.kind) {
      case StepKind::Norm: {
        const auto [w, b] = layer_weight(weights, step.weight);
        backend_.add_norm(input, {}, w->view(), b->view(), norm_params_, output);
        break;
      }
      case StepKind::Linear: {
        const auto [w, b] = layer_weight(weights, step.weight);
        backend_.matmul(input, w->view(), b->view(), output, step.accumulate);
        break;
      }
      case StepKind::LinearRopeWriteKv: {
        const auto [w, b] = layer_weight(weights, step.weight);
        backend_.matmul_rope_write_kv(input_norm(weights, step, tokens), input, w->view(), b->view(), output,
                                      rope_table,
                                      step_view(kRopeRows, tokens), rope_params_, step_view(kSlots, tokens),
                                      attention_params, k_cache, v_cache);
        break;
      }
      case StepKind::WriteKv:
        backend_.write_kv(input, step_view(kSlots, tokens), attention_params, k_cache, v_cache);
        break;
      case StepKind::RopeWriteKv:
        backend_.rope_write_kv(input, rope_table, step_view(kRopeRows, tokens), rope_params_, step_view(kSlots, tokens),
                               attention_params, k_cache, v_cache);
        break;
      case StepKind::QkNorm:
        backend_.qk_norm(input, weights.q_norm.view(), weights.k_norm.view(), norm_params_, attention_params);
        break;
      case StepKind::NormAdd: {
        const auto [w, b] = layer_weight(weights, step.weight);
        backend_.norm_add(input, w->view(), norm_params_, output);
        break;
      }
      case StepKind::Attention:
        if (step.weight == LayerWeight::PositionBias)
          backend_.attention_with_position_bias(input, k_cache, v_cache, attention_batch_, attention_params,
                                                position_bias_, output);
        else
          backend_.attention(input, k_cache, v_cache, attention_batch_, attention_params, output);
        break;
      case StepKind::CrossAttention: {
        const int cross_layer = spec_.num_layers + layer;
        backend_.cross_attention(input, k_cache_.view().rows(cross_layer, 1).reshape(cache_shape),
                                 v_cache_.view().rows(cross_layer, 1).reshape(cache_shape), cross_batch_,
                                 attention_params, output);
        break;
      }
      case StepKind::LinearActivation: {
        const auto [w, b] = layer_weight(weights, step.weight);
        backend_.matmul_activation(input_norm(weights, step, tokens), input, w->view(), b->view(),
                                   spec_.mlp.activation, spec_.mlp.gated, slot_rows(step.product, tokens), output);
        break;
      }
      case StepKind::Allreduce:
        backend_.allreduce(input, step.output == step.input ? DeviceTensor{} : output);
        break;
    }
  }
}

void ModelRunner::issue_layers(int64_t tokens) {
  const DeviceTensor hidden = slot_rows(Slot::Hidden, tokens);
  if (pipeline_.first()) {
    const bool adds_positions = !vocab_shard_.embed || vocab_shard_.rank == 0;
    backend_.embed(embed_.view(), step_view(kTokenIds, tokens), static_cast<float>(spec_.embedding_multiplier),
                   adds_positions ? pos_embed_.view() : DeviceTensor{}, step_view(kPositions, tokens), hidden);
    if (vocab_shard_.embed) backend_.allreduce(hidden, {});  // every token's row is on one rank
    if (!embed_norm_.empty())  // in place: the norm of the summed embeddings is the residual stream
      backend_.add_norm(hidden, {}, embed_norm_.view(), embed_norm_bias_.view(), norm_params_, hidden);
  } else {  // the previous stage's residual stream: this rank's share, then every rank's
    backend_.recv(hidden_share(tokens), pipeline_.prev);
    if (pipeline_.split > 1) backend_.allgather_rows(slot_rows(Slot::Hidden, hidden_share(tokens).dim(0) * pipeline_.split));
  }
  for (int layer = 0; layer < spec_.num_layers; ++layer) {
    run_layer(layer, tokens);
    if (layer_listener_) layer_listener_(layer);
  }
  if (!pipeline_.last()) backend_.send(hidden_share(tokens), pipeline_.next);
}

DeviceTensor ModelRunner::hidden_share(int64_t tokens) const {
  const int64_t rows = (tokens + pipeline_.split - 1) / pipeline_.split;
  return slot(Slot::Hidden).rows(pipeline_.split_rank * rows, rows);
}

void ModelRunner::issue_head(int64_t begin, int64_t count, bool sample, bool rows_are_tokens) {
  // What the head leaves: the sampled tokens or the logits rows.
  const auto output = [&] { return sample ? d_sampled_.view().rows(begin, count) : logits_.view().rows(0, count); };
  if (!pipeline_.last()) {  // the last stage has the head; the leader gets what it computed
    if (pipeline_.receives_output()) backend_.recv(output(), pipeline_.output_source);
    return;
  }
  const DeviceTensor normed = selected_normed_.view().rows(0, count);
  const DeviceTensor logits = logits_.view().rows(0, count);
  DeviceTensor selected = slot_rows(Slot::Hidden, begin + count).rows(begin, count);
  if (!rows_are_tokens) {
    selected = selected_.view().rows(0, count);
    backend_.gather_rows(slot(Slot::Hidden), step_view(kLogitRows, begin + count).rows(begin, count), selected);
  }
  const DeviceTensor head_input = final_norm_.empty() ? selected : normed;  // post-norm layers end normed (BART)
  if (!final_norm_.empty())
    backend_.add_norm(selected, {}, final_norm_.view(), final_norm_bias_.view(), norm_params_, normed);
  if (vocab_shard_.rows > 0) {  // this rank's vocabulary columns, then every rank's
    const DeviceTensor parts = vocab_parts_.view().rows(0, vocab_shard_.size * count);
    backend_.matmul(head_input, lm_head_.view(), {}, parts.rows(vocab_shard_.rank * count, count), false);
    backend_.gather_columns(parts, logits);
  } else {
    backend_.matmul(head_input, lm_head_.view(), logits_bias_.view(), logits, false);
  }
  if (spec_.final_logit_softcap > 0.0) backend_.softcap(logits, static_cast<float>(spec_.final_logit_softcap));
  if (sample) {
    const int64_t words = step_sections_[kSamplingRows].offset + begin * kSamplingRowWords;
    backend_.sample(logits, d_step_.view().rows(words, count * kSamplingRowWords).reshape({count, kSamplingRowWords}),
                    d_sampled_.view().rows(begin, count));
  }
  if (pipeline_.sends_output()) backend_.send(output(), pipeline_.leader);
}

void ModelRunner::replay_decode(int32_t bucket, bool sample) {
  auto& recording = decode_recordings_[{bucket, sample}];
  if (recording == nullptr && backend_.can_record()) {
    // The bucket's first step runs eagerly once, with tuning on, before it is recorded, so what the
    // backend tunes at a shape's first use (CUDA times GEMM algorithms) happens outside stream
    // capture. Issuing a decode step twice gives the same result: the same K/V to the same slots,
    // counter-based sampling.
    {
      const TuningScope tuning(backend_);
      issue_layers(bucket);
      issue_head(0, bucket, sample, /*rows_are_tokens=*/true);
    }
    recording = backend_.record([&] {
      issue_layers(bucket);
      issue_head(0, bucket, sample, /*rows_are_tokens=*/true);
    });
  }
  if (recording != nullptr) {
    recording->replay();
    return;
  }
  issue_layers(bucket);  // the backend cannot record: issue the same work eagerly
  issue_head(0, bucket, sample, /*rows_are_tokens=*/true);
}

bool ModelRunner::issue_warmup_step(const ForwardBatch& batch, bool sample) {
  const std::vector<SamplingRow> greedy(sample ? batch.spans.size() : 0);
  const int32_t bucket = stage_batch(batch, greedy, /*write_kv=*/false);
  const bool records = bucket > 0 && !decode_recordings_.contains({bucket, sample});
  if (bucket > 0) {
    replay_decode(bucket, sample);
  } else {
    issue_layers(batch.num_tokens());
    const int64_t rows = static_cast<int64_t>(logit_rows_.size());
    for (int64_t begin = 0; begin < rows; begin += logit_rows_capacity_)
      issue_head(begin, std::min(logit_rows_capacity_, rows - begin), sample);
  }
  backend_.synchronize();
  return records && decode_recordings_.at({bucket, sample}) != nullptr;
}

WarmupReport ModelRunner::warm_up(bool device_sampling) {
  WarmupReport report;
  if (leader_channel_) {
    StepCall call{StepCallKind::WarmUp};
    call.device_sampling = device_sampling;
    publish_call(encode_step_call(call));
  }
  const auto start = std::chrono::steady_clock::now();
  if (!backend_.can_record() && !encoder() && limits_.warm_up_steps) {
    // Nothing to record, but one eager decode step makes what a backend prepares at a matrix's
    // first product (the CPU's repacked copies: seconds for a large model) before the first request.
    ForwardBatch batch;
    batch.token_ids.assign(1, 0);
    batch.spans.assign(1, SequenceSpan{1, 0, {0}, true});
    issue_warmup_step(batch, false);
    report.decode_buckets = {1};
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    spdlog::info("warm-up: one eager decode step on the {} backend (its weights prepared at their first product): {:.2f} s",
                 backend_.name(), report.seconds);
    return report;
  }
  if (!backend_.can_record() || encoder() || !limits_.warm_up_steps) {
    spdlog::info("warm-up: nothing to prepare on the {} backend{}", backend_.name(),
                 limits_.warm_up_steps ? "" : " (a pipeline over different backends warms up none of its stages)");
    return report;
  }
  // Decode: every bucket, each span one token at position 0 of block 0.
  report.decode_buckets = decode_buckets();
  for (const int32_t bucket : report.decode_buckets) {
    ForwardBatch batch;
    batch.token_ids.assign(bucket, 0);
    batch.spans.assign(bucket, SequenceSpan{1, 0, {0}, true});
    for (const bool sample : {false, true}) {
      if (sample && !device_sampling) continue;
      report.decode_recordings += issue_warmup_step(batch, sample) ? 1 : 0;
    }
  }
  // Prefill-shaped: the longest span one step and the context allow, its block table all block 0.
  const int64_t cache_tokens = int64_t{kv_config_.num_blocks} * kv_config_.block_size;
  const int32_t tokens =
      static_cast<int32_t>(std::min<int64_t>({limits_.max_batch_tokens, context_limit_, cache_tokens}));
  const bool mixed = tokens >= 2 && limits_.max_seqs >= 2;
  const int32_t long_span = mixed ? tokens - 1 : tokens;
  const int32_t long_span_blocks = (long_span + kv_config_.block_size - 1) / kv_config_.block_size;
  ForwardBatch prefill;
  prefill.token_ids.assign(tokens, 0);
  prefill.spans.push_back(SequenceSpan{long_span, 0, std::vector<int32_t>(long_span_blocks, 0), true});
  if (mixed) prefill.spans.push_back(SequenceSpan{1, 0, {0}, true});
  issue_warmup_step(prefill, false);
  report.prefill_tokens = tokens;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  spdlog::info("warm-up: decode batch sizes {} ({} recordings), prefill-shaped step of {} tokens: {:.2f} s",
               fmt::join(report.decode_buckets, ","), report.decode_recordings, report.prefill_tokens, report.seconds);
  return report;
}

namespace {

// An encoder_decoder's decoder spans attend to their sequence's encoder K/V: each must say how long it is.
void check_encoder_tokens(const ModelSpec& spec, const ForwardBatch& batch) {
  if (spec.network != NetworkType::EncoderDecoder) return;
  for (size_t s = 0; s < batch.spans.size(); ++s)
    SF_CHECK(batch.spans[s].encoder_tokens > 0,
             "forward batch: span {} has no encoder_tokens, but an encoder_decoder's decoder attends to its encoder's "
             "K/V (write_encoder_kv first)", s);
}

StepCall forward_call(StepCallKind kind, const ForwardBatch& batch, std::span<const SamplingRow> rows = {}) {
  StepCall call{kind, batch};
  call.rows.assign(rows.begin(), rows.end());
  return call;
}

}  // namespace

void ModelRunner::write_encoder_kv(const ForwardBatch& batch, const Tensor& states) {
  SF_CHECK(encoder_decoder(), "write_encoder_kv: {} has no encoder", spec_.name.empty() ? "this model" : spec_.name);
  const int64_t tokens = batch.num_tokens(), hidden = spec_.hidden_size;
  SF_CHECK(states.dtype == DType::F32 && states.shape == (Shape{tokens, hidden}),
           "write_encoder_kv: states {} {}, expected f32 [{}, {}] (the encoder's forward_hidden of the batch)",
           dtype_name(states.dtype), shape_str(states.shape), tokens, hidden);
  for (size_t s = 0; s < batch.spans.size(); ++s)
    SF_CHECK(batch.spans[s].start_position == 0 && batch.spans[s].encoder_tokens == 0,
             "write_encoder_kv: span {} must be a whole encoder sequence (start_position 0, no encoder_tokens)", s);
  stage_batch(batch, {}, /*write_kv=*/true);
  const DeviceTensor x = slot_rows(Slot::Hidden, tokens);
  if (x.dtype == DType::F32) {
    backend_.copy_to_device(states.data, x);
  } else {
    Tensor converted = to_dtype(states, x.dtype);
    backend_.copy_to_device(converted.data, x);
  }
  // The K/V rows [T, 2 * kv_dim] in the front of the qkv slot.
  const DeviceTensor kv = slot(Slot::Qkv).reshape({slot(Slot::Qkv).numel()}).rows(0, tokens * 2 * kv_dim_)
                              .reshape({tokens, 2 * kv_dim_});
  AttentionParams kv_params = attention_params_;
  kv_params.num_heads = 0;  // write_kv: k and v heads only
  const Shape cache_shape = {kv_config_.num_blocks, kv_config_.block_size, spec_.attention.num_kv_heads,
                             spec_.attention.head_dim};
  for (int layer = 0; layer < spec_.num_layers; ++layer) {
    const DeviceLayer& weights = layers_[layer];
    backend_.matmul(x, weights.w_cross_kv.view(), weights.b_cross_kv.view(), kv, false);
    const int cross_layer = spec_.num_layers + layer;
    backend_.write_kv(kv, step_view(kSlots, tokens), kv_params, k_cache_.view().rows(cross_layer, 1).reshape(cache_shape),
                      v_cache_.view().rows(cross_layer, 1).reshape(cache_shape));
  }
  backend_.synchronize();
}

DeviceTensor ModelRunner::issue_hidden(const ForwardBatch& batch) {
  SF_CHECK(!encoder_decoder(), "forward_hidden: an encoder_decoder runner runs the decoder (logits); its encoder is "
                               "an encoder_only runner on the spec's encoder_spec()");
  if (leader_channel_) publish_call(encode_step_call(forward_call(StepCallKind::ForwardHidden, batch)));
  for (size_t s = 0; s < batch.spans.size(); ++s)
    SF_CHECK(spec_.attention.causal || batch.spans[s].start_position == 0,
             "forward batch: span {} starts at position {}, but bidirectional attention needs the whole sequence in "
             "one step", s, batch.spans[s].start_position);
  stage_batch(batch, {});
  const int64_t tokens = batch.num_tokens();
  issue_layers(tokens);
  const DeviceTensor states = slot_rows(Slot::Hidden, tokens);
  if (!final_norm_.empty())
    backend_.add_norm(states, {}, final_norm_.view(), final_norm_bias_.view(), norm_params_, states);
  if (pipeline_.sends_output()) backend_.send(states, pipeline_.leader);
  if (pipeline_.receives_output()) backend_.recv(states, pipeline_.output_source);
  return states;
}

Tensor ModelRunner::forward_hidden(const ForwardBatch& batch) {
  const DeviceTensor states = issue_hidden(batch);
  const int64_t tokens = batch.num_tokens(), hidden = spec_.hidden_size;
  Tensor out = Tensor::zeros(DType::F32, {tokens, hidden});
  if (states.dtype == DType::F32) {
    backend_.copy_to_host(states, out.data);
  } else {
    std::vector<char> raw(states.nbytes());
    backend_.copy_to_host(states, raw.data());
    convert_to_f32(states.dtype, raw.data(), out.as<float>(), static_cast<size_t>(tokens * hidden));
  }
  return out;
}

Tensor ModelRunner::forward_pooled(const ForwardBatch& batch, Pooling pooling) {
  const DeviceTensor states = issue_hidden(batch);
  const int64_t spans = static_cast<int64_t>(batch.spans.size()), hidden = spec_.hidden_size;
  if (pool_offsets_.empty()) {
    pool_offsets_ = backend_.allocate(DType::I32, {limits_.max_seqs + 1});
    pooled_ = backend_.allocate(DType::F32, {limits_.max_seqs, hidden});
  }
  std::vector<int32_t> offsets(static_cast<size_t>(spans + 1), 0);
  for (int64_t s = 0; s < spans; ++s) offsets[s + 1] = offsets[s] + batch.spans[s].num_tokens;
  backend_.copy_to_device(offsets.data(), pool_offsets_.view().rows(0, spans + 1));
  backend_.pool_rows(states, pool_offsets_.view().rows(0, spans + 1), pooling, pooled_.view().rows(0, spans));
  Tensor out = Tensor::zeros(DType::F32, {spans, hidden});
  backend_.copy_to_host(pooled_.view().rows(0, spans), out.data);
  return out;
}

Tensor ModelRunner::forward(const ForwardBatch& batch) {
  SF_CHECK(!encoder(), "forward: {} is an encoder_only model: it has no logits (its states come from forward_hidden)",
           spec_.name.empty() ? std::string("this model") : spec_.name);
  check_encoder_tokens(spec_, batch);
  if (leader_channel_) publish_call(encode_step_call(forward_call(StepCallKind::Forward, batch)));
  const int32_t bucket = stage_batch(batch, {});
  const int64_t rows = static_cast<int64_t>(logit_rows_.size()), vocab = spec_.vocab_size;
  Tensor logits = Tensor::zeros(DType::F32, {rows, vocab});
  const bool has_logits = pipeline_.has_output();  // else a pipeline stage whose logits go elsewhere
  if (bucket > 0) {
    replay_decode(bucket, false);
    if (has_logits) backend_.copy_to_host(logits_.view().rows(0, rows), logits.data);
    backend_.synchronize();
    return logits;
  }
  issue_layers(batch.num_tokens());
  for (int64_t begin = 0; begin < rows; begin += logit_rows_capacity_) {
    const int64_t count = std::min(logit_rows_capacity_, rows - begin);
    issue_head(begin, count, false);
    if (has_logits) backend_.copy_to_host(logits_.view().rows(0, count), logits.as<float>() + begin * vocab);
  }
  backend_.synchronize();
  return logits;
}

std::vector<int32_t> ModelRunner::forward_sample(const ForwardBatch& batch, std::span<const SamplingRow> rows,
                                                 const std::function<std::span<const uint32_t>()>& masks) {
  check_encoder_tokens(spec_, batch);
  if (leader_channel_) publish_call(encode_step_call(forward_call(StepCallKind::ForwardSampleMasked, batch, rows)));
  const int32_t bucket = stage_batch(batch, rows);
  const int64_t count = static_cast<int64_t>(logit_rows_.size());
  const int64_t words = (spec_.vocab_size + 31) / 32;
  SF_CHECK(count <= limits_.max_seqs, "forward_sample: {} masked logits rows; at most max_seqs {}", count, limits_.max_seqs);
  // Only the rank with the logits masks and samples (a pipeline's leader gets them from the last stage).
  const bool has_logits = pipeline_.has_output();
  if (has_logits && d_token_masks_.empty()) {
    d_token_masks_ = backend_.allocate(DType::I32, {limits_.max_seqs, words});
    token_masks_staging_ = backend_.allocate_host(static_cast<size_t>(limits_.max_seqs * words) * sizeof(uint32_t));
  }
  // The layers are issued (or the decode recording replayed, without its sampling) first, so the
  // masks are computed on the host while the device runs them.
  if (bucket > 0) {
    replay_decode(bucket, false);
  } else {
    issue_layers(batch.num_tokens());
  }
  const std::span<const uint32_t> host_masks = masks();
  SF_CHECK(static_cast<int64_t>(host_masks.size()) == count * words,
           "forward_sample: masks hold {} words, expected {} rows of {}", host_masks.size(), count, words);
  // Through pinned memory: from pageable memory CUDA stages the copy (64 rows of a 49K vocabulary
  // are 393 KB) on the step's critical path. The staging is rewritten only after this step's
  // copy_to_host below, so the previous copy has finished (backend.h's allocate_host contract).
  if (has_logits) {
    std::memcpy(token_masks_staging_.get(), host_masks.data(), host_masks.size_bytes());
    backend_.copy_to_device(token_masks_staging_.get(), d_token_masks_.view().rows(0, count));
  }
  auto mask_and_sample = [&](int64_t begin, int64_t n) {
    if (!has_logits) return;
    const DeviceTensor logits = logits_.view().rows(0, n);
    backend_.apply_token_mask(logits, d_token_masks_.view().rows(begin, n));
    const int64_t sampling_words = step_sections_[kSamplingRows].offset + begin * kSamplingRowWords;
    backend_.sample(logits, d_step_.view().rows(sampling_words, n * kSamplingRowWords).reshape({n, kSamplingRowWords}),
                    d_sampled_.view().rows(begin, n));
  };
  if (bucket > 0) {
    mask_and_sample(0, count);  // the replay left logits rows [0, bucket) in logits_
  } else {
    for (int64_t begin = 0; begin < count; begin += logit_rows_capacity_) {
      const int64_t n = std::min(logit_rows_capacity_, count - begin);
      issue_head(begin, n, false);
      mask_and_sample(begin, n);
    }
  }
  std::vector<int32_t> tokens(count);
  backend_.copy_to_host(d_sampled_.view().rows(0, count), tokens.data());
  return tokens;
}

std::vector<int32_t> ModelRunner::forward_sample(const ForwardBatch& batch, std::span<const SamplingRow> rows) {
  SF_CHECK(!encoder(), "forward_sample: an encoder_only model has no logits to sample");
  check_encoder_tokens(spec_, batch);
  if (leader_channel_) publish_call(encode_step_call(forward_call(StepCallKind::ForwardSample, batch, rows)));
  const int32_t bucket = stage_batch(batch, rows);
  const int64_t count = static_cast<int64_t>(logit_rows_.size());
  std::vector<int32_t> tokens(count);
  if (bucket > 0) {
    replay_decode(bucket, true);
  } else {
    issue_layers(batch.num_tokens());
    for (int64_t begin = 0; begin < count; begin += logit_rows_capacity_)
      issue_head(begin, std::min(logit_rows_capacity_, count - begin), true);
  }
  backend_.copy_to_host(d_sampled_.view().rows(0, count), tokens.data());
  return tokens;
}

std::function<std::vector<int32_t>()> ModelRunner::submit_sample(const ForwardBatch& batch,
                                                                  std::span<const SamplingRow> rows) {
  if (!pipeline_.receives_output()) {
    std::vector<int32_t> tokens = forward_sample(batch, rows);
    return [tokens = std::move(tokens)] { return tokens; };
  }
  SF_CHECK(!encoder(), "forward_sample: an encoder_only model has no logits to sample");
  check_encoder_tokens(spec_, batch);
  if (leader_channel_) publish_call(encode_step_call(forward_call(StepCallKind::ForwardSample, batch, rows)));
  const int32_t bucket = stage_batch(batch, rows);
  const int64_t count = static_cast<int64_t>(logit_rows_.size());
  if (bucket > 0) {  // a recorded step runs whole (its receive is inside the recording)
    replay_decode(bucket, true);
    std::vector<int32_t> tokens(count);
    backend_.copy_to_host(d_sampled_.view().rows(0, count), tokens.data());
    return [tokens = std::move(tokens)] { return tokens; };
  }
  issue_layers(batch.num_tokens());
  // The later stages send this batch's tokens in order, behind those of batches submitted before.
  return [this, count] {
    for (int64_t begin = 0; begin < count; begin += logit_rows_capacity_)
      issue_head(begin, std::min(logit_rows_capacity_, count - begin), true);
    std::vector<int32_t> tokens(count);
    backend_.copy_to_host(d_sampled_.view().rows(0, count), tokens.data());
    return tokens;
  };
}

ModelRunner::~ModelRunner() {
  try {
    release_followers();
  } catch (const std::exception& e) {
    spdlog::warn("tensor parallelism: could not release the follower ranks: {}", e.what());
  }
}

void ModelRunner::publish_call(const std::vector<int32_t>& message) { leader_channel_->publish(message); }

void ModelRunner::release_followers() {
  if (leader_channel_ == nullptr) return;
  StepChannel* channel = std::exchange(leader_channel_, nullptr);
  channel->publish(encode_step_call(StepCall{StepCallKind::Stop}));
}

void ModelRunner::follow(StepChannel& channel) {
  SF_CHECK(leader_channel_ == nullptr, "follow: this runner leads a group");
  std::vector<uint32_t> allow_all;
  for (;;) {
    const std::vector<int32_t> message = channel.receive();
    const StepCall call = decode_step_call(message);
    staged_ = false;
    try {
      switch (call.kind) {
        case StepCallKind::Stop: return;
        case StepCallKind::Forward: forward(call.batch); break;
        case StepCallKind::ForwardSample: forward_sample(call.batch, call.rows); break;
        case StepCallKind::ForwardSampleMasked:
          forward_sample(call.batch, call.rows, [&]() -> std::span<const uint32_t> {
            allow_all.assign(logit_rows_.size() * static_cast<size_t>((spec_.vocab_size + 31) / 32), ~0u);
            return allow_all;
          });
          break;
        case StepCallKind::ForwardHidden: issue_hidden(call.batch); break;
        case StepCallKind::SwapBlocks: swap_blocks(call.copies, call.direction); break;
        case StepCallKind::WarmUp: warm_up(call.device_sampling); break;
      }
    } catch (const Error& e) {
      // The batch's checks (stage_batch) are the leader's too: a batch that fails them fails there,
      // before anything is sent, and the leader reports it to its caller. A later pipeline stage
      // that fails past them (its own layers, on its own backend) fails alone, and the stages
      // waiting on it must hear of it: it stops (its job reports the error).
      if (pipeline_.prev >= 0 && staged_) {
        spdlog::error("pipeline stage (rank {}): a step failed: {}", pipeline_.self, e.what());
        throw;
      }
      spdlog::debug("tensor parallelism: a replayed call failed as on the leader: {}", e.what());
    }
  }
}

}  // namespace splitflow
