// backend/forwarding_backend.h — a Backend that hands every call to a wrapped backend (by default
// the 1-thread CPU backend), for backends that change one behaviour and override only that: the
// GPU/CPU split's matmul offload (backend/matmul_offload.h), and test backends (folding norm
// weights, recording work, metering memory). Forwarded: every required call, the job's
// collectives and links, and the encoder-decoder kernels. Kept at Backend's own defaults: record
// (a recording of the inner backend would not see the overrides), fold_norm_weight and the fused
// matmul families, which decompose into forwarded calls (and the overrides) — so a forwarding
// backend over one that fuses them (CUDA) runs them unfused. Subclasses name themselves.
#pragma once

#include "backend/backend.h"

#include <memory>
#include <utility>

namespace splitflow {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner = make_cpu_backend(1)) : inner_(std::move(inner)) {}

  DType activation_dtype() const override { return inner_->activation_dtype(); }
  std::span<const DType> kv_cache_dtypes() const override { return inner_->kv_cache_dtypes(); }
  std::span<const DType> weight_dtypes() const override { return inner_->weight_dtypes(); }
  DeviceBuffer allocate(DType dtype, Shape shape) override { return inner_->allocate(dtype, std::move(shape)); }
  DeviceBuffer upload(const Tensor& host) override { return inner_->upload(host); }
  void copy_to_device(const void* host, const DeviceTensor& dst) override { inner_->copy_to_device(host, dst); }
  void copy_to_host(const DeviceTensor& src, void* host) override { inner_->copy_to_host(src, host); }
  void synchronize() override { inner_->synchronize(); }
  DeviceMemoryInfo memory_info() const override { return inner_->memory_info(); }
  std::shared_ptr<void> allocate_host(size_t bytes) override { return inner_->allocate_host(bytes); }
  void copy_blocks(const DeviceTensor& cache, const DeviceTensor& host, std::span<const BlockCopy> copies,
                   CopyDirection direction) override {
    inner_->copy_blocks(cache, host, copies, direction);
  }
  void embed(const DeviceTensor& table, const DeviceTensor& token_ids, float multiplier, const DeviceTensor& pos_table,
             const DeviceTensor& positions, const DeviceTensor& out) override {
    inner_->embed(table, token_ids, multiplier, pos_table, positions, out);
  }
  void add_norm(const DeviceTensor& residual, const DeviceTensor& delta, const DeviceTensor& weight,
                const DeviceTensor& bias, const NormParams& params, const DeviceTensor& out) override {
    inner_->add_norm(residual, delta, weight, bias, params, out);
  }
  void matmul(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias, const DeviceTensor& y,
              bool accumulate) override {
    inner_->matmul(x, w, bias, y, accumulate);
  }
  void rope(const DeviceTensor& qkv, const DeviceTensor& cos_sin, const DeviceTensor& table_rows,
            const RopeParams& params) override {
    inner_->rope(qkv, cos_sin, table_rows, params);
  }
  void write_kv(const DeviceTensor& qkv, const DeviceTensor& slots, const AttentionParams& params,
                const DeviceTensor& k_cache, const DeviceTensor& v_cache) override {
    inner_->write_kv(qkv, slots, params, k_cache, v_cache);
  }
  void attention(const DeviceTensor& qkv, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                 const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) override {
    inner_->attention(qkv, k_cache, v_cache, batch, params, out);
  }
  void norm_add(const DeviceTensor& x, const DeviceTensor& weight, const NormParams& params,
                const DeviceTensor& residual) override {
    inner_->norm_add(x, weight, params, residual);
  }
  void qk_norm(const DeviceTensor& qkv, const DeviceTensor& q_weight, const DeviceTensor& k_weight,
               const NormParams& norm, const AttentionParams& params) override {
    inner_->qk_norm(qkv, q_weight, k_weight, norm, params);
  }
  void softcap(const DeviceTensor& x, float cap) override { inner_->softcap(x, cap); }
  void activation(const DeviceTensor& x, Activation act, bool gated, const DeviceTensor& out) override {
    inner_->activation(x, act, gated, out);
  }
  void gather_rows(const DeviceTensor& x, const DeviceTensor& rows, const DeviceTensor& out) override {
    inner_->gather_rows(x, rows, out);
  }
  void scatter_rows(const DeviceTensor& x, const DeviceTensor& rows, const DeviceTensor& out) override {
    inner_->scatter_rows(x, rows, out);
  }
  void pool_rows(const DeviceTensor& x, const DeviceTensor& offsets, Pooling pooling,
                 const DeviceTensor& out) override {
    inner_->pool_rows(x, offsets, pooling, out);
  }
  void apply_token_mask(const DeviceTensor& logits, const DeviceTensor& mask) override {
    inner_->apply_token_mask(logits, mask);
  }
  void sample(const DeviceTensor& logits, const DeviceTensor& rows, const DeviceTensor& tokens) override {
    inner_->sample(logits, rows, tokens);
  }
  void profile_region(bool on) override { inner_->profile_region(on); }
  void set_tuning(bool on) override { inner_->set_tuning(on); }
  bool set_fp8_activations(bool on) override { return inner_->set_fp8_activations(on); }

  bool has_encoder_decoder_kernels() const override { return inner_->has_encoder_decoder_kernels(); }
  void attention_with_position_bias(const DeviceTensor& qkv, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                                    const AttentionBatch& batch, const AttentionParams& params,
                                    const RelativePositionBias& bias, const DeviceTensor& out) override {
    inner_->attention_with_position_bias(qkv, k_cache, v_cache, batch, params, bias, out);
  }
  void cross_attention(const DeviceTensor& q, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                       const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) override {
    inner_->cross_attention(q, k_cache, v_cache, batch, params, out);
  }

  int tensor_parallel_size() const override { return inner_->tensor_parallel_size(); }
  void allreduce(const DeviceTensor& partial, const DeviceTensor& residual) override {
    inner_->allreduce(partial, residual);
  }
  void gather_columns(const DeviceTensor& parts, const DeviceTensor& full) override {
    inner_->gather_columns(parts, full);
  }
  void allgather_rows(const DeviceTensor& x) override { inner_->allgather_rows(x); }
  void send(const DeviceTensor& x, int peer) override { inner_->send(x, peer); }
  void recv(const DeviceTensor& x, int peer) override { inner_->recv(x, peer); }

 protected:
  Backend& inner() const { return *inner_; }

 private:
  std::unique_ptr<Backend> inner_;
};

}  // namespace splitflow
