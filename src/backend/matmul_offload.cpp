#include "backend/matmul_offload.h"

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

// `count` values of `from` (f32, f16 or bf16) as `to` (f32 or bf16).
void convert(DType from, const void* src, DType to, void* dst, size_t count) {
  if (from == to) {
    std::memcpy(dst, src, count * dtype_size(from));
    return;
  }
  if (to == DType::F32) {
    convert_to_f32(from, src, static_cast<float*>(dst), count);
    return;
  }
  SF_CHECK(to == DType::BF16, "matmul offload: the helper's activations are {}; expected f32 or bf16", dtype_name(to));
  std::vector<float> wide;
  const float* values = static_cast<const float*>(src);
  if (from != DType::F32) {
    wide.resize(count);
    convert_to_f32(from, src, wide.data(), count);
    values = wide.data();
  }
  uint16_t* out = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < count; ++i) out[i] = f32_to_bf16(values[i]);
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
  return largest_matrix_bytes + static_cast<int64_t>(kMatrixPad) + x_chunk + y_chunk + kHelperReserveBytes;
}

DeviceBuffer MatmulOffloadBackend::upload(const Tensor& host) {
  DeviceBuffer buffer = inner().upload(host);
  const DeviceTensor stored = buffer.view();
  if (stored.shape.size() != 2 || stored.data == nullptr) return buffer;  // vectors, tables: the CPU's alone
  const bool packed = is_quantized(stored.dtype) || stored.dtype == DType::Mixed;
  if (!packed && !is_float_type(stored.dtype)) return buffer;  // integer tables
  Source source;
  source.dtype = packed ? stored.dtype : helper_dtype_;
  source.shape = stored.shape;
  source.row_runs = stored.row_runs;
  if (packed || stored.dtype == helper_dtype_) {
    source.host = stored.data;
  } else {
    const size_t count = static_cast<size_t>(stored.numel());
    source.converted = helper_->allocate_host(count * dtype_size(helper_dtype_));
    convert(stored.dtype, stored.data, helper_dtype_, source.converted.get(), count);
    source.host = source.converted.get();
  }
  largest_bytes_ = std::max(largest_bytes_, source.bytes());
  widest_ = std::max({widest_, stored.dim(0), stored.dim(1)});
  const auto [it, inserted] = sources_.insert_or_assign(stored.data, std::move(source));
  if (packed && (largest_packed_ == nullptr || it->second.bytes() > largest_packed_->bytes())) largest_packed_ = &it->second;
  return buffer;
}

void MatmulOffloadBackend::ensure_staging() {
  if (!w_stage_.view().empty()) return;
  w_stage_ = helper_->allocate(DType::U8, {static_cast<int64_t>(largest_bytes_ + kMatrixPad)});
  x_stage_ = helper_->allocate(helper_dtype_, {options_.chunk_rows, widest_});
  y_stage_ = helper_->allocate(DType::F32, {options_.chunk_rows, widest_});
  const size_t chunk = static_cast<size_t>(options_.chunk_rows * widest_);
  x_host_ = helper_->allocate_host(chunk * dtype_size(helper_dtype_));
  y_host_ = helper_->allocate_host(chunk * sizeof(float));
  // A backend sizes what its packed products need (CUDA's dequantization scratch) when it uploads
  // a matrix, and the staged ones are never uploaded: upload the largest once, and let it go.
  if (largest_packed_ != nullptr) {
    Tensor largest = Tensor::view(largest_packed_->dtype, largest_packed_->shape, largest_packed_->host, nullptr);
    largest.row_runs = largest_packed_->row_runs;
    (void)helper_->upload(largest);
  }
  spdlog::info("matmul offload: products of >= {} rows go to {} ({:.1f} MiB of staging there)", options_.min_rows,
               helper_->name(),
               static_cast<double>(largest_bytes_ + chunk * (dtype_size(helper_dtype_) + sizeof(float))) /
                   double(1 << 20));
}

void MatmulOffloadBackend::matmul(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias,
                                  const DeviceTensor& y, bool accumulate) {
  const auto it = x.shape.size() == 2 && x.dim(0) >= options_.min_rows ? sources_.find(w.data) : sources_.end();
  if (it == sources_.end() || it->second.shape != w.shape || x.dtype != DType::F32 || y.dtype != DType::F32 ||
      (!bias.empty() && bias.dtype != DType::F32)) {
    inner().matmul(x, w, bias, y, accumulate);
    return;
  }
  offload(it->second, x, bias, y, accumulate);
}

void MatmulOffloadBackend::offload(const Source& source, const DeviceTensor& x, const DeviceTensor& bias,
                                   const DeviceTensor& y, bool accumulate) {
  const int64_t m = x.dim(0), k = x.dim(1), n = source.shape[0];
  SF_CHECK(source.shape[1] == k && y.shape.size() == 2 && y.dim(0) == m && y.dim(1) == n,
           "matmul offload: x {} times w {} into y {}", shape_str(x.shape), shape_str(source.shape), shape_str(y.shape));
  ensure_staging();
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
