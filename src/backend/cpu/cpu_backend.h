// backend/cpu/cpu_backend.h — the CPU Backend: fp32 math on host memory; GEMV, GEMM and attention
// on a pinned team of spinning workers (backend/cpu/thread_team.h), the rest on OpenMP; AVX2/FMA
// (AVX-512 where targeted) inner loops (backend/cpu/simd.h). Device memory is host memory, so
// upload() shares a host tensor's storage (mmapped checkpoints are not copied) and copies are memcpy.
// The KV cache may be f32 (the default), f16, bf16 or fp8 e4m3: write_kv converts into it,
// attention back to f32.
// Weights may be f32, f16, bf16, any quantized type or Mixed runs of those (backend/cpu/
// quant_matmul.h): packed matrices stay packed, shared with the host tensor like any other.
// Products over GGUF's block types (Q4_0 .. Q8_0, Q2_K .. Q6_K) quantize x to Q8 blocks and run
// integer dot products, as llama.cpp does (backend/cpu/q8_activations.h; SPLITFLOW_CPU_Q8_ACTIVATIONS=0
// keeps x in fp32, the exact path the fp32-reference tests use): over a repacked copy of each
// matrix, made at its first product, whose original pages are then released
// (backend/cpu/interleaved_rows.h), decode and prefill alike; rows outside its 16-row groups and
// matrices it does not take run the GEMV (q8_activations.h) and GEMM (q8_gemm.h) as stored. Each
// kernel-running thread's team pins its threads to distinct CPUs (thread_team.h; SPLITFLOW_CPU_PIN=0: not).
#pragma once

#include "backend/backend.h"

#include <atomic>
#include <memory>

namespace splitflow::cpu {
class InterleavedCopies;
}

namespace splitflow::cpu {

class CpuBackend final : public Backend {
 public:
  // place: where it sits in an in-process job (backend/backend.h's CpuJobPlace).
  explicit CpuBackend(int num_threads, CpuJobPlace place = {});
  std::string name() const override;
  DType activation_dtype() const override { return DType::F32; }
  std::span<const DType> kv_cache_dtypes() const override;
  std::span<const DType> weight_dtypes() const override;
  int num_threads() const { return num_threads_; }
  // Q8 activations for decode GEMVs over Q4_0 .. Q8_0 (on by default; tests against fp32
  // references turn them off).
  bool q8_activations() const { return q8_activations_; }
  void set_q8_activations(bool on) { q8_activations_ = on; }
  // Whether a repacked matrix's original, held by nothing but its upload, may be discarded
  // (backend/cpu/interleaved_rows.h; on by default). Off under a GPU/CPU split's offload, which
  // reads originals after the products began.
  void set_discard_repacked_originals(bool on);

  DeviceBuffer allocate(DType dtype, Shape shape) override;
  DeviceBuffer upload(const Tensor& host) override;
  void copy_to_device(const void* host, const DeviceTensor& dst) override;
  void copy_to_host(const DeviceTensor& src, void* host) override;
  void synchronize() override {}
  // Host memory (backend/cpu/host_memory.h), free less the allocate_host areas still alive.
  DeviceMemoryInfo memory_info() const override;
  std::shared_ptr<void> allocate_host(size_t bytes) override;
  void copy_blocks(const DeviceTensor& cache, const DeviceTensor& host, std::span<const BlockCopy> copies,
                   CopyDirection direction) override;

  void embed(const DeviceTensor& table, const DeviceTensor& token_ids, float multiplier, const DeviceTensor& pos_table,
             const DeviceTensor& positions, const DeviceTensor& out) override;
  void add_norm(const DeviceTensor& residual, const DeviceTensor& delta, const DeviceTensor& weight,
                const DeviceTensor& bias, const NormParams& params, const DeviceTensor& out) override;
  // norm_add, qk_norm, softcap: backend/cpu/norms.cpp.
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
  void attention(const DeviceTensor& qkv, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                 const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) override;
  // attention_with_position_bias, cross_attention: backend/cpu/attention.cpp, one kernel with attention().
  bool has_encoder_decoder_kernels() const override { return true; }
  void attention_with_position_bias(const DeviceTensor& qkv, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                                    const AttentionBatch& batch, const AttentionParams& params,
                                    const RelativePositionBias& bias, const DeviceTensor& out) override;
  void cross_attention(const DeviceTensor& q, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                       const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) override;
  void activation(const DeviceTensor& x, Activation act, bool gated, const DeviceTensor& out) override;
  void gather_rows(const DeviceTensor& x, const DeviceTensor& rows, const DeviceTensor& out) override;
  void scatter_rows(const DeviceTensor& x, const DeviceTensor& rows, const DeviceTensor& out) override;
  void pool_rows(const DeviceTensor& x, const DeviceTensor& offsets, Pooling pooling, const DeviceTensor& out) override;
  void sample(const DeviceTensor& logits, const DeviceTensor& rows, const DeviceTensor& tokens) override;
  void apply_token_mask(const DeviceTensor& logits, const DeviceTensor& mask) override;  // cpu/token_mask.cpp

  int tensor_parallel_size() const override;
  void allreduce(const DeviceTensor& partial, const DeviceTensor& residual) override;
  void gather_columns(const DeviceTensor& parts, const DeviceTensor& full) override;
  void allgather_rows(const DeviceTensor& x) override;
  void send(const DeviceTensor& x, int peer) override;
  void recv(const DeviceTensor& x, int peer) override;

 private:
  // The kernel behind attention(), attention_with_position_bias() and cross_attention(): queries
  // are the first q_dim values of each q row (q_stride apart); `cross`: every query sees its
  // sequence's whole context (the encoder's K/V), whatever its count; `bias` may be null.
  void paged_attention(const float* q, int64_t q_stride, int64_t tokens, const DeviceTensor& k_cache,
                       const DeviceTensor& v_cache, const AttentionBatch& batch, const AttentionParams& params,
                       const RelativePositionBias* bias, bool cross, const DeviceTensor& out);
  int num_threads_;
  CpuJobPlace place_;
  bool q8_activations_ = true;  // SPLITFLOW_CPU_Q8_ACTIVATIONS, read once at construction
  // Bytes of allocate_host areas alive: unwritten pages are not resident, so MemAvailable does not
  // count them yet (a swap area before its first swap). Shared with each area's deleter.
  std::shared_ptr<std::atomic<int64_t>> host_area_bytes_ = std::make_shared<std::atomic<int64_t>>(0);
  // Uploaded matrices of GGUF's block types repacked for the products (backend/cpu/interleaved_rows.h),
  // registered at upload when Q8 activations are on and made at each one's first product; until
  // then memory_info counts their bytes as taken.
  std::shared_ptr<InterleavedCopies> interleaved_;
};

}  // namespace splitflow::cpu
