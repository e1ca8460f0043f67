#include "model/weights.h"

#include "core/counter_hash.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "quant/quant.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

namespace splitflow {
namespace {

bool is_float(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16 || dtype == DType::F64;
}

void check_matrix_dtype(DType dtype) {
  SF_CHECK(dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16,
           "weight dtype {} is not supported for matrices (f32, f16 or bf16)", dtype_name(dtype));
}

Tensor quantize_matrix(const MatrixQuantizer& quantizer, const Tensor& matrix, DType type) {
  return quantizer ? quantizer(matrix, type) : quant::quantize(matrix, type);
}

void check_quantization(std::optional<DType> quantization) {
  SF_CHECK(!quantization || is_quantized(*quantization), "quantization type {} is not a quantized type (one of: {})",
           dtype_name(*quantization), quantized_type_names());
}

std::string with_layer(const std::string& pattern, int layer) {
  std::string name = pattern;
  const std::string placeholder = "{layer}";
  for (size_t at = name.find(placeholder); at != std::string::npos; at = name.find(placeholder, at))
    name.replace(at, placeholder.size(), std::to_string(layer));
  return name;
}

// Copies `src` into rows [row_offset, row_offset + rows) of `dst` (a [*, cols] matrix or a vector),
// converting the dtype. `transposed`: src is stored [cols, rows] (Conv1D [in, out]).
void write_rows(const Tensor& src, bool transposed, Tensor& dst, int64_t row_offset) {
  const int64_t rows = transposed ? src.dim(1) : src.dim(0);
  const int64_t cols = src.shape.size() == 1 ? 1 : (transposed ? src.dim(0) : src.dim(1));
  const size_t src_size = dtype_size(src.dtype), dst_size = dtype_size(dst.dtype);
  const auto* in = static_cast<const uint8_t*>(src.data);
  auto* out = static_cast<uint8_t*>(dst.data) + static_cast<size_t>(row_offset * cols) * dst_size;
  if (!transposed && src.dtype == dst.dtype) {
    std::memcpy(out, in, static_cast<size_t>(rows * cols) * src_size);
    return;
  }
  if (!transposed) {
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(cols));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        convert_to_f32(src.dtype, in + static_cast<size_t>(r * cols) * src_size, row.data(), row.size());
        convert_from_f32(row.data(), dst.dtype, out + static_cast<size_t>(r * cols) * dst_size, row.size());
      }
    }
    return;
  }
  // Transpose in blocks of output rows: read each stored row's slice [r0, r0 + block) once.
  constexpr int64_t kBlock = 32;
  const int64_t blocks = (rows + kBlock - 1) / kBlock;
#pragma omp parallel
  {
    std::vector<float> slice(kBlock), tile(static_cast<size_t>(kBlock * cols));
#pragma omp for schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t r0 = block * kBlock, count = std::min(kBlock, rows - r0);
      for (int64_t c = 0; c < cols; ++c) {
        convert_to_f32(src.dtype, in + static_cast<size_t>(c * rows + r0) * src_size, slice.data(), static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i) tile[static_cast<size_t>(i * cols + c)] = slice[static_cast<size_t>(i)];
      }
      for (int64_t i = 0; i < count; ++i)
        convert_from_f32(tile.data() + i * cols, dst.dtype, out + static_cast<size_t>((r0 + i) * cols) * dst_size,
                         static_cast<size_t>(cols));
    }
  }
}

// A checkpoint tensor just copied into a fused matrix leaves the resident set: keeps a GGUF's
// resident memory near its file size although q/k/v and gate/up are copied.
void release_pages(const Tensor& part) { release_resident_pages(part.data, part.nbytes()); }

// Zeroed storage for a packed matrix (quantized, or Mixed with its row runs).
Tensor packed_zeros(DType dtype, Shape shape, RowRuns runs = {}) {
  Tensor out = Tensor::zeros(DType::U8, {static_cast<int64_t>(storage_bytes(dtype, shape, runs))});
  out.dtype = dtype;
  out.shape = std::move(shape);
  out.row_runs = std::move(runs);
  return out;
}

// A fused per-head QKV ([q; k; v] of head_dim rows for each head) reordered to q rows, k rows,
// v rows. Works on matrices (plain or quantized: rows move as bytes) and on bias vectors (cols = 1).
Tensor per_head_to_concat(const Tensor& fused, int num_heads, int head_dim) {
  const bool packed = is_quantized(fused.dtype);
  Tensor out = packed ? packed_zeros(fused.dtype, fused.shape) : Tensor::zeros(fused.dtype, fused.shape);
  const int64_t cols = fused.shape.size() == 1 ? 1 : fused.dim(1);
  const size_t block_bytes = packed ? static_cast<size_t>(head_dim) * dtype_row_bytes(fused.dtype, cols)
                                    : static_cast<size_t>(head_dim * cols) * dtype_size(fused.dtype);
  const auto* in = static_cast<const uint8_t*>(fused.data);
  auto* dst = static_cast<uint8_t*>(out.data);
  const size_t section_bytes = static_cast<size_t>(num_heads) * block_bytes;  // all q rows
  for (int head = 0; head < num_heads; ++head)
    for (int part = 0; part < 3; ++part)
      std::memcpy(dst + part * section_bytes + head * block_bytes, in + (head * 3 + part) * block_bytes, block_bytes);
  return out;
}

// The table the runtime reads (ModelWeights::pos_embed): rows [offset, offset + positions) of a
// checkpoint's position table, plus token type 0's row when a token-type table is given.
Tensor position_rows(const Tensor& table, int64_t offset, int64_t positions, const Tensor& token_types) {
  if (offset == 0 && token_types.empty()) return table;
  SF_CHECK(table.dim(0) >= offset + positions, "position table {}: fewer than {} + {} rows", shape_str(table.shape),
           offset, positions);
  const int64_t hidden = table.dim(1);
  const Tensor all = to_dtype(materialize(table), DType::F32);
  Tensor rows = Tensor::zeros(DType::F32, {positions, hidden});
  std::memcpy(rows.data, all.as<float>() + offset * hidden, static_cast<size_t>(positions * hidden) * sizeof(float));
  if (!token_types.empty()) {
    const Tensor types = to_dtype(materialize(token_types), DType::F32);
    float* out = rows.as<float>();
    for (int64_t p = 0; p < positions; ++p)
      for (int64_t i = 0; i < hidden; ++i) out[p * hidden + i] += types.as<float>()[i];
  }
  return rows;
}

class Binder {
 public:
  Binder(const ModelSpec& spec, const WeightSource& source, DType matrix_dtype, std::optional<DType> quantization,
         const MatrixQuantizer& quantizer)
      : spec_(spec), names_(spec.tensors), source_(source), matrix_dtype_(matrix_dtype), quantization_(quantization),
        quantizer_(quantizer) {
    for (const TensorInfo& info : source.tensors()) by_name_.emplace(info.name, &info);
  }

  // `warn`: report the checkpoint tensors no field used (an encoder_decoder's encoder binder leaves
  // that to the decoder's, which counts the encoder's tensors as used).
  ModelWeights bind(bool warn = true) {
    const int64_t hidden = spec_.hidden_size, vocab = spec_.vocab_size;
    ModelWeights weights;
    weights.embed = matrix("embed", names_.embed, -1, {vocab, hidden}, /*projection=*/false, /*quantize=*/false);
    if (spec_.position == PositionType::Learned) {
      const int64_t offset = spec_.position_offset;
      weights.pos_embed = matrix("pos_embed", names_.pos_embed, -1, {spec_.max_position + offset, hidden}, false, false);
      Tensor token_types;
      if (spec_.token_types > 0)
        token_types = matrix("token_type_embed", names_.token_type_embed, -1, {spec_.token_types, hidden}, false, false);
      weights.pos_embed = position_rows(weights.pos_embed, offset, spec_.max_position, token_types);
    }
    if (spec_.embedding_norm) {
      weights.embed_norm = vector("embed_norm", names_.embed_norm, -1, hidden);
      if (spec_.norm.bias) weights.embed_norm_bias = bias("embed_norm", names_.embed_norm, -1, hidden);
    }
    if (!names_.final_norm.empty()) {
      weights.final_norm = vector("final_norm", names_.final_norm, -1, hidden);
      if (spec_.norm.bias) weights.final_norm_bias = bias("final_norm", names_.final_norm, -1, hidden);
    }
    if (spec_.network != NetworkType::EncoderOnly) bind_lm_head(weights);
    weights.layers.resize(static_cast<size_t>(spec_.num_layers));
    for (int layer = 0; layer < spec_.num_layers; ++layer) bind_layer(layer, weights.layers[static_cast<size_t>(layer)]);
    if (spec_.position == PositionType::Relative) {
      const Shape shape = {spec_.relative_attention.num_buckets, spec_.attention.num_heads};
      const TensorInfo& info = require("relative_bias", names_.relative_bias, -1, names_.weight_suffix);
      check_shape(info, shape, "relative_bias", names_.relative_bias, -1);
      weights.relative_bias = Tensor::zeros(DType::F32, shape);
      write_rows(info.tensor, false, weights.relative_bias, 0);
    }
    if (!names_.logits_bias.empty()) {
      // Stored as (1, vocab) by transformers (final_logits_bias), or flat.
      const TensorInfo& info = require("logits_bias", names_.logits_bias, -1, "");
      const Shape& stored = info.tensor.shape;
      SF_CHECK((stored.size() == 1 && stored[0] == vocab) || (stored.size() == 2 && stored[0] == 1 && stored[1] == vocab),
               "tensor '{}' (from {}) has shape {}, expected [{}] or [1, {}]", info.name,
               describe("logits_bias", names_.logits_bias, -1), shape_str(stored), vocab, vocab);
      weights.logits_bias = Tensor::zeros(DType::F32, {vocab});
      write_rows(info.tensor, false, weights.logits_bias, 0);  // vocab values either way
    }
    if (spec_.network == NetworkType::EncoderDecoder) {
      Binder encoder(spec_.encoder_spec(), source_, matrix_dtype_, quantization_, quantizer_);
      weights.encoder = std::make_shared<ModelWeights>(encoder.bind(/*warn=*/false));
      used_.insert(encoder.used_.begin(), encoder.used_.end());
    }
    if (warn) warn_unused();
    return weights;
  }

 private:
  // Every checkpoint name a spec field may have: its '|' alternatives under every name prefix.
  std::vector<std::string> candidates(const std::string& pattern, int layer, const std::string& suffix) const {
    std::vector<std::string> names;
    for (const std::string& alternative : tensor_name_alternatives(pattern))
      for (const std::string& prefix : names_.name_prefixes) names.push_back(prefix + with_layer(alternative, layer) + suffix);
    return names;
  }

  // The checkpoint tensor for a spec field; null when absent under every candidate name.
  const TensorInfo* find(const std::string& pattern, int layer, const std::string& suffix) {
    for (const std::string& name : candidates(pattern, layer, suffix)) {
      auto it = by_name_.find(name);
      if (it == by_name_.end()) continue;
      used_.insert(it->first);
      return it->second;
    }
    return nullptr;
  }

  std::string describe(const std::string& field, const std::string& pattern, int layer) const {
    return layer < 0 ? fmt::format("tensors.{} = '{}'", field, pattern)
                     : fmt::format("tensors.{} = '{}', layer {}", field, pattern, layer);
  }

  // `is_matrix`: the tensor may be quantized (packed blocks); vectors must be floats.
  const TensorInfo& require(const std::string& field, const std::string& pattern, int layer, const std::string& suffix,
                            bool is_matrix = false) {
    const TensorInfo* info = find(pattern, layer, suffix);
    if (!info)
      fail("missing tensor '{}' (from {}) in the {} checkpoint{}", fmt::join(candidates(pattern, layer, suffix), "' or '"),
           describe(field, pattern, layer), source_.format(), source_file());
    SF_CHECK(is_float(info->tensor.dtype) ||
                 (is_matrix && (is_quantized(info->tensor.dtype) || info->tensor.dtype == DType::F8E4M3)),
             "tensor '{}' in '{}' has dtype {}; weights must be f32, f16, bf16 or f64{}", info->name, info->file,
             dtype_name(info->tensor.dtype), is_matrix ? " (matrices also a quantized type)" : "");
    return *info;
  }

  // An FP8 checkpoint's matrix (llm-compressor / compressed-tensors: F8_E4M3 weights with a
  // `weight_scale`, or DeepSeek's `weight_scale_inv` blocks) packed as F8_CHANNEL / F8_G128, its
  // e4m3 bytes kept (quant::pack_fp8_checkpoint_weight). Activation scales are not used:
  // splitflow's FP8 is weight-only.
  Tensor fp8_packed(const TensorInfo& info, bool transposed, const std::string& field, const std::string& pattern,
                    int layer) {
    SF_CHECK(!transposed, "tensor '{}' ({}) is f8_e4m3 and stored [in, out] (tensors.linear_transposed)", info.name,
             describe(field, pattern, layer));
    const TensorInfo* scale = find(pattern, layer, ".weight_scale");
    if (!scale) scale = find(pattern, layer, ".weight_scale_inv");
    SF_CHECK(scale != nullptr, "tensor '{}' ({}) is f8_e4m3 but the checkpoint has no '{}' or '{}' beside it",
             info.name, describe(field, pattern, layer), fmt::join(candidates(pattern, layer, ".weight_scale"), "|"),
             fmt::join(candidates(pattern, layer, ".weight_scale_inv"), "|"));
    find(pattern, layer, ".input_scale");  // present in W8A8 exports; weight-only FP8 does not use it
    Tensor out = quant::pack_fp8_checkpoint_weight(info.tensor, scale->tensor, info.name);
    quant::validate(out, info.name);
    return out;
  }

  // A checkpoint's quantized matrix as it is stored (a view of the file), its scales checked.
  const Tensor& packed(const TensorInfo& info, bool transposed, const std::string& field, const std::string& pattern,
                       int layer) const {
    SF_CHECK(!transposed,
             "tensor '{}' ({}) is {} and stored [in, out] (tensors.linear_transposed): a quantized matrix cannot be "
             "transposed and stay packed",
             info.name, describe(field, pattern, layer), dtype_name(info.tensor.dtype));
    quant::validate(info.tensor, info.name);
    return info.tensor;
  }

  std::string source_file() const {
    const auto& tensors = source_.tensors();
    return tensors.empty() ? std::string() : fmt::format(" '{}'", tensors.front().file);
  }

  void check_shape(const TensorInfo& info, const Shape& expected, const std::string& field, const std::string& pattern,
                   int layer, const char* note = "") const {
    if (info.tensor.shape == expected) return;
    fail("tensor '{}' ({}) has shape {}, expected {}{}", info.name, describe(field, pattern, layer),
         shape_str(info.tensor.shape), shape_str(expected), note);
  }

  // A matrix as [out, in] in matrix_dtype_, or quantized: packed as stored, or (`quantize` with
  // quantization_ set) quantized from its floats. Projections follow tensors.linear_transposed; the
  // stored tensor stays a view into the file when no conversion is needed.
  Tensor matrix(const std::string& field, const std::string& pattern, int layer, Shape canonical, bool projection,
                bool quantize) {
    const TensorInfo& info = require(field, pattern, layer, names_.weight_suffix, /*is_matrix=*/true);
    const Tensor& stored = info.tensor;
    const bool transposed = projection && names_.linear_transposed;
    if (transposed)
      check_shape(info, {canonical[1], canonical[0]}, field, pattern, layer,
                  " (stored [in, out]: tensors.linear_transposed is true)");
    else
      check_shape(info, canonical, field, pattern, layer);
    if (is_quantized(stored.dtype)) return packed(info, transposed, field, pattern, layer);
    if (stored.dtype == DType::F8E4M3) return fp8_packed(info, transposed, field, pattern, layer);
    const bool direct = !transposed && aligned(stored);
    if (quantize && quantization_) {
      const int64_t block = dtype_block_elems(*quantization_);
      SF_CHECK(canonical[1] % block == 0,
               "--quantization {}: tensor '{}' ({}) has rows of {} elements, not a whole number of {}-element blocks",
               dtype_name(*quantization_), info.name, describe(field, pattern, layer), canonical[1], block);
      if (direct && stored.dtype != DType::F64) return quantize_matrix(quantizer_, stored, *quantization_);
      Tensor floats = Tensor::zeros(matrix_dtype_, canonical);
      write_rows(stored, transposed, floats, 0);
      return quantize_matrix(quantizer_, floats, *quantization_);
    }
    if (direct && stored.dtype == matrix_dtype_) return stored;
    Tensor out = Tensor::zeros(matrix_dtype_, canonical);
    write_rows(stored, transposed, out, 0);
    return out;
  }

  // Rows of several stored matrices stacked into one [sum of out, in] matrix. When a part is
  // quantized (stored so, or quantized now), the parts' packed rows are concatenated as bytes:
  // one quantized dtype, or DType::Mixed with a run per part (plain parts in matrix_dtype_).
  Tensor stacked(const std::vector<std::pair<std::string, std::string>>& parts, int layer,
                 const std::vector<int64_t>& rows, int64_t cols) {
    int64_t total = 0;
    for (int64_t count : rows) total += count;
    std::vector<const TensorInfo*> infos;
    bool any_packed = quantization_.has_value();
    for (size_t i = 0; i < parts.size(); ++i) {
      const auto& [field, pattern] = parts[i];
      const TensorInfo& info = require(field, pattern, layer, names_.weight_suffix, /*is_matrix=*/true);
      if (names_.linear_transposed)
        check_shape(info, {cols, rows[i]}, field, pattern, layer, " (stored [in, out]: tensors.linear_transposed is true)");
      else
        check_shape(info, {rows[i], cols}, field, pattern, layer);
      any_packed = any_packed || is_quantized(info.tensor.dtype) || info.tensor.dtype == DType::F8E4M3;
      infos.push_back(&info);
    }
    if (!any_packed) {
      Tensor out = Tensor::zeros(matrix_dtype_, {total, cols});
      int64_t offset = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        write_rows(infos[i]->tensor, names_.linear_transposed, out, offset);
        offset += rows[i];
      }
      return out;
    }
    std::vector<Tensor> pieces;
    auto runs = std::make_shared<std::vector<RowRun>>();
    for (size_t i = 0; i < parts.size(); ++i) {
      const auto& [field, pattern] = parts[i];
      const DType stored = infos[i]->tensor.dtype;
      pieces.push_back(is_quantized(stored) ? packed(*infos[i], names_.linear_transposed, field, pattern, layer)
                       : stored == DType::F8E4M3
                           ? fp8_packed(*infos[i], names_.linear_transposed, field, pattern, layer)
                           : matrix(field, pattern, layer, {rows[i], cols}, /*projection=*/true, /*quantize=*/true));
      if (!runs->empty() && runs->back().dtype == pieces.back().dtype)
        runs->back().rows += rows[i];
      else
        runs->push_back({pieces.back().dtype, rows[i]});
    }
    Tensor out = runs->size() == 1 ? packed_zeros(runs->front().dtype, {total, cols})
                                   : packed_zeros(DType::Mixed, {total, cols}, std::move(runs));
    auto* at = static_cast<uint8_t*>(out.data);
    for (size_t i = 0; i < pieces.size(); ++i) {
      std::memcpy(at, pieces[i].data, pieces[i].nbytes());
      at += pieces[i].nbytes();
      if (pieces[i].data == infos[i]->tensor.data) release_pages(pieces[i]);  // a view of the checkpoint
    }
    return out;
  }

  // Norm weights and biases: f32 vectors, views when already f32.
  Tensor vector(const std::string& field, const std::string& pattern, int layer, int64_t size,
                const std::string* suffix = nullptr) {
    const TensorInfo& info = require(field, pattern, layer, suffix ? *suffix : names_.weight_suffix);
    check_shape(info, {size}, field, pattern, layer);
    const Tensor& stored = info.tensor;
    if (stored.dtype == DType::F32 && aligned(stored)) return stored;
    Tensor out = Tensor::zeros(DType::F32, {size});
    write_rows(stored, false, out, 0);
    return out;
  }
  Tensor bias(const std::string& field, const std::string& pattern, int layer, int64_t size) {
    return vector(field, pattern, layer, size, &names_.bias_suffix);
  }

  static bool aligned(const Tensor& tensor) {
    return is_quantized(tensor.dtype) || reinterpret_cast<uintptr_t>(tensor.data) % dtype_size(tensor.dtype) == 0;
  }

  void bind_lm_head(ModelWeights& weights) {
    const Shape shape = {spec_.vocab_size, spec_.hidden_size};
    if (spec_.tie_embeddings) {
      if (!names_.lm_head.empty()) find(names_.lm_head, -1, names_.weight_suffix);  // a stored copy is not "unused"
      weights.lm_head = weights.embed;
      return;
    }
    if (names_.lm_head_optional && !find(names_.lm_head, -1, names_.weight_suffix)) {
      spdlog::info("no lm_head tensor '{}' in the checkpoint: tied to the embedding",
                   fmt::join(candidates(names_.lm_head, -1, names_.weight_suffix), "' or '"));
      weights.lm_head = weights.embed;
      return;
    }
    weights.lm_head = matrix("lm_head", names_.lm_head, -1, shape, /*projection=*/false, /*quantize=*/true);
  }

  void bind_layer(int layer, LayerWeights& out) {
    const AttentionSpec& attention = spec_.attention;
    const MlpSpec& mlp = spec_.mlp;
    const int64_t hidden = spec_.hidden_size, inter = mlp.intermediate_size;
    const int64_t q_dim = int64_t{attention.num_heads} * attention.head_dim;
    const int64_t kv_dim = int64_t{attention.num_kv_heads} * attention.head_dim;

    out.attn_norm = vector("attn_norm", names_.attn_norm, layer, hidden);
    if (spec_.norm.bias) out.attn_norm_bias = bias("attn_norm", names_.attn_norm, layer, hidden);
    if (!spec_.shared_layer_norm) {
      out.ffn_norm = vector("ffn_norm", names_.ffn_norm, layer, hidden);
      if (spec_.norm.bias) out.ffn_norm_bias = bias("ffn_norm", names_.ffn_norm, layer, hidden);
    }
    if (attention.qk_norm) {
      out.q_norm = vector("q_norm", names_.q_norm, layer, attention.head_dim);
      out.k_norm = vector("k_norm", names_.k_norm, layer, attention.head_dim);
    }
    if (spec_.post_norms) {
      out.post_attn_norm = vector("post_attn_norm", names_.post_attn_norm, layer, hidden);
      out.post_ffn_norm = vector("post_ffn_norm", names_.post_ffn_norm, layer, hidden);
    }

    const bool any_qkv_bias = attention.q_bias || attention.k_bias || attention.v_bias;
    switch (attention.qkv_layout) {
      case QkvLayout::Separate: {
        out.wqkv = stacked({{"q", names_.q}, {"k", names_.k}, {"v", names_.v}}, layer, {q_dim, kv_dim, kv_dim}, hidden);
        if (any_qkv_bias) {
          // Absent parts stay zero (a model may bias q and v but not k).
          out.bqkv = Tensor::zeros(DType::F32, {q_dim + 2 * kv_dim});
          const std::tuple<bool, const char*, const std::string*, int64_t, int64_t> parts[] = {
              {attention.q_bias, "q", &names_.q, q_dim, 0},
              {attention.k_bias, "k", &names_.k, kv_dim, q_dim},
              {attention.v_bias, "v", &names_.v, kv_dim, q_dim + kv_dim}};
          for (const auto& [present, field, pattern, size, offset] : parts) {
            if (!present) continue;
            const TensorInfo& info = require(field, *pattern, layer, names_.bias_suffix);
            check_shape(info, {size}, field, *pattern, layer);
            write_rows(info.tensor, false, out.bqkv, offset);
          }
        }
        break;
      }
      case QkvLayout::Concat:
      case QkvLayout::PerHead: {
        const int64_t rows = q_dim + 2 * kv_dim;
        Tensor wqkv = matrix("qkv", names_.qkv, layer, {rows, hidden}, true, true);
        Tensor bqkv = any_qkv_bias ? bias("qkv", names_.qkv, layer, rows) : Tensor{};
        if (attention.qkv_layout == QkvLayout::PerHead) {
          wqkv = per_head_to_concat(wqkv, attention.num_heads, attention.head_dim);
          if (!bqkv.empty()) bqkv = per_head_to_concat(bqkv, attention.num_heads, attention.head_dim);
        }
        out.wqkv = std::move(wqkv);
        out.bqkv = std::move(bqkv);
        break;
      }
    }
    out.wo = matrix("o", names_.o, layer, {hidden, q_dim}, true, true);
    if (attention.o_bias) out.bo = bias("o", names_.o, layer, hidden);

    if (mlp.gated && mlp.gate_up_fused) {
      out.w_gate_up = matrix("gate_up", names_.gate_up, layer, {2 * inter, hidden}, true, true);
      if (mlp.up_bias) out.b_gate_up = bias("gate_up", names_.gate_up, layer, 2 * inter);
    } else if (mlp.gated) {
      out.w_gate_up = stacked({{"gate", names_.gate}, {"up", names_.up}}, layer, {inter, inter}, hidden);
      if (mlp.up_bias) {
        out.b_gate_up = Tensor::zeros(DType::F32, {2 * inter});
        write_rows(bias("gate", names_.gate, layer, inter), false, out.b_gate_up, 0);
        write_rows(bias("up", names_.up, layer, inter), false, out.b_gate_up, inter);
      }
    } else {
      out.w_gate_up = matrix("up", names_.up, layer, {inter, hidden}, true, true);
      if (mlp.up_bias) out.b_gate_up = bias("up", names_.up, layer, inter);
    }
    out.w_down = matrix("down", names_.down, layer, {hidden, inter}, true, true);
    if (mlp.down_bias) out.b_down = bias("down", names_.down, layer, hidden);
    if (spec_.network == NetworkType::EncoderDecoder) bind_cross_attention(layer, out);
  }

  // A decoder layer's cross-attention: its key and value projections stacked (k rows, then v rows).
  void bind_cross_attention(int layer, LayerWeights& out) {
    const AttentionSpec& attention = spec_.attention;
    const int64_t hidden = spec_.hidden_size;
    const int64_t q_dim = int64_t{attention.num_heads} * attention.head_dim;
    const int64_t kv_dim = int64_t{attention.num_kv_heads} * attention.head_dim;
    out.cross_attn_norm = vector("cross_attn_norm", names_.cross_attn_norm, layer, hidden);
    if (spec_.norm.bias) out.cross_attn_norm_bias = bias("cross_attn_norm", names_.cross_attn_norm, layer, hidden);
    out.w_cross_q = matrix("cross_q", names_.cross_q, layer, {q_dim, hidden}, true, true);
    if (attention.q_bias) out.b_cross_q = bias("cross_q", names_.cross_q, layer, q_dim);
    out.w_cross_kv = stacked({{"cross_k", names_.cross_k}, {"cross_v", names_.cross_v}}, layer, {kv_dim, kv_dim}, hidden);
    if (attention.k_bias || attention.v_bias) {
      out.b_cross_kv = Tensor::zeros(DType::F32, {2 * kv_dim});
      if (attention.k_bias) write_rows(bias("cross_k", names_.cross_k, layer, kv_dim), false, out.b_cross_kv, 0);
      if (attention.v_bias) write_rows(bias("cross_v", names_.cross_v, layer, kv_dim), false, out.b_cross_kv, kv_dim);
    }
    out.w_cross_o = matrix("cross_o", names_.cross_o, layer, {hidden, q_dim}, true, true);
    if (attention.o_bias) out.b_cross_o = bias("cross_o", names_.cross_o, layer, hidden);
  }

  // Float tensors of rank 1-2 nobody asked for are probably weights the spec forgot (or a
  // template that does not fit the checkpoint). Buffers (RoPE inv_freq, GPT-2's rank-4 masks)
  // are not weights.
  // tensors.unused_prefixes, after any of name_prefixes.
  bool unused_on_purpose(const std::string& name) const {
    for (const std::string& prefix : names_.name_prefixes)
      for (const std::string& unused : names_.unused_prefixes)
        if (name.starts_with(prefix + unused)) return true;
    return false;
  }

  void warn_unused() const {
    std::vector<std::string> unused;
    for (const TensorInfo& info : source_.tensors()) {
      if (used_.count(info.name) || !(is_float(info.tensor.dtype) || is_quantized(info.tensor.dtype))) continue;
      if (info.tensor.shape.empty() || info.tensor.shape.size() > 2) continue;
      if (info.name.size() >= 8 && info.name.compare(info.name.size() - 8, 8, "inv_freq") == 0) continue;
      if (info.name == kGgufRopeFreqs && spec_.rope.scaling.type == RopeScalingType::FreqFactors) continue;  // in the spec
      if (unused_on_purpose(info.name)) continue;
      unused.push_back(info.name);
    }
    if (unused.empty()) return;
    const size_t shown = std::min<size_t>(unused.size(), 8);
    spdlog::warn("{} checkpoint tensor(s) are not used by the model spec '{}': {}{}", unused.size(), spec_.name,
                 fmt::join(unused.begin(), unused.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
                 unused.size() > shown ? ", ..." : "");
  }

  const ModelSpec& spec_;
  const TensorNames& names_;
  const WeightSource& source_;
  DType matrix_dtype_;
  std::optional<DType> quantization_;  // --quantization: plain projection matrices quantized to it
  const MatrixQuantizer& quantizer_;   // empty: quant::quantize
  std::unordered_map<std::string, const TensorInfo*> by_name_;
  std::unordered_set<std::string> used_;
};

class DummyFiller {
 public:
  DummyFiller(DType matrix_dtype, uint64_t seed) : matrix_dtype_(matrix_dtype), seed_(seed) {}

  // Tensor t's element i is a pure function of (seed, t, i): any thread order, and the GPU, give
  // the same weights.
  Tensor normal(Shape shape, float stddev, DType dtype) {
    return Tensor::generated_normal(dtype, std::move(shape), {mix64(seed_ ^ mix64(++tensor_counter_)), stddev});
  }
  Tensor matrix(int64_t rows, int64_t cols) { return normal({rows, cols}, 0.02f, matrix_dtype_); }
  Tensor bias(int64_t size) { return normal({size}, 0.02f, DType::F32); }
  static Tensor ones(int64_t size) {
    Tensor out = Tensor::zeros(DType::F32, {size});
    std::fill_n(out.as<float>(), size, 1.0f);
    return out;
  }

 private:
  DType matrix_dtype_;
  uint64_t seed_;
  uint64_t tensor_counter_ = 0;
};

}  // namespace

ModelWeights bind_weights(const ModelSpec& spec, const WeightSource& source, DType matrix_dtype,
                          std::optional<DType> quantization, const MatrixQuantizer& quantizer) {
  check_matrix_dtype(matrix_dtype);
  check_quantization(quantization);
  validate_spec(spec);
  return Binder(spec, source, matrix_dtype, quantization, quantizer).bind();
}

ModelWeights make_dummy_weights(const ModelSpec& spec, DType matrix_dtype, uint64_t seed,
                                std::optional<DType> quantization, const MatrixQuantizer& quantizer) {
  check_matrix_dtype(matrix_dtype);
  check_quantization(quantization);
  validate_spec(spec);
  DummyFiller fill(matrix_dtype, seed);
  const AttentionSpec& attention = spec.attention;
  const int64_t hidden = spec.hidden_size, inter = spec.mlp.intermediate_size;
  const int64_t q_dim = int64_t{attention.num_heads} * attention.head_dim;
  const int64_t kv_dim = int64_t{attention.num_kv_heads} * attention.head_dim;
  const bool norm_bias = spec.norm.bias;

  ModelWeights weights;
  weights.embed = fill.matrix(spec.vocab_size, hidden);
  if (spec.position == PositionType::Learned) weights.pos_embed = fill.matrix(spec.max_position, hidden);
  if (spec.embedding_norm) {
    weights.embed_norm = DummyFiller::ones(hidden);
    if (norm_bias) weights.embed_norm_bias = Tensor::zeros(DType::F32, {hidden});
  }
  if (!spec.tensors.final_norm.empty()) {
    weights.final_norm = DummyFiller::ones(hidden);
    if (norm_bias) weights.final_norm_bias = Tensor::zeros(DType::F32, {hidden});
  }
  const bool encoder = spec.network == NetworkType::EncoderOnly;
  if (!encoder) weights.lm_head = spec.tie_embeddings ? weights.embed : fill.matrix(spec.vocab_size, hidden);
  weights.layers.resize(static_cast<size_t>(spec.num_layers));
  for (LayerWeights& layer : weights.layers) {
    layer.attn_norm = DummyFiller::ones(hidden);
    if (norm_bias) layer.attn_norm_bias = Tensor::zeros(DType::F32, {hidden});
    if (!spec.shared_layer_norm) {
      layer.ffn_norm = DummyFiller::ones(hidden);
      if (norm_bias) layer.ffn_norm_bias = Tensor::zeros(DType::F32, {hidden});
    }
    if (attention.qk_norm) {
      layer.q_norm = DummyFiller::ones(attention.head_dim);
      layer.k_norm = DummyFiller::ones(attention.head_dim);
    }
    if (spec.post_norms) {
      layer.post_attn_norm = DummyFiller::ones(hidden);
      layer.post_ffn_norm = DummyFiller::ones(hidden);
    }
    layer.wqkv = fill.matrix(q_dim + 2 * kv_dim, hidden);
    if (attention.q_bias || attention.k_bias || attention.v_bias) layer.bqkv = fill.bias(q_dim + 2 * kv_dim);
    layer.wo = fill.matrix(hidden, q_dim);
    if (attention.o_bias) layer.bo = fill.bias(hidden);
    const int64_t gate_up_rows = spec.mlp.gated ? 2 * inter : inter;
    layer.w_gate_up = fill.matrix(gate_up_rows, hidden);
    if (spec.mlp.up_bias) layer.b_gate_up = fill.bias(gate_up_rows);
    layer.w_down = fill.matrix(hidden, inter);
    if (spec.mlp.down_bias) layer.b_down = fill.bias(hidden);
    if (spec.network == NetworkType::EncoderDecoder) {
      layer.cross_attn_norm = DummyFiller::ones(hidden);
      if (norm_bias) layer.cross_attn_norm_bias = Tensor::zeros(DType::F32, {hidden});
      layer.w_cross_q = fill.matrix(q_dim, hidden);
      if (attention.q_bias) layer.b_cross_q = fill.bias(q_dim);
      layer.w_cross_kv = fill.matrix(2 * kv_dim, hidden);
      if (attention.k_bias || attention.v_bias) layer.b_cross_kv = fill.bias(2 * kv_dim);
      layer.w_cross_o = fill.matrix(hidden, q_dim);
      if (attention.o_bias) layer.b_cross_o = fill.bias(hidden);
    }
  }
  if (!spec.tensors.logits_bias.empty())
    weights.logits_bias = materialize(fill.normal({spec.vocab_size}, 0.02f, DType::F32));
  if (spec.position == PositionType::Relative)
    weights.relative_bias = materialize(fill.normal({spec.relative_attention.num_buckets, attention.num_heads}, 0.02f,
                                                    DType::F32));
  if (spec.network == NetworkType::EncoderDecoder)
    weights.encoder = std::make_shared<ModelWeights>(
        make_dummy_weights(spec.encoder_spec(), matrix_dtype, mix64(seed ^ 0x656e636f646572ull), quantization,
                           quantizer));
  if (quantization) {  // the projections (and an untied lm_head), from their generated values
    const auto quantized = [&](const Tensor& matrix, const char* what) {
      const int64_t block = dtype_block_elems(*quantization);
      SF_CHECK(matrix.dim(1) % block == 0,
               "--quantization {}: {} {} has rows of {} elements, not a whole number of {}-element blocks",
               dtype_name(*quantization), what, shape_str(matrix.shape), matrix.dim(1), block);
      return quantize_matrix(quantizer, matrix, *quantization);
    };
    for (LayerWeights& layer : weights.layers) {
      layer.wqkv = quantized(layer.wqkv, "wqkv");
      layer.wo = quantized(layer.wo, "wo");
      layer.w_gate_up = quantized(layer.w_gate_up, "w_gate_up");
      layer.w_down = quantized(layer.w_down, "w_down");
    }
    if (!spec.tie_embeddings && !encoder) weights.lm_head = quantized(weights.lm_head, "lm_head");
  }
  return weights;
}

std::string quantized_type_names() {
  std::vector<DType> types;
  for (const quant::TypeInfo& info : quant::all_types()) types.push_back(info.type);
  return dtype_names(types);
}

}  // namespace splitflow
