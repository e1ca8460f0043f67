#include "backend/cpu/cpu_backend.h"

#include "backend/argument_checks.h"
#include "backend/cpu/host_memory.h"
#include "backend/cpu/interleaved_rows.h"
#include "backend/cpu/q8_gemm.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/norm_row.h"
#include "backend/cpu/quant_matmul.h"
#include "backend/cpu/rank_group.h"
#include "backend/host_mailboxes.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_team.h"
#include "core/error.h"
#include "sampling/host_rule.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

namespace splitflow {

std::unique_ptr<Backend> make_cpu_backend(int num_threads, CpuJobPlace place) {
  return std::make_unique<cpu::CpuBackend>(num_threads, std::move(place));
}

namespace cpu {
namespace {

void add_bias(const DeviceTensor& bias, int64_t m, int64_t n, float* out) {
  if (bias.empty()) return;
  for (int64_t i = 0; i < m; ++i) axpy(1.0f, bias.as<float>(), out + i * n, n);
}

void check_f32(const DeviceTensor& t, const char* kernel, const char* arg) {
  SF_CHECK(t.dtype == DType::F32, "cpu {}: {} has dtype {}, expected f32", kernel, arg, dtype_name(t.dtype));
}
void check_i32(const DeviceTensor& t, const char* kernel, const char* arg) {
  SF_CHECK(t.dtype == DType::I32, "cpu {}: {} has dtype {}, expected i32", kernel, arg, dtype_name(t.dtype));
}
// A weight matrix: plain, quantized, or Mixed with plain or quantized runs.
void check_weight_dtype(const DeviceTensor& t, const char* kernel, const char* arg) {
  const auto readable = [](DType dtype) {
    return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16 || is_quantized(dtype);
  };
  if (t.dtype == DType::Mixed) {
    SF_CHECK(t.row_runs != nullptr && t.shape.size() == 2, "cpu {}: {} is a mixed-dtype matrix {} without row runs",
             kernel, arg, shape_str(t.shape));
    for (const RowRun& run : *t.row_runs)
      SF_CHECK(readable(run.dtype), "cpu {}: {} has a run of dtype {}, expected f32, f16, bf16 or a quantized type",
               kernel, arg, dtype_name(run.dtype));
    return;
  }
  SF_CHECK(readable(t.dtype), "cpu {}: {} has dtype {}, expected f32, f16, bf16 or a quantized type", kernel, arg,
           dtype_name(t.dtype));
}
void check_shape(const DeviceTensor& t, const Shape& expected, const char* kernel, const char* arg) {
  SF_CHECK(t.shape == expected, "cpu {}: {} has shape {}, expected {}", kernel, arg, shape_str(t.shape),
           shape_str(expected));
}

// out[0..n) = float(row[0..n)) * multiplier, for a matrix row of any supported dtype.
void row_to_f32(const void* matrix, DType dtype, int64_t row, int64_t n, float multiplier, float* out) {
  if (is_quantized(dtype)) {
    quant_decode_rows(dtype, matrix, n, row, 1, 0, n, out);
    if (multiplier != 1.0f) scale(multiplier, out, n);
    return;
  }
  switch (dtype) {
    case DType::F16: to_f32_row(static_cast<const F16Bits*>(matrix) + row * n, out, n); break;
    case DType::BF16: to_f32_row(static_cast<const BF16Bits*>(matrix) + row * n, out, n); break;
    default: std::memcpy(out, static_cast<const float*>(matrix) + row * n, n * sizeof(float)); break;
  }
  if (multiplier != 1.0f) scale(multiplier, out, n);
}

float activate(float x, Activation act) {
  switch (act) {
    case Activation::SiLU: return x / (1.0f + std::exp(-x));
    // 1 + erf(x/sqrt2) = erfc(-x/sqrt2) and 1 + tanh(u) = 2 / (1 + e^(-2u)): the same values
    // without the cancellation that loses the tail for negative x.
    case Activation::GELU: return 0.5f * x * std::erfc(-x * 0.70710678118654752f);
    case Activation::GELUTanh: {
      const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
      return x / (1.0f + std::exp(-2.0f * inner));
    }
    case Activation::ReLU: return x > 0.0f ? x : 0.0f;
  }
  return x;
}

// out[j] = act(x[j]) (* up[j] when up is not null), j < n.
void activate_row(const float* x, const float* up, Activation act, float* out, int64_t n) {
  int64_t j = 0;
#ifdef SPLITFLOW_CPU_AVX2
  if (act == Activation::SiLU) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; j + 8 <= n; j += 8) {
      const __m256 v = _mm256_loadu_ps(x + j);
      const __m256 denominator = _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), v)));
      __m256 y = _mm256_div_ps(v, denominator);
      if (up != nullptr) y = _mm256_mul_ps(y, _mm256_loadu_ps(up + j));
      _mm256_storeu_ps(out + j, y);
    }
  }
#endif
  for (; j < n; ++j) out[j] = up != nullptr ? activate(x[j], act) * up[j] : activate(x[j], act);
}

}  // namespace

CpuBackend::CpuBackend(int num_threads, CpuJobPlace place)
    : num_threads_(num_threads > 0 ? num_threads : omp_get_max_threads()),
      place_(std::move(place)),
      interleaved_(std::make_shared<InterleavedCopies>()) {
  if (const char* q8 = std::getenv("SPLITFLOW_CPU_Q8_ACTIVATIONS"); q8 != nullptr && *q8 != '\0')
    q8_activations_ = std::string_view(q8) != "0";
  // Ranks or stages of an in-process job each run a team: pinning them would stack the teams on
  // the same CPUs.
  if (place_.group != nullptr || place_.mailboxes != nullptr) set_team_pinning(false);
  SF_CHECK(place_.group == nullptr || (place_.group_rank >= 0 && place_.group_rank < place_.group->size()),
           "cpu backend: rank {} outside a group of {}", place_.group_rank, place_.group ? place_.group->size() : 0);
}

int CpuBackend::tensor_parallel_size() const { return place_.group ? place_.group->size() : 1; }

void CpuBackend::allreduce(const DeviceTensor& partial, const DeviceTensor& residual) {
  SF_CHECK(place_.group != nullptr, "allreduce: the cpu backend belongs to no tensor-parallel group");
  check_f32(partial, "allreduce", "partial");
  if (!residual.empty()) {
    check_f32(residual, "allreduce", "residual");
    SF_CHECK(residual.shape == partial.shape, "cpu allreduce: residual {} and partial {} differ",
             shape_str(residual.shape), shape_str(partial.shape));
  }
  place_.group->allreduce(place_.group_rank, partial.as<float>(), residual.empty() ? nullptr : residual.as<float>(),
                          partial.numel());
}

void CpuBackend::gather_columns(const DeviceTensor& parts, const DeviceTensor& full) {
  SF_CHECK(place_.group != nullptr, "gather_columns: the cpu backend belongs to no tensor-parallel group");
  const int size = place_.group->size();
  const int64_t rows = check_gather_columns_args("cpu", parts, full, size);
  const int64_t shard = parts.shape[1];
  place_.group->gather_columns(place_.group_rank, parts.as<float>() + place_.group_rank * rows * shard, full.as<float>(),
                               rows, shard);
}

void CpuBackend::allgather_rows(const DeviceTensor& x) {
  SF_CHECK(place_.group != nullptr, "allgather_rows: the cpu backend belongs to no tensor-parallel group");
  const int size = place_.group->size();
  SF_CHECK(x.dtype == DType::F32 && x.shape.size() == 2 && x.dim(0) % size == 0,
           "cpu allgather_rows: x is {} {}, expected f32 [a multiple of {} rows, width]", dtype_name(x.dtype),
           shape_str(x.shape), size);
  place_.group->allgather(place_.group_rank, x.as<float>(), x.numel() / size);
}

void CpuBackend::send(const DeviceTensor& x, int peer) {
  SF_CHECK(place_.mailboxes != nullptr, "send: the cpu backend belongs to no job");
  place_.mailboxes->send(place_.job_rank, peer, x.data, x.dtype, x.numel());
}

void CpuBackend::recv(const DeviceTensor& x, int peer) {
  SF_CHECK(place_.mailboxes != nullptr, "recv: the cpu backend belongs to no job");
  place_.mailboxes->recv(peer, place_.job_rank, x.data, x.dtype, x.numel());
}

std::string CpuBackend::name() const { return "cpu"; }

std::span<const DType> CpuBackend::weight_dtypes() const {
  static constexpr DType kDtypes[] = {
      DType::F32,    DType::F16,    DType::BF16,   DType::Q4_0,   DType::Q4_1,    DType::Q5_0,       DType::Q5_1,
      DType::Q8_0,   DType::Q2_K,   DType::Q3_K,   DType::Q4_K,   DType::Q5_K,    DType::Q6_K,       DType::Q2_B32,
      DType::Q3_B32, DType::Q4_B32, DType::Q5_B32, DType::Q6_B32, DType::Q8_B32,  DType::Q2_B64,     DType::Q3_B64,
      DType::Q4_B64, DType::Q5_B64, DType::Q6_B64, DType::Q8_B64, DType::Q3H_B64, DType::F8_CHANNEL, DType::F8_G128,
      DType::I8_G32,  DType::I8_G64,  DType::I8_G128};
  return kDtypes;
}

std::span<const DType> CpuBackend::kv_cache_dtypes() const {
  static constexpr DType kDtypes[] = {DType::F32, DType::F16, DType::BF16, DType::F8E4M3};
  return kDtypes;
}

DeviceBuffer CpuBackend::allocate(DType dtype, Shape shape) {
  Tensor host = Tensor::zeros(dtype, std::move(shape));
  return DeviceBuffer(DeviceTensor{host.data, host.dtype, host.shape}, host.storage);
}

DeviceBuffer CpuBackend::upload(const Tensor& tensor) {
  SF_CHECK(!tensor.empty(), "cpu upload: tensor {} has no data", shape_str(tensor.shape));
  const Tensor host = materialize(tensor);
  DeviceTensor view{host.data, host.dtype, host.shape, host.row_runs};
  std::shared_ptr<void> owner = host.storage;
  if (!owner) {
    // A view without a keepalive may die with its caller: keep a copy (packed tensors as bytes).
    Tensor copy = Tensor::zeros(DType::U8, {static_cast<int64_t>(host.nbytes())});
    std::memcpy(copy.data, host.data, host.nbytes());
    view.data = copy.data;
    owner = copy.storage;
  }
  // A matrix the products read faster repacked, at its first one: the copy lives as long as this buffer.
  if (q8_activations_ && view.shape.size() == 2 && view.dim(0) >= 16 && interleaved_rows_supported(view.dtype)) {
    interleaved_->add(view.data, view.dtype, view.dim(0), view.dim(1), owner);
    owner = std::shared_ptr<void>(owner.get(),
                                  [owner, copies = interleaved_, key = view.data](void*) { copies->remove(key); });
  }
  return DeviceBuffer(std::move(view), std::move(owner));
}

void CpuBackend::copy_to_device(const void* host, const DeviceTensor& dst) {
  if (dst.nbytes() > 0) std::memcpy(dst.data, host, dst.nbytes());
}

void CpuBackend::copy_to_host(const DeviceTensor& src, void* host) {
  if (src.nbytes() > 0) std::memcpy(host, src.data, src.nbytes());
}

void CpuBackend::copy_blocks(const DeviceTensor& cache, const DeviceTensor& host, std::span<const BlockCopy> copies,
                             CopyDirection direction) {
  const size_t block_bytes = checked_block_copy_bytes(cache, host, copies, "cpu");
  const int64_t num_layers = cache.dim(0), num_blocks = cache.dim(1);
  char* const cache_bytes = static_cast<char*>(cache.data);
  char* const host_bytes = static_cast<char*>(host.data);
  for (const BlockCopy& copy : copies) {
    for (int64_t layer = 0; layer < num_layers; ++layer) {
      char* const on_device = cache_bytes + static_cast<size_t>(layer * num_blocks + copy.device_block) * block_bytes;
      char* const on_host = host_bytes + static_cast<size_t>(copy.host_block * num_layers + layer) * block_bytes;
      if (direction == CopyDirection::DeviceToHost) {
        std::memcpy(on_host, on_device, block_bytes);
      } else {
        std::memcpy(on_device, on_host, block_bytes);
      }
    }
  }
}

void CpuBackend::embed(const DeviceTensor& table, const DeviceTensor& token_ids, float multiplier,
                       const DeviceTensor& pos_table, const DeviceTensor& positions, const DeviceTensor& out) {
  SF_CHECK(table.dtype != DType::Mixed, "cpu embed: a mixed-dtype table {}", shape_str(table.shape));
  check_weight_dtype(table, "embed", "table");
  check_i32(token_ids, "embed", "token_ids");
  check_f32(out, "embed", "out");
  SF_CHECK(table.shape.size() == 2, "cpu embed: table has shape {}, expected [vocab, hidden]", shape_str(table.shape));
  const int64_t tokens = token_ids.numel(), vocab = table.dim(0), hidden = table.dim(1);
  check_shape(out, {tokens, hidden}, "embed", "out");
  const bool add_positions = !pos_table.empty();
  if (add_positions) {
    check_weight_dtype(pos_table, "embed", "pos_table");
    check_i32(positions, "embed", "positions");
    SF_CHECK(pos_table.shape.size() == 2 && pos_table.dim(1) == hidden,
             "cpu embed: pos_table has shape {}, expected [positions, {}]", shape_str(pos_table.shape), hidden);
    check_shape(positions, {tokens}, "embed", "positions");
  }
  // A tied head repacked already: its rows restored from the copy (the original's pages were released).
  const std::shared_ptr<const InterleavedRows> repacked =
      q8_activations_ && interleaved_rows_supported(table.dtype) ? interleaved_->find(table.data) : nullptr;
  const int32_t* ids = token_ids.as<int32_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    SF_CHECK(ids[t] >= 0 && ids[t] < vocab, "cpu embed: token id {} at row {} is outside the vocabulary [0, {})", ids[t],
             t, vocab);
    if (add_positions)
      SF_CHECK(positions.as<int32_t>()[t] >= 0 && positions.as<int32_t>()[t] < pos_table.dim(0),
               "cpu embed: position {} at row {} is outside the position table [0, {})", positions.as<int32_t>()[t], t,
               pos_table.dim(0));
  }
  float* y = out.as<float>();
  parallel_ranges(num_threads_, tokens, tokens * hidden >= kMinParallelWork, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> row;
    thread_local std::vector<uint8_t> stored;
    row.resize(hidden);
    for (int64_t t = begin; t < end; ++t) {
      if (repacked && ids[t] < repacked->groups * 16) {
        stored.resize(dtype_row_bytes(table.dtype, hidden));
        restore_row(*repacked, ids[t], stored.data());
        row_to_f32(stored.data(), table.dtype, 0, hidden, multiplier, y + t * hidden);
      } else {
        row_to_f32(table.data, table.dtype, ids[t], hidden, multiplier, y + t * hidden);
      }
      if (add_positions) {
        row_to_f32(pos_table.data, pos_table.dtype, positions.as<int32_t>()[t], hidden, 1.0f, row.data());
        axpy(1.0f, row.data(), y + t * hidden, hidden);
      }
    }
  });
}

void CpuBackend::add_norm(const DeviceTensor& residual, const DeviceTensor& delta, const DeviceTensor& weight,
                          const DeviceTensor& bias, const NormParams& params, const DeviceTensor& out) {
  check_f32(residual, "add_norm", "residual");
  check_f32(weight, "add_norm", "weight");
  check_f32(out, "add_norm", "out");
  SF_CHECK(residual.shape.size() == 2, "cpu add_norm: residual has shape {}, expected [tokens, hidden]",
           shape_str(residual.shape));
  const int64_t tokens = residual.dim(0), hidden = residual.dim(1);
  check_shape(out, residual.shape, "add_norm", "out");
  check_shape(weight, {hidden}, "add_norm", "weight");
  if (!delta.empty()) {
    check_f32(delta, "add_norm", "delta");
    check_shape(delta, residual.shape, "add_norm", "delta");
  }
  if (!bias.empty()) {
    check_f32(bias, "add_norm", "bias");
    check_shape(bias, {hidden}, "add_norm", "bias");
  }
  const float* w = weight.as<float>();
  const float* b = bias.empty() ? nullptr : bias.as<float>();
  parallel_ranges(num_threads_, tokens, tokens * hidden >= kMinParallelWork, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* x = residual.as<float>() + t * hidden;
      float* y = out.as<float>() + t * hidden;
      if (!delta.empty()) axpy(1.0f, delta.as<float>() + t * hidden, x, hidden);
      normalize_row(x, hidden, w, params, y);
      if (b != nullptr)
        for (int64_t i = 0; i < hidden; ++i) y[i] += b[i];
    }
  });
}

void CpuBackend::matmul(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias, const DeviceTensor& y,
                        bool accumulate) {
  check_f32(x, "matmul", "x");
  check_weight_dtype(w, "matmul", "w");
  check_f32(y, "matmul", "y");
  SF_CHECK(x.shape.size() == 2 && w.shape.size() == 2 && x.dim(1) == w.dim(1),
           "cpu matmul: x {} and w {} do not agree (expected [m, k] and [n, k])", shape_str(x.shape),
           shape_str(w.shape));
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  check_shape(y, {m, n}, "matmul", "y");
  if (!bias.empty()) {
    check_f32(bias, "matmul", "bias");
    check_shape(bias, {n}, "matmul", "bias");
  }
  if (m == 0 || n == 0) return;
  float* out = y.as<float>();
  // A repacked matrix (decode and prefill alike): its whole 16-row groups from the copy, then the
  // rest as stored.
  if (q8_activations_ && interleaved_rows_supported(w.dtype)) {
    if (const std::shared_ptr<const InterleavedRows> rows = interleaved_->get(w.data, num_threads_)) {
      // The original's pages may be gone: a view other than the uploaded matrix cannot fall back to them.
      SF_CHECK(rows->k == k && n >= rows->groups * 16,
               "cpu matmul: w at this address was uploaded as a matrix of rows of {} (its first {} repacked); a view of "
               "{} x {} of it cannot be read", rows->k, rows->groups * 16, n, k);
      const int64_t done = rows->groups * 16;
      // A long prompt's rows: the stored-rows GEMM over rows restored from the copy (its tiles of x
      // reused across 18 weight rows beat the copy's own kernel from about 256 rows: Q6_K prefill
      // at 512 tokens 289-306 -> 319-353 tok/s; at 64 tokens the copy's kernel is 1.2-1.35x faster).
      if (m >= kRestoredGemmRows) {
        const size_t row_bytes = dtype_row_bytes(w.dtype, k);
        q8_gemm(x.as<float>(), m, k, nullptr, w.dtype, done, out, n, accumulate, num_threads_, [&](int64_t row) {
          thread_local std::vector<uint8_t> stored;
          stored.resize(row_bytes);
          restore_row(*rows, row, stored.data());
          return static_cast<const uint8_t*>(stored.data());
        });
      } else {
        interleaved_gemv(x.as<float>(), m, *rows, out, n, accumulate, num_threads_);
      }
      if (done < n)
        matmul_strided(x.as<float>(), m, k, w.rows(done, n - done).data, w.dtype, n - done, out + done, n,
                       MatmulMode{accumulate, true}, num_threads_);
      add_bias(bias, m, n, out);
      return;
    }
  }
  // A Mixed matrix: each run into its own output columns; accumulate adds in the same pass.
  for (const MatrixRun& run : w.runs())
    matmul_strided(x.as<float>(), m, k, run.rows.data, run.rows.dtype, run.rows.dim(0), out + run.first_row, n,
                   MatmulMode{accumulate, q8_activations_}, num_threads_);
  add_bias(bias, m, n, out);
}

void CpuBackend::rope(const DeviceTensor& qkv, const DeviceTensor& cos_sin, const DeviceTensor& table_rows,
                      const RopeParams& params) {
  check_rope_args("cpu", DType::F32, qkv, cos_sin, table_rows, params);
  const int half = params.rotary_dim / 2, head_dim = params.head_dim;
  const int64_t tokens = qkv.dim(0), width = (params.num_heads + 2 * params.num_kv_heads) * int64_t{head_dim};
  const int32_t* rows = table_rows.as<int32_t>();
  for (int64_t t = 0; t < tokens; ++t)
    SF_CHECK(rows[t] >= 0 && rows[t] < cos_sin.dim(0), "cpu rope: table row {} of token {} is outside [0, {})", rows[t],
             t, cos_sin.dim(0));
  const int rotated_heads = params.num_heads + params.num_kv_heads;
  parallel_ranges(num_threads_, tokens, tokens * rotated_heads * half >= kMinParallelWork, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* cos = cos_sin.as<float>() + static_cast<int64_t>(rows[t]) * 2 * half;
      const float* sin = cos + half;
      for (int head = 0; head < rotated_heads; ++head) {
        float* x = qkv.as<float>() + t * width + static_cast<int64_t>(head) * head_dim;
        if (params.style == RopeStyle::Half) {
          for (int i = 0; i < half; ++i) {
            const float x1 = x[i], x2 = x[i + half];
            x[i] = x1 * cos[i] - x2 * sin[i];
            x[i + half] = x2 * cos[i] + x1 * sin[i];
          }
        } else {
          for (int i = 0; i < half; ++i) {
            const float x1 = x[2 * i], x2 = x[2 * i + 1];
            x[2 * i] = x1 * cos[i] - x2 * sin[i];
            x[2 * i + 1] = x2 * cos[i] + x1 * sin[i];
          }
        }
      }
    }
  });
}

void CpuBackend::write_kv(const DeviceTensor& qkv, const DeviceTensor& slots, const AttentionParams& params,
                          const DeviceTensor& k_cache, const DeviceTensor& v_cache) {
  check_write_kv_args("cpu", DType::F32, kv_cache_dtypes(), qkv, slots, params, k_cache, v_cache);
  const int64_t kv_dim = int64_t{params.num_kv_heads} * params.head_dim;
  const int64_t q_dim = int64_t{params.num_heads} * params.head_dim;
  const int64_t tokens = qkv.dim(0), width = q_dim + 2 * kv_dim;
  const int64_t capacity = k_cache.dim(0) * params.block_size;
  const size_t slot_bytes = static_cast<size_t>(kv_dim) * dtype_size(k_cache.dtype);
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t slot = slots.as<int32_t>()[t];
    if (slot < 0) continue;
    SF_CHECK(slot < capacity, "cpu write_kv: slot {} of token {} is outside the cache ({} slots)", slot, t, capacity);
    const float* row = qkv.as<float>() + t * width;
    convert_from_f32(row + q_dim, k_cache.dtype, static_cast<char*>(k_cache.data) + slot * slot_bytes, kv_dim);
    convert_from_f32(row + q_dim + kv_dim, v_cache.dtype, static_cast<char*>(v_cache.data) + slot * slot_bytes, kv_dim);
  }
}

void CpuBackend::activation(const DeviceTensor& x, Activation act, bool gated, const DeviceTensor& out) {
  check_f32(x, "activation", "x");
  check_f32(out, "activation", "out");
  const int64_t tokens = out.dim(0), inner = out.dim(1);
  check_shape(x, {tokens, gated ? 2 * inner : inner}, "activation", "x");
  const int64_t stride = x.dim(1);
  // Split each row's columns too: decode has one row and the MLP is wide.
  const int64_t chunk = 512, chunks = (inner + chunk - 1) / chunk;
  parallel_ranges(num_threads_, tokens * chunks, tokens * inner >= kMinParallelWork, [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; ++item) {
      const int64_t t = item / chunks, begin = item % chunks * chunk, count = std::min(chunk, inner - begin);
      const float* row = x.as<float>() + t * stride;
      activate_row(row + begin, gated ? row + inner + begin : nullptr, act, out.as<float>() + t * inner + begin, count);
    }
  });
}

namespace {

// gather (packed[i] = table[rows[i]]) or scatter (table[rows[i]] = packed[i]) of whole rows, any dtype.
void move_rows(const char* kernel, const DeviceTensor& table, const DeviceTensor& rows, const DeviceTensor& packed,
               bool scatter) {
  check_i32(rows, kernel, "rows");
  SF_CHECK(packed.dtype == table.dtype, "cpu {}: the rows are {}, the table {}", kernel, dtype_name(packed.dtype),
           dtype_name(table.dtype));
  const int64_t count = rows.numel();
  check_shape(packed, {count, table.row_numel()}, kernel, scatter ? "x" : "out");
  const size_t row_bytes = table.nbytes() / static_cast<size_t>(std::max<int64_t>(table.dim(0), 1));
  for (int64_t i = 0; i < count; ++i) {
    const int32_t row = rows.as<int32_t>()[i];
    SF_CHECK(row >= 0 && row < table.dim(0), "cpu {}: row {} at {} is outside [0, {})", kernel, row, i, table.dim(0));
    char* in_table = static_cast<char*>(table.data) + row * row_bytes;
    char* in_packed = static_cast<char*>(packed.data) + i * row_bytes;
    std::memmove(scatter ? in_table : in_packed, scatter ? in_packed : in_table, row_bytes);
  }
}

}  // namespace

void CpuBackend::gather_rows(const DeviceTensor& x, const DeviceTensor& rows, const DeviceTensor& out) {
  move_rows("gather_rows", x, rows, out, false);
}

void CpuBackend::scatter_rows(const DeviceTensor& x, const DeviceTensor& rows, const DeviceTensor& out) {
  move_rows("scatter_rows", out, rows, x, true);
}

void CpuBackend::pool_rows(const DeviceTensor& x, const DeviceTensor& offsets, Pooling pooling,
                           const DeviceTensor& out) {
  check_f32(x, "pool_rows", "x");
  check_i32(offsets, "pool_rows", "offsets");
  check_f32(out, "pool_rows", "out");
  const int64_t spans = offsets.numel() - 1, cols = x.row_numel();
  SF_CHECK(spans >= 0, "cpu pool_rows: offsets is empty (it holds spans + 1 row starts)");
  check_shape(out, {spans, cols}, "pool_rows", "out");
  const int32_t* starts = offsets.as<int32_t>();
  for (int64_t s = 0; s < spans; ++s) {
    const int64_t begin = starts[s], end = starts[s + 1];
    SF_CHECK(begin >= 0 && begin < end && end <= x.dim(0), "cpu pool_rows: span {} is rows [{}, {}) of {}", s, begin,
             end, x.dim(0));
    float* pooled = out.as<float>() + s * cols;
    if (pooling != Pooling::Mean) {
      std::memmove(pooled, x.as<float>() + (pooling == Pooling::Cls ? begin : end - 1) * cols, cols * sizeof(float));
      continue;
    }
    std::vector<double> sum(static_cast<size_t>(cols), 0.0);
    for (int64_t r = begin; r < end; ++r)
      for (int64_t c = 0; c < cols; ++c) sum[c] += x.as<float>()[r * cols + c];
    for (int64_t c = 0; c < cols; ++c) pooled[c] = static_cast<float>(sum[c] / static_cast<double>(end - begin));
  }
}

void CpuBackend::set_discard_repacked_originals(bool on) { interleaved_->set_discard_exclusive(on); }

DeviceMemoryInfo CpuBackend::memory_info() const {
  DeviceMemoryInfo memory = read_host_memory();
  memory.free_bytes = std::max<int64_t>(memory.free_bytes - host_area_bytes_->load() - interleaved_->pending_bytes(), 0);
  return memory;
}

std::shared_ptr<void> CpuBackend::allocate_host(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* memory = std::aligned_alloc(64, rounded);
  SF_CHECK(memory != nullptr, "cpu allocate_host: out of memory for {} bytes", bytes);
  *host_area_bytes_ += static_cast<int64_t>(rounded);
  return std::shared_ptr<void>(memory, [counter = host_area_bytes_, rounded](void* p) {
    *counter -= static_cast<int64_t>(rounded);
    std::free(p);
  });
}

void CpuBackend::sample(const DeviceTensor& logits, const DeviceTensor& rows, const DeviceTensor& tokens) {
  check_f32(logits, "sample", "logits");
  check_i32(rows, "sample", "rows");
  check_i32(tokens, "sample", "tokens");
  SF_CHECK(logits.shape.size() == 2, "cpu sample: logits has shape {}, expected [rows, vocab]", shape_str(logits.shape));
  const int64_t count = logits.dim(0), vocab = logits.dim(1);
  check_shape(rows, {count, kSamplingRowWords}, "sample", "rows");
  check_shape(tokens, {count}, "sample", "tokens");
  const auto* params = reinterpret_cast<const SamplingRow*>(rows.data);
  parallel_ranges(num_threads_, count, count > 1, [&](int64_t begin, int64_t end) {
    thread_local RuleScratch scratch;
    for (int64_t r = begin; r < end; ++r) {
      const std::span<const float> row(logits.as<float>() + r * vocab, static_cast<size_t>(vocab));
      tokens.as<int32_t>()[r] = sample_by_rule(row, params[r], scratch);
    }
  });
}

}  // namespace cpu
}  // namespace splitflow
