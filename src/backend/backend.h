// backend/backend.h — the device abstraction: device memory and the kernels one transformer
// forward pass needs. The runtime reaches every kernel through this interface; the CPU backend
// (backend/cpu) and the CUDA backend (backend/cuda) implement it. No device-specific type appears
// here, so nothing above the backend knows what runs the math.
//
// Contract:
//  - A DeviceTensor is a non-owning, contiguous, row-major view of device memory (host memory on
//    the CPU backend). DeviceBuffer owns memory; its view() is what kernels take.
//  - Kernels run in issue order on one stream; on an asynchronous device they return before the
//    work finishes. copy_to_host() waits for all issued work; synchronize() waits explicitly.
//  - Activations are in the backend's activation_dtype() (F32 on the CPU, BF16 on CUDA); norms,
//    biases and RoPE tables are F32; logits (the lm-head GEMM's output) are F32.
//    Matrices (weights, the embedding table) may be F32, F16 or BF16 and are read in that dtype
//    (no copy in fp32); a backend's upload() may convert them to the dtype its kernels read.
//  - The KV cache is in one of the backend's kv_cache_dtypes() (K and V alike). The kernels that
//    write it convert the qkv activation's k and v values to that dtype (F8E4M3: core/dtype.h's
//    f32_to_e4m3, unscaled: a scale of 1, as vLLM's uncalibrated fp8 cache), and attention reads
//    it back exactly into fp32 (or, on CUDA, bf16 tensor-core) arithmetic.
//  - Index tensors (token ids, positions, slots, block tables) are I32.
//  - Paged KV cache, per layer: K and V each [num_blocks, block_size, num_kv_heads, head_dim].
//    Position p of a sequence lives in block block_table[p / block_size] at offset
//    p % block_size. The scheduler, the CPU and the CUDA kernels all share this layout.
//  - The qkv activation is [T, (num_heads + 2 * num_kv_heads) * head_dim]: per token the q heads,
//    then the k heads, then the v heads, head_dim values each (the fused-QKV weight's row order).
#pragma once

#include "core/block_copy.h"
#include "core/error.h"
#include "core/tensor.h"
#include "model/spec.h"
#include "sampling/sampling_rule.h"

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace splitflow {

// Quantized matrices (core/dtype.h) are DeviceTensors of their quantized dtype and logical shape
// [rows, cols]; a DType::Mixed one carries its row runs (core/tensor.h), and runs() splits it.
struct DeviceTensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  RowRuns row_runs;  // DType::Mixed only

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return storage_bytes(dtype, shape, row_runs); }
  int64_t dim(int axis) const { return shape.at(axis < 0 ? shape.size() + axis : axis); }
  // Elements per index of dim 0.
  int64_t row_numel() const { return shape.empty() ? 1 : numel() / shape[0]; }
  // Rows [begin, begin + count) along dim 0 (of a plain or quantized tensor; a Mixed one: runs()).
  DeviceTensor rows(int64_t begin, int64_t count) const {
    SF_CHECK(!shape.empty() && begin >= 0 && count >= 0 && begin + count <= shape[0],
             "device tensor {}: rows [{}, {}) out of range", shape_str(shape), begin, begin + count);
    SF_CHECK(dtype != DType::Mixed, "device tensor {}: rows() of a mixed-dtype matrix (use runs())", shape_str(shape));
    Shape one_row = shape;
    one_row[0] = 1;
    DeviceTensor view{static_cast<char*>(data) + static_cast<size_t>(begin) * storage_bytes(dtype, one_row), dtype, shape};
    view.shape[0] = count;
    return view;
  }
  // The same memory under another shape of equal element count.
  DeviceTensor reshape(Shape new_shape) const {
    SF_CHECK(shape_numel(new_shape) == numel(), "device tensor {}: cannot reshape to {}", shape_str(shape),
             shape_str(new_shape));
    SF_CHECK(!is_quantized(dtype) && dtype != DType::Mixed, "device tensor {}: cannot reshape a {} matrix",
             shape_str(shape), dtype_name(dtype));
    return DeviceTensor{data, dtype, std::move(new_shape)};
  }
  // A matrix as single-dtype pieces: each run of a Mixed matrix as a view of its own dtype, with
  // the index of its first row; any other tensor is one piece starting at row 0.
  std::vector<struct MatrixRun> runs() const;

  template <typename T>
  T* as() const { return static_cast<T*>(data); }
};

struct MatrixRun {
  int64_t first_row = 0;
  DeviceTensor rows;
};

inline std::vector<MatrixRun> DeviceTensor::runs() const {
  if (dtype != DType::Mixed) return {MatrixRun{0, *this}};
  std::vector<MatrixRun> pieces;
  char* at = static_cast<char*>(data);
  int64_t row = 0;
  for (const RowRun& run : *row_runs) {
    DeviceTensor piece{at, run.dtype, {run.rows, shape[1]}};
    pieces.push_back({row, piece});
    at += piece.nbytes();
    row += run.rows;
  }
  return pieces;
}

class Backend;

// Owns device memory (or, on the CPU backend, may share a host tensor's storage).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceTensor view, std::shared_ptr<void> owner) : view_(std::move(view)), owner_(std::move(owner)) {}
  const DeviceTensor& view() const { return view_; }
  bool empty() const { return view_.empty(); }

 private:
  DeviceTensor view_;
  std::shared_ptr<void> owner_;
};

// The memory of the device a backend allocates from, in bytes (Backend::memory_info).
struct DeviceMemoryInfo {
  int64_t free_bytes = 0;   // allocatable now, whoever holds the rest (this process or another)
  int64_t total_bytes = 0;  // the device's capacity (on the CPU: what this process may have at most)
};


struct NormParams {
  NormType type = NormType::RMSNorm;
  float eps = 1e-5f;
  float weight_offset = 0.0f;  // y = x_hat * (weight_offset + weight) + bias
};

// A norm a matmul-family call applies to its input rows first: norm.normed [m, k] receives
// norm(x) (add_norm's output) when the backend runs the two apart; a backend that fuses them may
// leave it unwritten. An empty weight: no norm, x goes in as is. unit_weight: the weight is all
// ones because the norm's own weight was folded into the matrix (Backend::fold_norm_weight), so a
// fusing backend needs only each row's statistics.
struct InputNorm {
  DeviceTensor weight, bias;
  NormParams params;
  DeviceTensor normed;
  bool unit_weight = false;
  bool empty() const { return weight.empty(); }
};

struct RopeParams {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int rotary_dim = 0;   // even, <= head_dim; dims past it pass through
  RopeStyle style = RopeStyle::Half;
};

struct AttentionParams {
  int num_heads = 0;
  int num_kv_heads = 0;     // divides num_heads; query head h reads kv head h / (num_heads / num_kv_heads)
  int head_dim = 0;
  int block_size = 0;       // tokens per KV block
  float scale = 1.0f;       // softmax(scale * q.k)
  int sliding_window = 0;   // 0: full causal; W: keys at positions (p - W, p]
  float logit_softcap = 0;  // > 0: each score s = scale * q.k becomes cap * tanh(s / cap) before the softmax
  // false (encoders): every query of a sequence sees all context_lens[s] keys, its later ones too;
  // the whole sequence is then in this step (no sliding window).
  bool causal = true;
};

// T5's relative position bias (spec relative_attention): the score of a query at position i for the
// key at position j gains table[bucket(j - i), head], bucket() as transformers'
// _relative_position_bucket computes it (in f32 arithmetic), bidirectional when attention is not causal.
struct RelativePositionBias {
  DeviceTensor table;       // [num_buckets, num_heads] F32
  int num_buckets = 0;
  int max_distance = 0;
  bool bidirectional = false;
};

// Where each sequence of a batch sits: S sequences, T new tokens in total.
// Sequence s owns query rows [query_start[s], query_start[s+1]) of the batch; it has
// context_lens[s] tokens after this step, so its new tokens are at positions
// context_lens[s] - n_s, ..., context_lens[s] - 1.
struct AttentionBatch {
  DeviceTensor query_start;    // [S + 1] I32, query_start[0] = 0, query_start[S] = T
  DeviceTensor context_lens;   // [S] I32
  DeviceTensor block_tables;   // [S, max_blocks_per_seq] I32, row s padded past its used blocks
  int32_t max_query_len = 0;   // host copies of the maxima, for launch shapes
  int32_t max_context_len = 0;
};

// Work recorded once and replayed (a CUDA graph): the same kernels on the same buffers, with
// whatever the buffers hold at replay time.
class RecordedWork {
 public:
  virtual ~RecordedWork() = default;
  virtual void replay() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The dtype of activations (ModelRunner allocates them in it).
  virtual DType activation_dtype() const = 0;
  // The dtypes the KV-write and attention kernels take for the cache, activation_dtype() first.
  virtual std::span<const DType> kv_cache_dtypes() const = 0;
  // The matrix dtypes matmul and embed read (plain and quantized, core/dtype.h); a weight of any
  // other dtype is refused by upload() with a message listing these. Mixed matrices are allowed
  // when each of their runs is.
  virtual std::span<const DType> weight_dtypes() const = 0;

  // --- memory -------------------------------------------------------------------------------
  // Zero-filled.
  virtual DeviceBuffer allocate(DType dtype, Shape shape) = 0;
  // The host tensor's contents on the device, same dtype and shape. The CPU backend shares the
  // tensor's storage instead of copying (a memory-mapped checkpoint stays mapped, not duplicated).
  virtual DeviceBuffer upload(const Tensor& host) = 0;
  // Copies dst.nbytes() bytes from host into dst.
  virtual void copy_to_device(const void* host, const DeviceTensor& dst) = 0;
  // Waits for issued work, then copies src.nbytes() bytes into host.
  virtual void copy_to_host(const DeviceTensor& src, void* host) = 0;
  virtual void synchronize() = 0;
  // Free and total memory of the device, at the moment of the call (what ModelRunner sizes an
  // automatic KV cache from). CUDA: cudaMemGetInfo, device-wide (other processes' use is not
  // free). CPU: host memory (backend/cpu/host_memory.h): MemAvailable and MemTotal capped by the
  // process's cgroup limit, free less the allocate_host areas alive (not resident until written,
  // so MemAvailable does not see them yet).
  virtual DeviceMemoryInfo memory_info() const = 0;
  // Host memory the device copies from and to without staging (pinned on CUDA), `bytes` long,
  // 64-byte aligned. A copy_to_device from it may still be in flight when the call returns: the
  // caller rewrites it only after a copy_to_host or synchronize().
  virtual std::shared_ptr<void> allocate_host(size_t bytes) = 0;
  // Copies whole KV blocks between one paged cache (K or V) and a swap area in host memory
  // (allocate_host), in issue order with the kernels (asynchronous on CUDA: the host area is
  // read or written once the work before it is done).
  // cache [num_layers, num_blocks, block_size, num_kv_heads, head_dim]; host: a view of host
  // memory, [num_host_blocks, num_layers, block_size, num_kv_heads, head_dim] in the cache's
  // dtype, so a host block holds the block of every layer contiguously while a cache block is
  // strided by the layer. Each copy moves cache block device_block of every layer to or from host
  // block host_block. Throws on a block index outside either area or mismatched shapes.
  virtual void copy_blocks(const DeviceTensor& cache, const DeviceTensor& host, std::span<const BlockCopy> copies,
                           CopyDirection direction) = 0;
  // Records the kernels `issue` enqueues (no copies, no synchronization inside) for replay, or
  // returns null when the backend cannot record (then the caller issues the work itself).
  virtual std::unique_ptr<RecordedWork> record(const std::function<void()>& issue) { return nullptr; }
  virtual bool can_record() const { return false; }
  // Marks where an attached profiler (ncu --profile-from-start off) collects: on, then off. No-op
  // without one, and on backends without a profiler.
  virtual void profile_region(bool on) {}
  // While on, kernels met with a new shape may be tuned for it on the spot (CUDA: a decode-sized
  // GEMM times cuBLASLt's candidate algorithms), which blocks the host; off by default, so
  // serving steps of new shapes never stall. The runner turns it on for the eager first step of
  // each decode bucket it records.
  virtual void set_tuning(bool on) {}
  // W8A8 (`--quantization fp8`): products of more than 8 rows with an f8_channel matrix quantize
  // x to e4m3 per row and run on FP8 tensor cores; decode-sized ones stay weight-only. Call
  // before uploading the weights. false (nothing changed) where the backend has no such path.
  virtual bool set_fp8_activations(bool on) { return !on; }

  // --- kernels (shapes: T tokens, H hidden) ----------------------------------------------------
  // out[t] = table[token_ids[t]] * multiplier, plus pos_table[positions[t]] when pos_table is
  // not empty. table [vocab, H] and pos_table [max_positions, H]: F32/F16/BF16; token_ids,
  // positions [T] I32; out [T, H].
  virtual void embed(const DeviceTensor& table, const DeviceTensor& token_ids, float multiplier,
                     const DeviceTensor& pos_table, const DeviceTensor& positions, const DeviceTensor& out) = 0;

  // Pre-norm with an optional fused residual add: when delta is not empty, residual += delta
  // first; then out = norm(residual) * (weight_offset + weight) + bias.
  // residual, delta, out [T, H]; weight [H]; bias [H] or empty (always empty for RMSNorm).
  virtual void add_norm(const DeviceTensor& residual, const DeviceTensor& delta, const DeviceTensor& weight,
                        const DeviceTensor& bias, const NormParams& params, const DeviceTensor& out) = 0;

  // Post-norm residual add: residual += norm(x) * (weight_offset + weight). x, residual [T, H];
  // weight [H] F32.
  virtual void norm_add(const DeviceTensor& x, const DeviceTensor& weight, const NormParams& params,
                        const DeviceTensor& residual) = 0;

  // Per-head RMSNorm in place: every q head of qkv [T, ...] (layout below) becomes
  // rmsnorm(head) * (weight_offset + q_weight), every k head the same with k_weight; v heads
  // are untouched. q_weight, k_weight [head_dim] F32. Heads and head_dim from params.
  virtual void qk_norm(const DeviceTensor& qkv, const DeviceTensor& q_weight, const DeviceTensor& k_weight,
                       const NormParams& norm, const AttentionParams& params) = 0;

  // x = cap * tanh(x / cap) in place (final logit soft-capping). x [R, V] F32.
  virtual void softcap(const DeviceTensor& x, float cap) = 0;

  // y = x W^T + bias, or with accumulate y += x W^T + bias (a residual add in the epilogue).
  // x [m, k] activation dtype; w [n, k] F32/F16/BF16; bias [n] F32 or empty; y [m, n] in the
  // activation dtype or F32 (the logits).
  virtual void matmul(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias, const DeviceTensor& y,
                      bool accumulate) = 0;

  // Rotates, in place, the first rotary_dim dims of every q and k head of qkv [T, ...].
  // cos_sin [R, 2, rotary_dim / 2]: row r holds cos(angle_i) * a then sin(angle_i) * a for pair i
  // (a: the scaling's attention factor). Token t uses row table_rows[t] ([T] I32): its position
  // in a precomputed table, or a row the runner filled for this step (length-dependent scalings).
  // Half pairs dims (i, i + rotary_dim/2); Interleaved pairs (2i, 2i + 1).
  virtual void rope(const DeviceTensor& qkv, const DeviceTensor& cos_sin, const DeviceTensor& table_rows,
                    const RopeParams& params) = 0;

  // Stores the k and v heads of qkv [T, ...] in one layer's caches (params.num_heads 0: qkv holds
  // only k and v heads, [T, 2 * kv_dim], as an encoder's cross-attention K/V): token t goes to slot
  // slots[t] = block * block_size + offset ([T] I32; a negative slot skips the token).
  // k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim], one of kv_cache_dtypes(),
  // hold the stored qkv values converted to their dtype.
  virtual void write_kv(const DeviceTensor& qkv, const DeviceTensor& slots, const AttentionParams& params,
                        const DeviceTensor& k_cache, const DeviceTensor& v_cache) = 0;

  // rope() then write_kv() on the same qkv; a backend may do both in one pass.
  virtual void rope_write_kv(const DeviceTensor& qkv, const DeviceTensor& cos_sin, const DeviceTensor& table_rows,
                             const RopeParams& rope_params, const DeviceTensor& slots,
                             const AttentionParams& attention_params, const DeviceTensor& k_cache,
                             const DeviceTensor& v_cache) {
    rope(qkv, cos_sin, table_rows, rope_params);
    write_kv(qkv, slots, attention_params, k_cache, v_cache);
  }

  // Folds an RMSNorm's weight into the matrix the norm feeds, if this backend wants that:
  // w[:, c] *= (weight_offset + norm_weight[c]) in place, rounded to w's dtype, after which the
  // norm runs with a unit weight (InputNorm::unit_weight). Returns false, w untouched, when the
  // backend keeps norm weights apart (the default: exact HF rounding order). CUDA folds, so its
  // decode GEMVs normalize their input on the fly instead of a norm launch before each.
  virtual bool fold_norm_weight(const DeviceTensor& w, const DeviceTensor& norm_weight, float weight_offset) {
    return false;
  }

  // The QKV projection, then rope_write_kv(): qkv = norm(x) W^T + bias, its q and k heads rotated,
  // its k and v heads stored at slots. A backend may do it in one pass (CUDA at decode rows: the
  // GEMV normalizes x, rotates each pair of rows from its fp32 sums and writes the cache itself).
  virtual void matmul_rope_write_kv(const InputNorm& norm, const DeviceTensor& x, const DeviceTensor& w,
                                    const DeviceTensor& bias, const DeviceTensor& qkv, const DeviceTensor& cos_sin,
                                    const DeviceTensor& table_rows, const RopeParams& rope_params,
                                    const DeviceTensor& slots, const AttentionParams& attention_params,
                                    const DeviceTensor& k_cache, const DeviceTensor& v_cache) {
    matmul(normalized(norm, x), w, bias, qkv, false);
    rope_write_kv(qkv, cos_sin, table_rows, rope_params, slots, attention_params, k_cache, v_cache);
  }

  // Paged attention of the batch's new tokens (q heads of qkv) over each sequence's cached keys and
  // values (the new tokens' k/v must already be written): causal, or with params.causal false
  // bidirectional over the sequence's whole context. out [T, num_heads * head_dim].
  virtual void attention(const DeviceTensor& qkv, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                         const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) = 0;

  // --- encoder-decoder models (a backend without them says so in has_encoder_decoder_kernels) ---
  virtual bool has_encoder_decoder_kernels() const { return false; }
  // attention() with T5's relative position bias added to every score (after params.scale).
  virtual void attention_with_position_bias(const DeviceTensor& qkv, const DeviceTensor& k_cache,
                                            const DeviceTensor& v_cache, const AttentionBatch& batch,
                                            const AttentionParams& params, const RelativePositionBias& bias,
                                            const DeviceTensor& out) {
    fail("attention_with_position_bias: the {} backend has no relative position bias kernel", name());
  }
  // Cross-attention: the decoder tokens' queries q [T, num_heads * head_dim] over their sequence's
  // encoder K/V, context_lens[s] of them (every query sees every one, no positions involved),
  // stored in k_cache / v_cache (one layer, the paged layout) through the batch's block tables.
  // The encoder K/V are written by write_kv() with params.num_heads 0. out [T, num_heads * head_dim].
  virtual void cross_attention(const DeviceTensor& q, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                               const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) {
    fail("cross_attention: the {} backend has no cross-attention kernel", name());
  }

  // gated: out[t, j] = act(x[t, j]) * x[t, I + j] with x [T, 2I] (gate columns, then up columns);
  // else out = act(x) with x [T, I]. out [T, I]. GELU is the erf form; GELUTanh the tanh form.
  virtual void activation(const DeviceTensor& x, Activation act, bool gated, const DeviceTensor& out) = 0;

  // The MLP's up projection and activation: out = activation(norm(x) W^T + bias) through `product`
  // [m, n] (matmul, then activation). A backend may fuse them and leave `product` unwritten (CUDA
  // at decode-sized m: one GEMV normalizes x, computes the gate and up rows, applies the activation).
  virtual void matmul_activation(const InputNorm& norm, const DeviceTensor& x, const DeviceTensor& w,
                                 const DeviceTensor& bias, Activation act, bool gated, const DeviceTensor& product,
                                 const DeviceTensor& out) {
    matmul(normalized(norm, x), w, bias, product, false);
    activation(product, act, gated, out);
  }

  // out[i] = x[rows[i]]. x [T, C]; rows [R] I32; out [R, C] in x's dtype (any dtype; on CUDA
  // rows of an even number of bytes).
  virtual void gather_rows(const DeviceTensor& x, const DeviceTensor& rows, const DeviceTensor& out) = 0;
  // The reverse: out[rows[i]] = x[i]. x [R, C]; rows [R] I32, no two alike; out [T, C] in x's dtype.
  // (A transfer's KV rows into the paged cache at their slots, splitwise/kv_rows.h.)
  virtual void scatter_rows(const DeviceTensor& x, const DeviceTensor& rows, const DeviceTensor& out) = 0;

  // One vector per span of rows (embedding pooling on the device, so that only [S, C] comes back):
  // span s is rows [offsets[s], offsets[s + 1]) of x [T, C] (activation dtype), non-empty; out[s]
  // (F32 [S, C]) is its first row (Cls), last row (Last) or the fp32 mean of its rows (Mean).
  // offsets [S + 1] I32, ascending, within [0, T].
  virtual void pool_rows(const DeviceTensor& x, const DeviceTensor& offsets, Pooling pooling,
                         const DeviceTensor& out) = 0;

  // One token per row of logits [R, V] F32 under rows [R, kSamplingRowWords] I32 (SamplingRow
  // structs, sampling/sampling_rule.h), into tokens [R] I32.
  virtual void sample(const DeviceTensor& logits, const DeviceTensor& rows, const DeviceTensor& tokens) = 0;

  // Structured outputs: logits[r, t] = -inf where bit t % 32 of mask[r, t / 32] is clear.
  // logits [R, V] F32; mask [R, ceil(V / 32)] I32.
  virtual void apply_token_mask(const DeviceTensor& logits, const DeviceTensor& mask) = 0;

  // --- tensor parallelism (parallel/) ----------------------------------------------------------
  // Ranks of the tensor-parallel group this backend belongs to (1: it runs alone).
  virtual int tensor_parallel_size() const { return 1; }
  // Sums partial [T, H] (activation dtype) over the group's ranks: residual += sum when residual
  // is not empty (the row-parallel projections' residual add), else partial = sum in place.
  // Collective: every rank issues the same calls in the same order; the sum is the same on every
  // rank, bit for bit.
  virtual void allreduce(const DeviceTensor& partial, const DeviceTensor& residual) {
    fail("allreduce: the {} backend belongs to no tensor-parallel group", name());
  }
  // Vocab-parallel heads: rank r of the group computed logits for the vocabulary columns
  // [r S, (r+1) S) into rows [r R, (r+1) R) of parts [group size x R, S] (F32); every rank's full
  // [R, group size x S] (F32) gets every rank's columns, the same on every rank. Collective, like
  // allreduce. parts may be overwritten.
  virtual void gather_columns(const DeviceTensor& parts, const DeviceTensor& full) {
    fail("gather_columns: the {} backend belongs to no tensor-parallel group", name());
  }
  // Reference 000's pipeline transfer with tensor parallelism: rank r of the group holds rows
  // [r R, (r+1) R) of x [group size x R, width]; afterwards every rank holds all of them (an
  // all-gather in place). Collective, like allreduce.
  virtual void allgather_rows(const DeviceTensor& x) {
    fail("allgather_rows: the {} backend belongs to no tensor-parallel group", name());
  }
  // Pipeline parallelism (parallel/): x's bytes to the job's rank `peer`, which receives them
  // into a tensor of the same shape and dtype with recv(). In issue order with the kernels; the
  // pair must issue matching calls in the same order.
  virtual void send(const DeviceTensor& x, int peer) { fail("send: the {} backend belongs to no job", name()); }
  virtual void recv(const DeviceTensor& x, int peer) { fail("recv: the {} backend belongs to no job", name()); }

 protected:
  // x itself without a norm; else add_norm(x) into norm.normed, which is returned.
  const DeviceTensor& normalized(const InputNorm& norm, const DeviceTensor& x) {
    if (norm.empty()) return x;
    add_norm(x, {}, norm.weight, norm.bias, norm.params, norm.normed);
    return norm.normed;
  }
};

class CpuRankGroup;  // backend/cpu/rank_group.h
class HostMailboxes;  // backend/host_mailboxes.h

// Where a CPU backend sits in an in-process job (one thread per rank: how the CPU tests run tensor
// and pipeline parallelism, and the CPU stage of a GPU/CPU pipeline): its tensor-parallel group
// and rank in it (backend/cpu/rank_group.h; allreduce() meets the group there), and the job's
// mailboxes (backend/host_mailboxes.h) and its rank in the job (send / recv).
struct CpuJobPlace {
  std::shared_ptr<CpuRankGroup> group;
  int group_rank = 0;
  std::shared_ptr<HostMailboxes> mailboxes;
  int job_rank = 0;
};

// The CPU backend (backend/cpu): num_threads <= 0 uses OpenMP's default.
std::unique_ptr<Backend> make_cpu_backend(int num_threads = 0, CpuJobPlace place = {});

namespace comm {
class CommGroup;
}
// Where a CUDA backend sits in a job (one process per GPU, comm/comm_group.h; the groups outlive
// the backend): allreduce() and gather_columns() run through tensor_group, the ranks of its
// pipeline stage (the custom allreduce fused with the residual add, or NCCL where the crossover
// table says so); send() / recv() to other stages through pipeline_group, the whole job (peers are
// job ranks). In a grid of stages x tensor-parallel ranks the two differ; otherwise either may be
// the job's one group. With mailboxes (a stage of a pipeline inside this process,
// parallel/local_pipeline.h) send() / recv() pass through host memory to the other stages' threads.
struct CudaJobPlace {
  comm::CommGroup* tensor_group = nullptr;
  comm::CommGroup* pipeline_group = nullptr;
  std::shared_ptr<HostMailboxes> mailboxes;
  int job_rank = 0;
};

#ifdef SPLITFLOW_HAS_CUDA
// The CUDA backend (backend/cuda) on GPU `device`: BF16 activations, a BF16 or F8E4M3 KV cache,
// fp32 accumulation; throws splitflow::Error when the device cannot be used.
std::unique_ptr<Backend> make_cuda_backend(int device = 0, CudaJobPlace place = {});
// --quantization in device memory: `matrix` (f32, f16 or bf16, stored or generated; rows of its
// last dimension) quantized to `type` on the current CUDA device by quant/block_quantizers.h's
// code, the packed rows copied back: byte for byte what quant::quantize writes, computed on the
// GPU (backend/cuda/quantize_matrix.cpp). Other sources go to quant::quantize. Throws naming the
// CUDA error, or as quant::quantize does. `chunk_elems` (0: 64 Mi) bounds the device memory used:
// the matrix passes in chunks of whole rows of at most that many elements.
Tensor quantize_matrix_on_cuda(const Tensor& matrix, DType type, int64_t chunk_elems = 0);
#endif

// quantize_matrix_on_cuda for a model's many matrices (defined in CUDA builds; declared in every
// build, as backend/cuda's own files compile this header without SPLITFLOW_HAS_CUDA): its device
// buffers are kept and grown across calls (a model load made hundreds of allocations of up to
// 256 MiB each) and released with the last copy of the object (copies share them, one call at a
// time: it fits model/weights.h's MatrixQuantizer).
class CudaMatrixQuantizer {
 public:
  explicit CudaMatrixQuantizer(int64_t chunk_elems = 0);
  Tensor operator()(const Tensor& matrix, DType type) const;

 private:
  struct Buffers;
  int64_t chunk_elems_;
  std::shared_ptr<Buffers> buffers_;
};

}  // namespace splitflow
