// quant/quant.cpp — the type table, row dispatch to the family codecs, and the whole-tensor
// quantize / dequantize / validate loops (rows in parallel).
#include "quant/quant.h"

#include "core/counter_hash.h"
#include "core/error.h"
#include "quant/codecs.h"

#include <array>
#include <cmath>
#include <exception>
#include <mutex>
#include <vector>

namespace splitflow::quant {

namespace {

constexpr int64_t kBitsReferenceRow = 4096;

TypeInfo make_info(DType type, Family family, std::string_view summary) {
  const double bits = static_cast<double>(dtype_row_bytes(type, kBitsReferenceRow)) * 8.0 / kBitsReferenceRow;
  return {type, family, dtype_block_elems(type), bits, summary};
}

const std::vector<TypeInfo>& type_table() {
  static const std::vector<TypeInfo> table = {
      make_info(DType::Q4_0, Family::Gguf, "GGUF 4-bit, blocks of 32 with an fp16 scale"),
      make_info(DType::Q4_1, Family::Gguf, "GGUF 4-bit, blocks of 32 with fp16 scale and min"),
      make_info(DType::Q5_0, Family::Gguf, "GGUF 5-bit, blocks of 32 with an fp16 scale"),
      make_info(DType::Q5_1, Family::Gguf, "GGUF 5-bit, blocks of 32 with fp16 scale and min"),
      make_info(DType::Q8_0, Family::Gguf, "GGUF 8-bit, blocks of 32 with an fp16 scale"),
      make_info(DType::Q2_K, Family::Gguf, "GGUF 2-bit K-quant, super-blocks of 256 (4-bit sub-scales and mins)"),
      make_info(DType::Q3_K, Family::Gguf, "GGUF 3-bit K-quant, super-blocks of 256 (6-bit sub-scales)"),
      make_info(DType::Q4_K, Family::Gguf, "GGUF 4-bit K-quant, super-blocks of 256 (6-bit sub-scales and mins)"),
      make_info(DType::Q5_K, Family::Gguf, "GGUF 5-bit K-quant, super-blocks of 256 (6-bit sub-scales and mins)"),
      make_info(DType::Q6_K, Family::Gguf, "GGUF 6-bit K-quant, super-blocks of 256 (8-bit sub-scales)"),
      make_info(DType::Q2_B32, Family::Inferflow, "Inferflow 2-bit min/max, blocks of 32"),
      make_info(DType::Q3_B32, Family::Inferflow, "Inferflow 3-bit min/max, blocks of 32"),
      make_info(DType::Q4_B32, Family::Inferflow, "Inferflow 4-bit min/max, blocks of 32"),
      make_info(DType::Q5_B32, Family::Inferflow, "Inferflow 5-bit min/max, blocks of 32"),
      make_info(DType::Q6_B32, Family::Inferflow, "Inferflow 6-bit min/max, blocks of 32"),
      make_info(DType::Q8_B32, Family::Inferflow, "Inferflow 8-bit min/max, blocks of 32"),
      make_info(DType::Q2_B64, Family::Inferflow, "Inferflow 2-bit min/max, blocks of 64"),
      make_info(DType::Q3_B64, Family::Inferflow, "Inferflow 3-bit min/max, blocks of 64"),
      make_info(DType::Q4_B64, Family::Inferflow, "Inferflow 4-bit min/max, blocks of 64"),
      make_info(DType::Q5_B64, Family::Inferflow, "Inferflow 5-bit min/max, blocks of 64"),
      make_info(DType::Q6_B64, Family::Inferflow, "Inferflow 6-bit min/max, blocks of 64"),
      make_info(DType::Q8_B64, Family::Inferflow, "Inferflow 8-bit min/max, blocks of 64"),
      make_info(DType::Q3H_B64, Family::Inferflow, "Inferflow 3.5-bit: 11 levels, two weights per 7-bit code, blocks of 64"),
      make_info(DType::F8_CHANNEL, Family::Fp8, "FP8 E4M3 weight-only, one f32 scale per output row"),
      make_info(DType::F8_G128, Family::Fp8, "FP8 E4M3 weight-only, one f32 scale per 128 elements"),
      make_info(DType::I8_G32, Family::Int8, "int8, one f32 scale per 32 elements (llama2.c's Q8_0 export)"),
      make_info(DType::I8_G64, Family::Int8, "int8, one f32 scale per 64 elements (llama2.c's Q8_0 export)"),
      make_info(DType::I8_G128, Family::Int8, "int8, one f32 scale per 128 elements (llama2.c's Q8_0 export)"),
  };
  return table;
}

// Runs body(row) for every row in parallel; the first exception thrown (by row order) is rethrown.
template <typename Body>
void for_each_row(int64_t rows, Body body) {
  std::mutex mutex;
  int64_t failed_row = rows;
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t row = 0; row < rows; ++row) {
    try {
      body(row);
    } catch (...) {
      std::lock_guard lock(mutex);
      if (row < failed_row) {
        failed_row = row;
        error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

void check_row_len(DType type, int64_t k) {
  SF_CHECK(k >= 0 && k % dtype_block_elems(type) == 0,
           "a row of {} elements is not a whole number of {} blocks ({} elements each)", k, dtype_name(type),
           dtype_block_elems(type));
}

int64_t rows_of(const Shape& shape) {
  const int64_t cols = shape.back();
  return cols == 0 ? 0 : shape_numel(shape) / cols;
}

// Row `row` of a plain, generated or quantized matrix as float32.
void source_row(const Tensor& matrix, int64_t row, int64_t cols, float* out) {
  if (matrix.generated) {
    const GeneratedNormal g = *matrix.generated;
    for (int64_t c = 0; c < cols; ++c) out[c] = generated_normal_value(g.key, g.stddev, row * cols + c);
    if (matrix.dtype != DType::F32) {  // the values a materialized tensor of this dtype holds
      std::vector<uint16_t> rounded(static_cast<size_t>(cols));
      convert_from_f32(out, matrix.dtype, rounded.data(), rounded.size());
      convert_to_f32(matrix.dtype, rounded.data(), out, rounded.size());
    }
    return;
  }
  const auto* bytes = static_cast<const uint8_t*>(matrix.data);
  if (is_quantized(matrix.dtype)) {
    dequantize_row(matrix.dtype, bytes + row * dtype_row_bytes(matrix.dtype, cols), out, cols);
  } else {
    const size_t element = dtype_size(matrix.dtype);
    convert_to_f32(matrix.dtype, bytes + row * cols * element, out, static_cast<size_t>(cols));
  }
}

}  // namespace

std::span<const TypeInfo> all_types() { return type_table(); }

const TypeInfo& info(DType type) {
  for (const TypeInfo& entry : type_table())
    if (entry.type == type) return entry;
  fail("dtype {} is not a quantized type (known: {})", dtype_name(type),
       dtype_names([] {
         std::vector<DType> types;
         for (const TypeInfo& entry : type_table()) types.push_back(entry.type);
         return types;
       }()));
}

void dequantize_row(DType type, const void* row, float* out, int64_t k) {
  check_row_len(type, k);
  const auto* bytes = static_cast<const uint8_t*>(row);
  switch (info(type).family) {
    case Family::Gguf: return detail::dequantize_gguf_row(type, bytes, out, k);
    case Family::Inferflow: return detail::dequantize_inferflow_row(type, bytes, out, k);
    case Family::Fp8: return detail::dequantize_fp8_row(type, bytes, out, k);
    case Family::Int8: return detail::dequantize_int8_row(type, bytes, out, k);
  }
}

void quantize_row(DType type, const float* in, void* row, int64_t k) {
  check_row_len(type, k);
  for (int64_t i = 0; i < k; ++i)
    SF_CHECK(std::isfinite(in[i]), "quantize to {}: element {} of the row is {} (weights must be finite)",
             dtype_name(type), i, in[i]);
  auto* bytes = static_cast<uint8_t*>(row);
  switch (info(type).family) {
    case Family::Gguf: return detail::quantize_gguf_row(type, in, bytes, k);
    case Family::Inferflow: return detail::quantize_inferflow_row(type, in, bytes, k);
    case Family::Fp8: return detail::quantize_fp8_row(type, in, bytes, k);
    case Family::Int8: return detail::quantize_int8_row(type, in, bytes, k);
  }
}

Tensor quantize(const Tensor& matrix, DType type) {
  info(type);  // throws for a type that is not quantized
  SF_CHECK(!matrix.shape.empty(), "quantize to {}: a scalar is not a matrix", dtype_name(type));
  if (matrix.dtype == DType::Mixed) return quantize(dequantize(matrix), type);  // runs of different types
  SF_CHECK(matrix.generated || matrix.data || matrix.numel() == 0, "quantize to {}: the {} matrix has no data",
           dtype_name(type), shape_str(matrix.shape));
  const int64_t cols = matrix.shape.back();
  SF_CHECK(cols % dtype_block_elems(type) == 0,
           "quantize to {}: the matrix {} has rows of {} elements, not a multiple of the {}-element block",
           dtype_name(type), shape_str(matrix.shape), cols, dtype_block_elems(type));
  SF_CHECK(matrix.generated || is_quantized(matrix.dtype) || matrix.dtype == DType::F32 ||
               matrix.dtype == DType::F16 || matrix.dtype == DType::BF16 || matrix.dtype == DType::F64 ||
               matrix.dtype == DType::F8E4M3,
           "quantize to {}: the matrix {} is {}, not a float type (f32, f16, bf16, f64, f8_e4m3) or quantized",
           dtype_name(type), shape_str(matrix.shape), dtype_name(matrix.dtype));
  Tensor out = Tensor::zeros(type, matrix.shape);
  const size_t row_bytes = dtype_row_bytes(type, cols);
  auto* packed = out.as<uint8_t>();
  for_each_row(rows_of(matrix.shape), [&](int64_t row) {
    thread_local std::vector<float> values;
    values.resize(static_cast<size_t>(cols));
    source_row(matrix, row, cols, values.data());
    try {
      quantize_row(type, values.data(), packed + row * row_bytes, cols);
    } catch (const Error& e) {
      fail("row {} of the {} matrix: {}", row, shape_str(matrix.shape), e.what());
    }
  });
  return out;
}

Tensor dequantize(const Tensor& tensor) {
  if (tensor.empty()) return tensor;
  if (tensor.generated || (!is_quantized(tensor.dtype) && tensor.dtype != DType::Mixed))
    return to_dtype(tensor, DType::F32);
  SF_CHECK(!tensor.shape.empty(), "dequantize: a {} tensor cannot be a scalar", dtype_name(tensor.dtype));
  Tensor out = Tensor::zeros(DType::F32, tensor.shape);
  const int64_t cols = tensor.shape.back();
  const auto* packed = static_cast<const uint8_t*>(tensor.data);
  // Each run of rows: its type and where its bytes start (one run for a single-type tensor).
  struct Run {
    DType type;
    int64_t first_row, rows;
    const uint8_t* bytes;
  };
  std::vector<Run> runs;
  if (tensor.dtype == DType::Mixed) {
    tensor.nbytes();  // checks the runs against the shape
    int64_t row = 0;
    for (const RowRun& run : *tensor.row_runs) {
      runs.push_back({run.dtype, row, run.rows, packed});
      packed += static_cast<size_t>(run.rows) * dtype_row_bytes(run.dtype, cols);
      row += run.rows;
    }
  } else {
    runs.push_back({tensor.dtype, 0, rows_of(tensor.shape), packed});
  }
  float* values = out.as<float>();
  for (const Run& run : runs) {
    const size_t row_bytes = dtype_row_bytes(run.type, cols);
    for_each_row(run.rows, [&](int64_t r) {
      float* dst = values + (run.first_row + r) * cols;
      const uint8_t* src = run.bytes + r * row_bytes;
      if (is_quantized(run.type))
        dequantize_row(run.type, src, dst, cols);
      else
        convert_to_f32(run.type, src, dst, static_cast<size_t>(cols));
    });
  }
  return out;
}

void validate(const Tensor& tensor, const std::string& what) {
  if (tensor.empty() || tensor.generated || (!is_quantized(tensor.dtype) && tensor.dtype != DType::Mixed)) return;
  SF_CHECK(!tensor.shape.empty() && tensor.data, "{}: a {} tensor {} without packed data", what,
           dtype_name(tensor.dtype), shape_str(tensor.shape));
  const int64_t cols = tensor.shape.back();
  const auto* packed = static_cast<const uint8_t*>(tensor.data);
  std::vector<RowRun> runs;
  if (tensor.dtype == DType::Mixed) {
    tensor.nbytes();
    runs = *tensor.row_runs;
  } else {
    runs.push_back({tensor.dtype, rows_of(tensor.shape)});
  }
  int64_t first_row = 0;
  for (const RowRun& run : runs) {
    if (!is_quantized(run.dtype)) {
      packed += static_cast<size_t>(run.rows) * dtype_row_bytes(run.dtype, cols);
      first_row += run.rows;
      continue;
    }
    const Family family = info(run.dtype).family;
    const size_t row_bytes = dtype_row_bytes(run.dtype, cols);
    const auto find_bad = [&](int64_t r) -> std::optional<detail::BadScale> {
      const uint8_t* row = packed + r * row_bytes;
      switch (family) {
        case Family::Gguf: return detail::find_bad_gguf_scale(run.dtype, row, cols);
        case Family::Inferflow: return detail::find_bad_inferflow_scale(run.dtype, row, cols);
        case Family::Fp8: return detail::find_bad_fp8_scale(run.dtype, row, cols);
        case Family::Int8: return detail::find_bad_int8_scale(run.dtype, row, cols);
      }
      return std::nullopt;
    };
    // Scan in parallel; report the first bad row in order.
    for_each_row(run.rows, [&](int64_t r) {
      if (const auto bad = find_bad(r))
        fail("{}: {} row {} block {}: its {} is {} (scales must be finite; the data is corrupt)", what,
             dtype_name(run.dtype), first_row + r, bad->block, bad->field, bad->value);
    });
    packed += static_cast<size_t>(run.rows) * row_bytes;
    first_row += run.rows;
  }
}

void check_packed_bytes(const Tensor& tensor, size_t available_bytes, const std::string& what) {
  const size_t needed = tensor.nbytes();
  SF_CHECK(available_bytes >= needed, "{}: a {} tensor {} needs {} bytes, the data has {} (truncated)", what,
           dtype_name(tensor.dtype), shape_str(tensor.shape), needed, available_bytes);
}

}  // namespace splitflow::quant
