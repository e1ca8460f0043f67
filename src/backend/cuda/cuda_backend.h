// backend/cuda/cuda_backend.h — the CUDA Backend on one GPU: BF16 activations, a BF16 or fp8 e4m3
// KV cache (backend/cuda/kv_cache.cuh), fp32 accumulation everywhere, one stream, GEMMs through
// cuBLASLt (decode-sized ones, m <= 8, through backend/cuda/gemv.cu), the rest in
// backend/cuda/kernels.cu.
//
// Weights: upload() stores every float matrix (rank >= 2: weights, embedding and position
// tables) as BF16, converting F32 and F16 on the host, so there is one GEMM path (bf16 x bf16,
// fp32 compute); F16 checkpoints lose 3 mantissa bits there. Float vectors (norms, biases) are
// stored as F32. GEMM outputs are BF16, or F32 for the logits. Quantized and Mixed matrices
// (core/dtype.h) stay packed on the device (quant_backend.cpp): decode-sized matmuls decode their
// blocks in registers (quant_gemv.cu), larger ones dequantize chunks into a bf16 scratch for
// cuBLASLt (dequantize.cu); fold_norm_weight() declines them and their GEMVs apply the norm weight.
//
// Index tensors live on the device, so the host cannot check their values: token ids, rows,
// slots and block tables must be valid (ModelRunner validates every batch before staging it);
// write_kv skips slots outside the cache.
#pragma once

#include "backend/backend.h"
#include "backend/cuda/quant_kernels.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace splitflow::comm {
class CommGroup;
}

namespace splitflow::cuda {

class Fp8Gemm;
struct LtGemmPlan;

// A quantized or Mixed matrix (the quantized kernels' operand).
bool is_quant_matrix(const DeviceTensor& w);

class CudaBackend final : public Backend {
 public:
  // place: the groups and mailboxes of this rank's job (backend.h's CudaJobPlace; none: alone).
  explicit CudaBackend(int device, CudaJobPlace place = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override;
  DType activation_dtype() const override { return DType::BF16; }
  std::span<const DType> kv_cache_dtypes() const override;
  std::span<const DType> weight_dtypes() const override;

  DeviceBuffer allocate(DType dtype, Shape shape) override;
  DeviceBuffer upload(const Tensor& host) override;
  void copy_to_device(const void* host, const DeviceTensor& dst) override;
  void copy_to_host(const DeviceTensor& src, void* host) override;
  void synchronize() override;
  // cudaMemGetInfo on this backend's device: device-wide, so other processes' use is not free.
  DeviceMemoryInfo memory_info() const override;
  std::shared_ptr<void> allocate_host(size_t bytes) override;
  // backend/cuda/kv_swap.cpp
  void copy_blocks(const DeviceTensor& cache, const DeviceTensor& host, std::span<const BlockCopy> copies,
                   CopyDirection direction) override;
  // A CUDA graph of the work `issue` enqueues on the backend's stream (stream capture).
  std::unique_ptr<RecordedWork> record(const std::function<void()>& issue) override;
  bool can_record() const override { return true; }
  void set_tuning(bool on) override { tuning_ = on; }
  // W8A8 for f8_channel matrices (backend/cuda/fp8_gemm.h): Hopper (sm_90) only, whose cuBLASLt
  // scales FP8 products by row vectors; false elsewhere. Call before uploading the weights.
  bool set_fp8_activations(bool on) override;
  void profile_region(bool on) override;

  void embed(const DeviceTensor& table, const DeviceTensor& token_ids, float multiplier, const DeviceTensor& pos_table,
             const DeviceTensor& positions, const DeviceTensor& out) override;
  void add_norm(const DeviceTensor& residual, const DeviceTensor& delta, const DeviceTensor& weight,
                const DeviceTensor& bias, const NormParams& params, const DeviceTensor& out) override;
  // norm_add, qk_norm, softcap: backend/cuda/norms_backend.cpp.
  void norm_add(const DeviceTensor& x, const DeviceTensor& weight, const NormParams& params,
                const DeviceTensor& residual) override;
  void qk_norm(const DeviceTensor& qkv, const DeviceTensor& q_weight, const DeviceTensor& k_weight,
               const NormParams& norm, const AttentionParams& params) override;
  void softcap(const DeviceTensor& x, float cap) override;
  void matmul(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias, const DeviceTensor& y,
              bool accumulate) override;
  void rope(const DeviceTensor& qkv, const DeviceTensor& cos_sin, const DeviceTensor& table_rows,
            const RopeParams& params) override;
  void write_kv(const DeviceTensor& qkv, const DeviceTensor& slots, const AttentionParams& params,
                const DeviceTensor& k_cache, const DeviceTensor& v_cache) override;
  void rope_write_kv(const DeviceTensor& qkv, const DeviceTensor& cos_sin, const DeviceTensor& table_rows,
                     const RopeParams& rope_params, const DeviceTensor& slots, const AttentionParams& attention_params,
                     const DeviceTensor& k_cache, const DeviceTensor& v_cache) override;
  void attention(const DeviceTensor& qkv, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                 const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) override;
  // T5 and BART: the split-KV attention kernel with a relative position bias, or with the decoder's
  // own q over the encoder's K/V (no tensor-core path: these models are small).
  bool has_encoder_decoder_kernels() const override { return true; }
  void attention_with_position_bias(const DeviceTensor& qkv, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                                    const AttentionBatch& batch, const AttentionParams& params,
                                    const RelativePositionBias& bias, const DeviceTensor& out) override;
  void cross_attention(const DeviceTensor& q, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                       const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) override;
  void activation(const DeviceTensor& x, Activation act, bool gated, const DeviceTensor& out) override;
  bool fold_norm_weight(const DeviceTensor& w, const DeviceTensor& norm_weight, float weight_offset) override;
  void matmul_rope_write_kv(const InputNorm& norm, const DeviceTensor& x, const DeviceTensor& w,
                            const DeviceTensor& bias, const DeviceTensor& qkv, const DeviceTensor& cos_sin,
                            const DeviceTensor& table_rows, const RopeParams& rope_params, const DeviceTensor& slots,
                            const AttentionParams& attention_params, const DeviceTensor& k_cache,
                            const DeviceTensor& v_cache) override;
  void matmul_activation(const InputNorm& norm, const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias,
                         Activation act, bool gated, const DeviceTensor& product, const DeviceTensor& out) override;
  void gather_rows(const DeviceTensor& x, const DeviceTensor& rows, const DeviceTensor& out) override;
  void scatter_rows(const DeviceTensor& x, const DeviceTensor& rows, const DeviceTensor& out) override;
  void pool_rows(const DeviceTensor& x, const DeviceTensor& offsets, Pooling pooling, const DeviceTensor& out) override;
  void sample(const DeviceTensor& logits, const DeviceTensor& rows, const DeviceTensor& tokens) override;
  void apply_token_mask(const DeviceTensor& logits, const DeviceTensor& mask) override;  // cuda/token_mask_backend.cpp
  // Tensor parallelism through the group (comm/comm_group.h): the custom allreduce with the
  // residual add in its kernel, or NCCL then an add where the crossover table picks NCCL. A
  // recording (record()) with collectives in it registers its buffers with the group afterwards
  // (every rank records the same steps at the same time: the runners mirror each other).
  int tensor_parallel_size() const override;
  void allreduce(const DeviceTensor& partial, const DeviceTensor& residual) override;
  // NCCL all-gather of the parts in place, then each rank's columns copied into full (2-D copies).
  void gather_columns(const DeviceTensor& parts, const DeviceTensor& full) override;
  // NCCL all-gather in place (this rank's rows are its slice of the buffer).
  void allgather_rows(const DeviceTensor& x) override;
  // Pipeline stages: NCCL send / recv of the bytes over the pipeline group's communicator (the
  // job's ranks), or, with mailboxes, through host memory to a stage in this process (waiting for
  // the device: not recordable).
  void send(const DeviceTensor& x, int peer) override;
  void recv(const DeviceTensor& x, int peer) override;

 private:
  // cuBLASLt descriptors and the algorithm picked for one GEMM shape (gemm_plan.h; opaque here:
  // the cuBLASLt types stay in the .cpp files).
  using GemmPlan = LtGemmPlan;
  // (m, n, k, f32 output, pointer alignment in bytes, y's row stride: n, or more for a column block)
  using GemmKey = std::tuple<int64_t, int64_t, int64_t, bool, int, int64_t>;
  // The plan for `key`, made at the shape's first use; x and w are that call's operands (decode-
  // sized shapes time their candidate algorithms on them).
  const GemmPlan& gemm_plan(const GemmKey& key, const void* x, const void* w);
  // y = x w^T on a bf16 w with a plan of gemm_plan(), alpha and beta as cuBLASLt's.
  void run_gemm(const GemmPlan& plan, const void* x, const void* w, void* y, float alpha, float beta);

  // Quantized weights (backend/cuda/quant_backend.cpp): upload() keeps a quantized or Mixed matrix
  // packed; matmul runs the quantized GEMVs (quant_gemv.cu) for m <= kMaxQuantGemvRows, else
  // dequantizes chunks of rows into scratch_ and runs cuBLASLt; the fused decode calls keep their
  // epilogues and apply the norm weight on the fly (fold_norm_weight() declines quantized matrices);
  // embed() dequantizes the token rows of a quantized table.
  QuantMatrix quant_matrix(const DeviceTensor& w, const char* kernel) const;
  DeviceBuffer upload_quantized(const Tensor& host);
  void quant_matmul(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias, const DeviceTensor& y,
                    bool accumulate);
  // false: not fusable here (the caller takes the generic path).
  bool quant_matmul_rope_write_kv(const InputNorm& norm, const DeviceTensor& x, const DeviceTensor& w,
                                  const DeviceTensor& bias, const DeviceTensor& qkv, const DeviceTensor& cos_sin,
                                  const DeviceTensor& table_rows, const RopeParams& rope_params,
                                  const DeviceTensor& slots, const AttentionParams& attention_params,
                                  const DeviceTensor& k_cache, const DeviceTensor& v_cache);
  bool quant_matmul_activation(const InputNorm& norm, const DeviceTensor& x, const DeviceTensor& w,
                               const DeviceTensor& bias, int act, bool gated, const DeviceTensor& out);
  void quant_embed(const DeviceTensor& table, const DeviceTensor& token_ids, float multiplier,
                   const DeviceTensor& pos_table, const DeviceTensor& positions, const DeviceTensor& out);
  void* scratch_ = nullptr;  // bf16 dequantization scratch of scratch_elems_, grown by upload_quantized
  int64_t scratch_elems_ = 0;
  void* x_codes_ = nullptr;  // x as int8 codes for quant_gemm_q8.cu, x_codes_bytes_, grown by upload_quantized
  int64_t x_codes_bytes_ = 0;
  std::unique_ptr<Fp8Gemm> fp8_;  // set_fp8_activations(true): f8_channel products of more than 8 rows

  // Index of the fastest of `count` cuBLASLt heuristic results (cublasLtMatmulHeuristicResult_t[])
  // on x and w, timed into a scratch output of y_bytes.
  int fastest_candidate(const GemmPlan& plan, const void* results, int count, const void* x, const void* w,
                        int64_t y_bytes);

  int device_;
  comm::CommGroup* group_ = nullptr;           // tensor-parallel collectives (null: none)
  comm::CommGroup* pipeline_group_ = nullptr;  // send / recv between stages, peers by job rank
  std::shared_ptr<HostMailboxes> mailboxes_;
  int job_rank_ = 0;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  void* lt_handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;  // cuBLASLt workspace, allocated once
  size_t workspace_bytes_ = 0;
  int sm_count_ = 0;
  int l2_bytes_ = 0;
  int compute_major_ = 0;
  bool tuning_ = false;  // set_tuning()
  // Matmuls with at most this many rows take the GEMV kernel. Measured on H100 (Llama-2-7B decode,
  // fraction of bandwidth, GEMV vs cuBLASLt): 1 row 0.80 vs -, 2 rows 0.762 vs 0.748, 4 rows 0.680 vs
  // 0.746, 8 rows 0.564 vs 0.736.
  int gemv_max_rows_ = 2;
  float* attention_partials_ = nullptr;  // split-KV attention scratch, attention_partials_floats(sm_count_)
  int32_t* partition_counters_ = nullptr;  // attention_partition_counters(sm_count_), zeroed, self-resetting
  std::map<GemmKey, std::unique_ptr<GemmPlan>> gemm_plans_;
};

}  // namespace splitflow::cuda
