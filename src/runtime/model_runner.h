// runtime/model_runner.h — runs the spec's layer plan for one ForwardBatch on a Backend: the one
// execution path for prefill, chunked prefill, decode and any mix of them across sequences.
//
// Owns, on the backend: the weights, the paged KV cache, activation buffers for up to
// max_batch_tokens tokens, per-step index buffers and the RoPE cos/sin table, all allocated at
// construction (a forward allocates nothing on the device).
//
// KV cache layout (shared with the scheduler and every backend), per layer and for K and V:
//   [num_blocks, block_size, num_kv_heads, head_dim] in the cache dtype (KvCacheConfig::dtype, by
//   default the backend's activation_dtype()), one allocation of
//   [num_layers, num_blocks, block_size, num_kv_heads, head_dim] each for K and V.
// Position p of a sequence lives in block block_table[p / block_size], slot p % block_size.
// The runner never decides which blocks a sequence owns: spans bring their block tables.
//
// Automatic size (KvCacheConfig::memory_budget, runtime/kv_cache_sizing.h): the runner allocates
// the weights, every activation and step buffer and the host swap area first, then asks the
// backend for its free memory and takes the blocks the budget leaves (kv_config().num_blocks
// reports them, kv_cache_sizing() the numbers behind them; spdlog::info logs both). Only the
// per-step index buffers follow the cache: their block tables grow with it, so each block is
// charged its entries there too.
//
// Host swap area (num_host_blocks > 0), for preemption by swapping: pinned host memory of
// [num_host_blocks, num_layers, block_size, num_kv_heads, head_dim] each for K and V (a host
// block holds one cache block of every layer). swap_blocks() runs the scheduler's copies.
//
// Encoders (spec network encoder_only): no head and no logits buffers; forward_hidden() returns
// the token states, which embedding/ pools. Their K/V still go through the paged cache (the
// attention kernels read it), but nothing keeps it after the step.
//
// Encoder-decoder models (spec network encoder_decoder): this runner runs the decoder stack (its
// layers attend to the encoder through cross-attention); the encoder stack is another runner, an
// encoder_only one on spec.encoder_spec(), whose forward_hidden() states write_encoder_kv() turns
// into each decoder layer's cross K/V. The cache then holds 2 * num_layers layers: the decoder's
// self-attention K/V in [0, num_layers), the encoder's cross K/V in [num_layers, 2 * num_layers),
// both through the sequence's one block table (positions [0, encoder_tokens) of the cross layers).
// No tensor or pipeline parallelism, no recorded decode steps yet; the backend must have
// has_encoder_decoder_kernels() (the CPU and CUDA backends).
//
// Warm-up: warm_up() pays, before the first request, the one-time costs a device backend charges
// to the first step of each shape (recording a decode bucket, loading kernels, creating GEMM
// plans), so they stay out of the first requests' latency.
#pragma once

#include "backend/backend.h"
#include "core/tensor.h"
#include "model/spec.h"
#include "model/weights.h"
#include "runtime/batch.h"
#include "runtime/kv_cache_sizing.h"
#include "runtime/layer_plan.h"
#include "runtime/step_channel.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace splitflow {

struct KvCacheConfig {
  int32_t num_blocks = 0;       // 0 with memory_budget: sized by the runner, which writes it here
  int32_t block_size = 16;      // tokens per block
  int32_t num_host_blocks = 0;  // blocks of the host swap area (0: none)
  // Element type of K and V (and of the swap area): one of the backend's kv_cache_dtypes();
  // nullopt: its activation_dtype(). F8E4M3 halves the bytes of a bf16 cache (3 mantissa bits).
  std::optional<DType> dtype = std::nullopt;
  // Set: num_blocks (given as 0) is what the device's memory leaves once everything else is
  // allocated (runtime/kv_cache_sizing.h).
  std::optional<KvCacheMemoryBudget> memory_budget = std::nullopt;
};

// The cache dtype `requested` names on `backend` (nullopt: its activation_dtype()); throws naming
// the backend and the dtypes it stores when it cannot store this one.
DType resolve_kv_cache_dtype(const Backend& backend, std::optional<DType> requested);

// Bytes of K and V of one token over every layer, in the cache dtype.
int64_t kv_cache_bytes_per_token(const ModelSpec& spec, DType cache_dtype);

// Pipeline parallelism (parallel/partition.h): where a runner's stage sits in the job. The spec
// the runner gets is the stage's (its layers only); the default is the whole model on one rank.
struct PipelineLinks {
  int self = 0;            // this rank in the job
  int prev = -1;           // the rank whose stage feeds this one (-1: the first stage: it embeds)
  int next = -1;           // the rank this stage feeds (-1: the last stage: final norm and head)
  int leader = 0;          // where the scheduler runs: it gets the logits, tokens or states
  int output_source = -1;  // the last-stage rank that sends them to the leader (-1: none needed)
  // Tensor-parallel ranks per stage: rank split_rank of them sends only its share of the residual
  // stream to the next stage (rows [split_rank c, (split_rank+1) c), c = ceil(tokens / split)), and
  // the next stage's ranks all-gather the shares (reference 000's transfer optimization).
  int split = 1;
  int split_rank = 0;
  bool first() const { return prev < 0; }
  bool last() const { return next < 0; }
  bool sends_output() const { return last() && self == output_source && self != leader; }
  bool receives_output() const { return self == leader && !last(); }
  // Whether this rank ends a forward with the logits (the last stage, or the leader they go to).
  bool has_output() const { return last() || receives_output(); }
};

// How a runner's model was partitioned (parallel/): tensor parallelism's plan, the pipeline stage.
// A vocab-parallel head (parallel/tensor_parallel.h): this rank's lm_head holds `rows` rows of the
// vocabulary, rank `rank`'s of `size` equal slices; its logits columns are gathered with the
// backend's gather_columns. rows 0: the head holds the whole vocabulary.
// embed: the embedding table is split the same way and holds rows + 1 rows, the last zeros: a
// token of another rank's rows looks up the zero row, and the embeddings are summed over the ranks
// (an in-place allreduce) before anything reads them; positions are added on rank 0 only.
struct VocabShard {
  int rank = 0, size = 1;
  int64_t rows = 0;
  bool embed = false;
};

struct RunnerPartition {
  std::optional<LayerPlan> plan;  // nullopt: build_layer_plan(spec)
  PipelineLinks pipeline;
  VocabShard vocab;
};

struct RunnerLimits {
  int32_t max_batch_tokens = 512;  // tokens of one forward (sum of span lengths)
  int32_t max_seqs = 64;           // spans of one forward
  // Record decode steps (every span one token, LogitsMode::Last, every span wants logits) once
  // per batch-size bucket and replay them, when the backend can record (CUDA graphs).
  bool record_decode = true;
  // warm_up() runs steps (every decode bucket, one prefill-shaped step) when the backend can
  // record. Every rank of a job must decide alike, since a stage's step waits on the stage before
  // it: a pipeline whose stages sit on different backends (the -ngl split: the CPU's stage cannot
  // record, the GPU's can) turns it off on all of them.
  bool warm_up_steps = true;
};

// What warm_up() ran.
struct WarmupReport {
  std::vector<int32_t> decode_buckets;  // decode batch sizes run (every bucket the runner can use)
  int32_t decode_recordings = 0;        // recordings made (bucket x with / without sampling)
  int32_t prefill_tokens = 0;           // tokens of the prefill-shaped forward (0: none ran)
  double seconds = 0;
};

class ModelRunner {
 public:
  // Checks every weight against the spec (presence, shape, dtype) and uploads it; the error names
  // the tensor ("layer 3 w_down") and the expected shape. With kv_config.memory_budget, throws
  // naming the memory figures when the cache would not hold one sequence of its min_tokens.
  // `partition` (parallel/): tensor parallelism's layer plan, with its Allreduce steps, instead of
  // build_layer_plan(spec); a pipeline stage's links (embedding only on the first stage, the head
  // only on the last; the stage's input received from the previous stage and its output sent to
  // the next, the last stage's logits, tokens or states to the leader, whose forward calls return
  // them; the other ranks' return empty logits).
  ModelRunner(const ModelSpec& spec, ModelWeights weights, Backend& backend, KvCacheConfig kv_config,
              RunnerLimits limits = {}, RunnerPartition partition = {});
  // A leader stops its followers (release_followers()).
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Tensor parallelism (runtime/step_channel.h). lead(): every later call of forward,
  // forward_sample, forward_hidden, swap_blocks and warm_up is published on `channel` before it
  // runs here. follow(): a follower rank's loop, making each published call on this runner (a
  // masked forward_sample with every token allowed: the leader alone samples what counts) until
  // the leader releases it; a call that fails here fails on the leader too (the same checks on the
  // same input, before any collective) and is skipped. release_followers(): ends their loops.
  void lead(StepChannel* channel) { leader_channel_ = channel; }
  void follow(StepChannel& channel);
  void release_followers();

  // Runs the batch: writes its tokens' K/V into the cache and returns logits, fp32 on the host:
  // LogitsMode::Last: [spans with want_logits, vocab], in span order;
  // LogitsMode::All: [batch tokens, vocab], in token order.
  // Throws splitflow::Error naming the span and field for a malformed batch (token outside the
  // vocabulary, a block table that does not cover the span, positions past the context, ...).
  Tensor forward(const ForwardBatch& batch);
  // forward(), then one token per logits row sampled on the device under rows[r] (the backend's
  // sampling rule, sampling/sampling_rule.h): only the tokens come back to the host. rows: one per
  // logits row. Throws when the counts differ.
  std::vector<int32_t> forward_sample(const ForwardBatch& batch, std::span<const SamplingRow> rows);
  // forward_sample() in two halves, for micro-batches in flight through pipeline stages: on a
  // leader whose stage is not the last, publishes the call, runs this stage's layers and sends
  // their output on, and returns at once; the returned function receives the last stage's tokens.
  // Elsewhere the whole forward runs here and the function returns its tokens. Batches may be
  // submitted before earlier ones are collected; each function must be called once, in
  // submission order.
  std::function<std::vector<int32_t>()> submit_sample(const ForwardBatch& batch, std::span<const SamplingRow> rows);
  // forward_sample() under vocabulary masks (structured outputs): once the forward is issued,
  // `masks()` gives one row of ceil(vocab / 32) words per logits row (bit t: token t allowed),
  // so a caller computes them while the device runs; disallowed logits become -inf on the device
  // before the draw. At most max_seqs logits rows; the mask buffer is allocated at first use.
  std::vector<int32_t> forward_sample(const ForwardBatch& batch, std::span<const SamplingRow> rows,
                                      const std::function<std::span<const uint32_t>()>& masks);
  // Runs the batch and returns every token's last hidden state (after the final norm, when the
  // spec has one) as fp32 on the host: [batch tokens, hidden], in token order. The output of an
  // encoder_only model (forward() and forward_sample() refuse those: they have no head). With
  // bidirectional attention (attention.causal false) each span must be a whole sequence
  // (start_position 0). The spans' K/V are written to their blocks like any forward's.
  Tensor forward_hidden(const ForwardBatch& batch);
  // forward_hidden() pooled on the device: one vector per span ([spans, hidden] F32 on the host,
  // in span order), its first row (Cls), last row (Last) or mean (Mean). What embeddings need,
  // with spans x hidden coming back instead of every token's state.
  Tensor forward_pooled(const ForwardBatch& batch, Pooling pooling);
  // encoder_decoder: each decoder layer's cross-attention K/V of the encoder's last states
  // ([batch tokens, hidden] F32 on the host: the encoder runner's forward_hidden(batch)), written to
  // the cross layers of the cache at positions [0, num_tokens) of each span's block table. `batch`
  // is the encoder's: whole sequences (start_position 0). Later decoder spans of those sequences
  // give encoder_tokens = the span's num_tokens.
  void write_encoder_kv(const ForwardBatch& batch, const Tensor& states);
  // Copies whole KV blocks (K and V, every layer) between the cache and the host swap area, in
  // order with the forwards issued before and after it. Throws naming the copy whose block is
  // outside the cache or the host area.
  void swap_blocks(std::span<const BlockCopy> copies, CopyDirection direction);
  // Runs, on dummy spans, the decode step of every bucket (recording it when record_decode; with
  // and without sampling when `device_sampling`, else without) and one prefill-shaped forward of
  // min(max_batch_tokens, context) tokens in a long span and, with max_seqs >= 2, a one-token
  // span (the SplitFuse mix). Dummy tokens write no KV (slot -1) and read block 0: no cache
  // content and no later output changes. On a backend that cannot record (CPU: nothing to record,
  // no plans, no lazy kernel loading) it runs nothing and returns an empty report. Logs the
  // duration (spdlog::info).
  WarmupReport warm_up(bool device_sampling = true);

  const ModelSpec& spec() const { return spec_; }
  bool encoder() const { return spec_.network == NetworkType::EncoderOnly; }
  bool encoder_decoder() const { return spec_.network == NetworkType::EncoderDecoder; }
  // Layers of the KV cache: num_layers, twice that for encoder_decoder (the cross K/V).
  int32_t cache_layers() const { return spec_.num_layers * (encoder_decoder() ? 2 : 1); }
  const LayerPlan& plan() const { return plan_; }
  // num_blocks is the cache's block count, also when the runner sized it.
  const KvCacheConfig& kv_config() const { return kv_config_; }
  // The memory figures an automatic size came from (nullopt: num_blocks was given).
  const std::optional<KvCacheSizing>& kv_cache_sizing() const { return kv_cache_sizing_; }
  DType kv_cache_dtype() const { return k_cache_.view().dtype; }
  const RunnerLimits& limits() const { return limits_; }
  // Tokens a sequence may reach: max_position; with dynamic NTK scaling, which exists to run
  // past it, the KV cache's capacity.
  int64_t context_limit() const { return context_limit_; }
  int32_t max_blocks_per_seq() const { return max_blocks_per_seq_; }

  // Splitwise (splitwise/): the paged KV cache itself ([num_layers, num_blocks, block_size,
  // num_kv_heads, head_dim] each for K and V), so a sequence's KV can move between instances
  // through Backend::copy_to_host / copy_to_device between steps; and a listener called with each
  // layer's index once that layer's work (its KV writes included) is issued. On a backend that runs
  // kernels synchronously (CPU) the layer's KV is then in the cache; a device backend would record
  // an event there. Replays of a recorded decode step do not call it.
  DeviceTensor k_cache_view() const { return k_cache_.view(); }
  DeviceTensor v_cache_view() const { return v_cache_.view(); }
  void set_layer_listener(std::function<void(int32_t layer)> listener) { layer_listener_ = std::move(listener); }

 private:
  struct DeviceLayer {
    DeviceBuffer attn_norm, attn_norm_bias, wqkv, bqkv, wo, bo;
    DeviceBuffer ffn_norm, ffn_norm_bias, w_gate_up, b_gate_up, w_down, b_down;
    DeviceBuffer q_norm, k_norm, post_attn_norm, post_ffn_norm;  // empty unless qk_norm / post_norms
    // encoder_decoder: cross-attention (w_cross_kv: k rows, then v rows).
    DeviceBuffer cross_attn_norm, cross_attn_norm_bias, w_cross_q, b_cross_q, w_cross_kv, b_cross_kv, w_cross_o, b_cross_o;
  };

  void upload_weights(ModelWeights& weights);
  // Folds each pre-norm's weight into the matrix its norm feeds when the backend wants it
  // (Backend::fold_norm_weight); those norms then run with unit_norm_weight_.
  void fold_norm_weights();
  // RoPE (or sinusoidal) tables for positions below max_positions.
  void build_position_tables(int64_t max_positions);
  // context_limit_ and max_blocks_per_seq_ for a cache of cache_tokens.
  void set_cache_extent(int64_t cache_tokens);
  // KvCacheConfig::memory_budget: num_blocks from the backend's free memory, logged.
  int32_t size_kv_cache_from_memory(const KvCacheMemoryBudget& budget, DType cache_dtype);
  // The per-step index staging area and its device mirror (their block tables are
  // [max_seqs, max_blocks_per_seq_]: allocated once the cache is sized).
  void allocate_step_buffers();
  // Validates the batch, fills the pinned staging buffer and copies it to the device in one go.
  // Returns the decode bucket (spans padded to it) when the step can replay a recording, else 0.
  // write_kv false: every token gets slot -1 (warm-up's dummy spans).
  int32_t stage_batch(const ForwardBatch& batch, std::span<const SamplingRow> sampling, bool write_kv = true);
  // Decode buckets up to min(max_seqs, max_batch_tokens), ascending.
  std::vector<int32_t> decode_buckets() const;
  // One warm-up step over dummy spans: staged without KV writes, issued like forward() /
  // forward_sample(), then synchronized (the next step rewrites the staging area). Returns
  // whether it made a recording.
  bool issue_warmup_step(const ForwardBatch& batch, bool sample);
  // Embedding and every layer over the first `tokens` rows.
  void issue_layers(int64_t tokens);
  // forward_hidden's and forward_pooled's work (published to followers, who run only this):
  // the batch's last states, final-normed, on the device ([tokens, hidden] of the Hidden slot).
  DeviceTensor issue_hidden(const ForwardBatch& batch);
  // The rows of the residual stream this rank sends to or receives from the next or previous
  // stage (PipelineLinks::split): all `tokens` rows without tensor parallelism.
  DeviceTensor hidden_share(int64_t tokens) const;
  // Final norm, lm_head (and sampling) of logits rows [begin, begin + count). rows_are_tokens:
  // logits row r is token r (a decode step: one token per span, each wanting logits), so the norm
  // reads the hidden rows in place instead of after a gather launch.
  void issue_head(int64_t begin, int64_t count, bool sample, bool rows_are_tokens = false);
  // Replays (recording it the first time) the whole decode step of `bucket` spans.
  void replay_decode(int32_t bucket, bool sample);
  void run_layer(int layer, int64_t tokens);
  const DeviceTensor& slot(Slot s) const;
  DeviceTensor slot_rows(Slot s, int64_t tokens) const;
  std::pair<const DeviceBuffer*, const DeviceBuffer*> layer_weight(const DeviceLayer& layer, LayerWeight w) const;
  // The norm a step applies to its input (empty when the step has none).
  InputNorm input_norm(const DeviceLayer& layer, const PlanStep& step, int64_t tokens) const;

  // The leader's half of lead(): publishes one call (step_command.h's encoding) when leading.
  void publish_call(const std::vector<int32_t>& message);

  ModelSpec spec_;
  LayerPlan plan_;
  PipelineLinks pipeline_;
  VocabShard vocab_shard_;
  StepChannel* leader_channel_ = nullptr;
  bool staged_ = false;  // follow(): the current call's batch passed stage_batch's checks
  Backend& backend_;
  KvCacheConfig kv_config_;
  std::optional<KvCacheSizing> kv_cache_sizing_;
  RunnerLimits limits_;
  int64_t context_limit_ = 0;
  int32_t max_blocks_per_seq_ = 0;
  int64_t q_dim_ = 0, kv_dim_ = 0, mlp_up_width_ = 0;
  NormParams norm_params_;
  RopeParams rope_params_;
  AttentionParams attention_params_;

  // Weights.
  DeviceBuffer embed_, pos_embed_, final_norm_, final_norm_bias_, lm_head_;
  DeviceBuffer logits_bias_;  // (vocab) f32, tensors.logits_bias; empty: none
  DeviceBuffer embed_norm_, embed_norm_bias_;  // embedding_norm
  DeviceBuffer unit_norm_weight_;  // ones [hidden] when norm weights are folded, else empty
  DeviceBuffer relative_bias_;     // [num_buckets, num_heads] F32, position relative
  RelativePositionBias position_bias_;
  std::vector<DeviceLayer> layers_;

  // KV cache: [num_layers, num_blocks, block_size, num_kv_heads, head_dim].
  DeviceBuffer k_cache_, v_cache_;
  // Host swap area, allocate_host: [num_host_blocks, num_layers, block_size, num_kv_heads, head_dim].
  std::shared_ptr<void> k_host_, v_host_;
  DeviceTensor k_host_view_, v_host_view_;

  // Activations, indexed by Slot; each [max_batch_tokens, width], in the backend's activation_dtype().
  std::vector<DeviceBuffer> slots_;
  // [logit_rows_capacity_, hidden / vocab]; logits_ F32, the others in the activation dtype.
  DeviceBuffer selected_, selected_normed_, logits_;
  DeviceBuffer vocab_parts_;  // [group x logit rows, vocab shard] F32: a vocab-parallel head's parts
  int64_t logit_rows_capacity_ = 0;

  // RoPE: rows [0, static_rope_rows_) hold positions 0.. of the length-independent table; the
  // max_batch_tokens rows after them are filled per step for spans that need length-specific
  // frequencies (dynamic NTK, LongRoPE past the original context).
  DeviceBuffer rope_table_;  // [static_rope_rows_ + max_batch_tokens, 2, rotary_dim / 2]
  // rope.sliding: the sliding-window layers' table, rows as rope_table_'s (its step rows are
  // filled alongside); empty without rope.sliding. sliding_rope_layer_[l]: layer l reads it.
  DeviceBuffer sliding_rope_table_;
  std::vector<bool> sliding_rope_layer_;
  std::vector<float> step_sliding_rope_rows_;
  std::vector<float> sliding_inv_freq_;  // the sliding layers' frequencies (length-independent)
  float sliding_attention_factor_ = 1.0f;
  int64_t static_rope_rows_ = 0;
  int64_t rope_static_length_ = 0;

  // Per-step index data: one I32 staging area in pinned host memory mirrored by one device
  // buffer, copied with one transfer per step. Sections, in order (each int32):
  //   token_ids, positions, slots, rope_rows, logit_rows [max_batch_tokens each],
  //   sampling rows [max_batch_tokens * kSamplingRowWords], query_start [max_seqs + 1],
  //   context_lens [max_seqs], block_tables [max_seqs, max_blocks_per_seq].
  struct StepSection {
    int64_t offset = 0, size = 0;
  };
  //   cross_context_lens [max_seqs] (encoder_decoder: each span's encoder_tokens) before the block tables.
  enum StepField { kTokenIds, kPositions, kSlots, kRopeRows, kLogitRows, kSamplingRows, kQueryStart, kContextLens,
                   kCrossContextLens, kBlockTables, kStepFields };
  int32_t* staged(StepField field) const { return static_cast<int32_t*>(staging_.get()) + step_sections_[field].offset; }
  DeviceTensor step_view(StepField field, int64_t count) const;
  StepSection step_sections_[kStepFields];
  std::shared_ptr<void> staging_;  // allocate_host: pinned on CUDA
  DeviceBuffer d_step_;
  DeviceBuffer pool_offsets_, pooled_;  // [max_seqs + 1] I32, [max_seqs, hidden] F32, at the first forward_pooled
  DeviceBuffer d_token_masks_;     // [max_seqs, ceil(vocab / 32)] I32, at the first masked step
  std::shared_ptr<void> token_masks_staging_;  // its allocate_host twin: a pinned copy needs no stream sync
  DeviceBuffer d_sampled_;         // [max_batch_tokens] I32
  std::vector<int32_t> logit_rows_;  // this step's logits rows (host copy, for counts and chunking)
  std::vector<float> step_rope_rows_;  // [max_batch_tokens, rotary_dim] staged length-specific rows
  int64_t step_rope_count_ = 0;
  AttentionBatch attention_batch_;
  AttentionBatch cross_batch_;  // encoder_decoder: attention_batch_ with the encoder lengths as contexts
  // Decode recordings by (bucket, with sampling).
  std::map<std::pair<int32_t, bool>, std::unique_ptr<RecordedWork>> decode_recordings_;
  std::function<void(int32_t)> layer_listener_;  // set_layer_listener
};

}  // namespace splitflow
