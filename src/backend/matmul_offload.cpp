#include "backend/matmul_offload.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace splitflow {

namespace {

// The helper's GEMVs and GEMMs may read whole 16-byte words past a packed matrix's last row.
constexpr size_t kMatrixPad = 256;

bool is_float_type(DType dtype) { return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16; }

// `count` values of `from` (f32, f16 or bf16) as `to` (f32 or bf16), through f32 (core/dtype.h).
void convert(DType from, const void* src, DType to, void* dst, size_t count) {
  if (from == to) {
    std::memcpy(dst, src, count * dtype_size(from));
    return;
  }
  if (to == DType::F32) {
    convert_to_f32(from, src, static_cast<float*>(dst), count);
    return;
  }
  std::vector<float> wide;
  const float* values = static_cast<const float*>(src);
  if (from != DType::F32) {
    wide.resize(count);
    convert_to_f32(from, src, wide.data(), count);
    values = wide.data();
  }
  convert_from_f32(values, to, dst, count);
}

}  // namespace

MatmulOffloadBackend::MatmulOffloadBackend(std::unique_ptr<Backend> cpu, std::unique_ptr<Backend> helper,
                                           MatmulOffloadOptions options)
    : ForwardingBackend(std::move(cpu)), helper_(std::move(helper)), options_(options) {
  SF_CHECK(helper_ != nullptr, "matmul offload: no helper backend");
  SF_CHECK(options_.min_rows >= 1 && options_.chunk_rows >= 1,
           "matmul offload: rows per product ({}) and per trip ({}) must be positive", options_.min_rows,
           options_.chunk_rows);
  SF_CHECK(inner().activation_dtype() == DType::F32, "matmul offload: the CPU side's activations are {}, expected f32",
           dtype_name(inner().activation_dtype()));
  helper_dtype_ = helper_->activation_dtype();
  // The CPU side must keep each matrix's bytes as stored: this reads them at its first product of
  // the matrix, which may come after the CPU's own first product (its repack).
  if (auto* cpu = dynamic_cast<cpu::CpuBackend*>(&inner())) cpu->set_discard_repacked_originals(false);
  SF_CHECK(helper_dtype_ == DType::F32 || helper_dtype_ == DType::BF16,
           "matmul offload: the helper's activations are {}; expected f32 or bf16", dtype_name(helper_dtype_));
}

std::string MatmulOffloadBackend::name() const {
  return fmt::format("{} (products of >= {} rows on {})", inner().name(), options_.min_rows, helper_->name());
}

int64_t MatmulOffloadBackend::staging_bytes(int64_t largest_matrix_bytes, int64_t widest, DType helper_dtype,
                                            const MatmulOffloadOptions& options) {
  const int64_t x_chunk = options.chunk_rows * widest * static_cast<int64_t>(dtype_size(helper_dtype));
  const int64_t y_chunk = options.chunk_rows * widest * static_cast<int64_t>(sizeof(float));
  // Twice the matrix: the staged copy, and the one-time upload of a packed one that sizes the
  // helper's dequantization scratch (source_of), briefly both.
  return 2 * largest_matrix_bytes + static_cast<int64_t>(kMatrixPad) + x_chunk + y_chunk + kHelperReserveBytes;
}

DeviceBuffer MatmulOffloadBackend::upload(const Tensor& host) {
  DeviceBuffer buffer = inner().upload(host);
  const DeviceTensor stored = buffer.view();
  const bool matrix = stored.shape.size() == 2 && stored.data != nullptr &&
                      (is_quantized(stored.dtype) || stored.dtype == DType::Mixed || is_float_type(stored.dtype));
  // An address a freed buffer had may come back: what was known about it is gone with it.
  sources_.erase(stored.data);
  if (matrix) {
    uploaded_.insert_or_assign(stored.data, stored);
  } else {
    uploaded_.erase(stored.data);
  }
  return buffer;
}

DeviceBuffer MatmulOffloadBackend::allocate(DType dtype, Shape shape) {
  DeviceBuffer buffer = inner().allocate(dtype, std::move(shape));
  uploaded_.erase(buffer.view().data);  // not a matrix the CPU was given, whatever was there before
  sources_.erase(buffer.view().data);
  return buffer;
}

const MatmulOffloadBackend::Source& MatmulOffloadBackend::source_of(const DeviceTensor& w) {
  if (const auto it = sources_.find(w.data); it != sources_.end()) return it->second;
  const DeviceTensor& stored = uploaded_.at(w.data);
  const bool packed = is_quantized(stored.dtype) || stored.dtype == DType::Mixed;
  Source source;
  source.dtype = packed ? stored.dtype : helper_dtype_;
  source.shape = stored.shape;
  source.row_runs = stored.row_runs;
  // Every matrix streams from the helper's pinned memory: on an H100 host pageable memory crossed
  // at 6.3 GB/s against 53 GB/s pinned (bench/probes/h2d_bandwidth.py, 2026-12-07), so a copy
  // (converted to the helper's dtype where needed) pays for itself at the first prompt.
  source.pinned = helper_->allocate_host(source.bytes());
  if (packed || stored.dtype == helper_dtype_) {
    std::memcpy(source.pinned.get(), stored.data, source.bytes());
  } else {
    convert(stored.dtype, stored.data, helper_dtype_, source.pinned.get(), static_cast<size_t>(stored.numel()));
  }
  source.host = source.pinned.get();
  // A backend sizes what its packed products need (CUDA's dequantization scratch) when it uploads
  // a matrix, and the staged ones are never uploaded: upload each new largest once, and let it go.
  if (packed && source.bytes() > largest_packed_bytes_) {
    Tensor view = Tensor::view(source.dtype, source.shape, source.host, nullptr);
    view.row_runs = source.row_runs;
    (void)helper_->upload(view);
    largest_packed_bytes_ = source.bytes();
  }
  return sources_.emplace(w.data, std::move(source)).first->second;
}

void MatmulOffloadBackend::ensure_staging(const Source& source, int64_t widest) {
  if (source.bytes() > w_stage_bytes_) {
    w_stage_ = {};  // freed before the larger one is taken
    helper_->synchronize();
    w_stage_ = helper_->allocate(DType::U8, {static_cast<int64_t>(source.bytes() + kMatrixPad)});
    w_stage_bytes_ = source.bytes();
  }
  if (widest > staged_width_) {
    x_stage_ = {};
    y_stage_ = {};
    helper_->synchronize();
    x_stage_ = helper_->allocate(helper_dtype_, {options_.chunk_rows, widest});
    y_stage_ = helper_->allocate(DType::F32, {options_.chunk_rows, widest});
    const size_t chunk = static_cast<size_t>(options_.chunk_rows * widest);
    x_host_ = helper_->allocate_host(chunk * dtype_size(helper_dtype_));
    y_host_ = helper_->allocate_host(chunk * sizeof(float));
    staged_width_ = widest;
  }
}

void MatmulOffloadBackend::matmul(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias,
                                  const DeviceTensor& y, bool accumulate) {
  const auto it = x.shape.size() == 2 && x.dim(0) >= options_.min_rows ? uploaded_.find(w.data) : uploaded_.end();
  if (it == uploaded_.end() || it->second.shape != w.shape || it->second.dtype != w.dtype || x.dtype != DType::F32 ||
      y.dtype != DType::F32 || (!bias.empty() && bias.dtype != DType::F32)) {
    inner().matmul(x, w, bias, y, accumulate);
    return;
  }
  if (offloaded_products_ == 0)
    spdlog::info("matmul offload: products of >= {} rows go to {}", options_.min_rows, helper_->name());
  offload(source_of(w), x, bias, y, accumulate);
}

void MatmulOffloadBackend::offload(const Source& source, const DeviceTensor& x, const DeviceTensor& bias,
                                   const DeviceTensor& y, bool accumulate) {
  const int64_t m = x.dim(0), k = x.dim(1), n = source.shape[0];
  SF_CHECK(source.shape[1] == k && y.shape.size() == 2 && y.dim(0) == m && y.dim(1) == n,
           "matmul offload: x {} times w {} into y {}", shape_str(x.shape), shape_str(source.shape), shape_str(y.shape));
  ensure_staging(source, std::max(k, n));
  const DeviceTensor w_dev{w_stage_.view().data, source.dtype, source.shape, source.row_runs};
  helper_->copy_to_device(source.host, w_dev);
  const float* x_rows = static_cast<const float*>(x.data);
  float* y_rows = static_cast<float*>(y.data);
  const float* bias_values = bias.empty() ? nullptr : static_cast<const float*>(bias.data);
  // y comes back in f32 (Backend::matmul's logits form): no rounding, no conversion on the way back.
  const float* product = static_cast<const float*>(y_host_.get());
  for (int64_t first = 0; first < m; first += options_.chunk_rows) {
    const int64_t rows = std::min(options_.chunk_rows, m - first);
    convert(DType::F32, x_rows + first * k, helper_dtype_, x_host_.get(), static_cast<size_t>(rows * k));
    const DeviceTensor x_dev{x_stage_.view().data, helper_dtype_, {rows, k}};
    const DeviceTensor y_dev{y_stage_.view().data, DType::F32, {rows, n}};
    helper_->copy_to_device(x_host_.get(), x_dev);
    helper_->matmul(x_dev, w_dev, {}, y_dev, false);
    helper_->copy_to_host(y_dev, y_host_.get());
    for (int64_t r = 0; r < rows; ++r) {
      float* out = y_rows + (first + r) * n;
      const float* in = product + r * n;
      for (int64_t j = 0; j < n; ++j) {
        const float value = in[j] + (bias_values != nullptr ? bias_values[j] : 0.0f);
        out[j] = accumulate ? out[j] + value : value;
      }
    }
  }
  ++offloaded_products_;
  offloaded_weight_bytes_ += static_cast<int64_t>(source.bytes());
}

}  // namespace splitflow
