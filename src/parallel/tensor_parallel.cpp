#include "parallel/tensor_parallel.h"

#include "core/error.h"
#include "quant/row_slice.h"

#include <cstring>
#include <string>
#include <vector>

namespace splitflow {

namespace {

struct RowRange {
  int64_t begin = 0, count = 0;
};

// A key of its own for each regenerated shard (dummy weights): the shard's rank and which cut.
uint64_t shard_key(uint64_t key, const TensorParallelShard& shard, uint64_t part) {
  uint64_t x = key ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(shard.rank + 1)) ^
               (0xBF58476D1CE4E5B9ull * static_cast<uint64_t>(shard.size)) ^ (0x94D049BB133111EBull * (part + 1));
  x ^= x >> 31;
  return x * 0xD6E8FEB86659FD93ull;
}

int64_t cols_of(const Tensor& t) { return t.shape.size() == 1 ? 1 : t.shape[1]; }

size_t row_bytes(DType dtype, int64_t cols) {
  return is_quantized(dtype) ? dtype_row_bytes(dtype, cols) : dtype_size(dtype) * static_cast<size_t>(cols);
}

// Each row's dtype and byte offset (a Mixed matrix's rows differ in size).
struct RowLayout {
  std::vector<DType> dtype;
  std::vector<size_t> offset;
};

RowLayout row_layout(const Tensor& t) {
  const int64_t rows = t.shape[0], cols = cols_of(t);
  RowLayout layout;
  layout.dtype.reserve(rows);
  layout.offset.reserve(rows);
  size_t at = 0;
  auto add = [&](DType dtype, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      layout.dtype.push_back(dtype);
      layout.offset.push_back(at);
      at += row_bytes(dtype, cols);
    }
  };
  if (t.dtype == DType::Mixed) {
    for (const RowRun& run : *t.row_runs) add(run.dtype, run.rows);
  } else {
    add(t.dtype, rows);
  }
  return layout;
}

// Appends a row of `dtype` to runs (merged with the last run of the same dtype).
void push_run(std::vector<RowRun>& runs, DType dtype) {
  if (!runs.empty() && runs.back().dtype == dtype) {
    ++runs.back().rows;
  } else {
    runs.push_back({dtype, 1});
  }
}

Tensor finish_mixed(Tensor out, std::vector<RowRun> runs) {
  if (runs.size() == 1) {
    out.dtype = runs[0].dtype;
  } else {
    out.dtype = DType::Mixed;
    out.row_runs = std::make_shared<const std::vector<RowRun>>(std::move(runs));
  }
  return out;
}

// Rows [begin, begin + count) of t and then a row of zeros (a packed type's zero bytes are a zero
// scale: zeros too), copied.
Tensor rows_and_a_zero_row(const Tensor& t, int64_t begin, int64_t count) {
  const RowLayout layout = row_layout(t);
  const size_t bytes_per_row = row_bytes(t.dtype, cols_of(t));
  Tensor out = Tensor::zeros(DType::U8, {static_cast<int64_t>((count + 1) * bytes_per_row)});
  std::memcpy(out.data, static_cast<const char*>(t.data) + layout.offset[begin], count * bytes_per_row);
  out.dtype = t.dtype;
  out.shape = t.shape;
  out.shape[0] = count + 1;
  return out;
}

// Rows `ranges` of t (dim 0), in order, as one tensor.
Tensor take_rows(const Tensor& t, const std::vector<RowRange>& ranges, const TensorParallelShard& shard, uint64_t part) {
  if (t.empty()) return t;
  int64_t total = 0;
  for (const RowRange& r : ranges) {
    SF_CHECK(r.begin >= 0 && r.begin + r.count <= t.shape[0], "tensor parallelism: rows [{}, {}) of a {} tensor",
             r.begin, r.begin + r.count, shape_str(t.shape));
    total += r.count;
  }
  Shape shape = t.shape;
  shape[0] = total;
  if (t.generated) return Tensor::generated_normal(t.dtype, shape, {shard_key(t.generated->key, shard, part), t.generated->stddev});
  const RowLayout layout = row_layout(t);
  const int64_t cols = cols_of(t);
  const char* base = static_cast<const char*>(t.data);
  if (ranges.size() == 1 && t.dtype != DType::Mixed)  // one contiguous range: a view of the source
    return Tensor::view(t.dtype, shape, base + layout.offset[ranges[0].begin], t.storage);
  std::vector<RowRun> runs;
  size_t bytes = 0;
  for (const RowRange& r : ranges)
    for (int64_t i = r.begin; i < r.begin + r.count; ++i) bytes += row_bytes(layout.dtype[i], cols);
  Tensor out = Tensor::zeros(DType::U8, {static_cast<int64_t>(bytes)});
  char* at = static_cast<char*>(out.data);
  for (const RowRange& r : ranges)
    for (int64_t i = r.begin; i < r.begin + r.count; ++i) {
      const size_t n = row_bytes(layout.dtype[i], cols);
      std::memcpy(at, base + layout.offset[i], n);
      at += n;
      push_run(runs, layout.dtype[i]);
    }
  out.shape = shape;
  return finish_mixed(std::move(out), std::move(runs));
}

// Columns [begin, begin + count) of every row of the matrix t, packed types kept packed.
Tensor take_columns(const Tensor& t, int64_t begin, int64_t count, const TensorParallelShard& shard, uint64_t part,
                    const std::string& name) {
  if (t.empty()) return t;
  SF_CHECK(t.shape.size() == 2, "tensor parallelism: {} is {}, not a matrix", name, shape_str(t.shape));
  const int64_t rows = t.shape[0], cols = t.shape[1];
  if (t.generated) return Tensor::generated_normal(t.dtype, {rows, count}, {shard_key(t.generated->key, shard, part), t.generated->stddev});
  const RowLayout layout = row_layout(t);
  std::vector<RowRun> runs;
  size_t bytes = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const DType dtype = layout.dtype[i];
    if (is_quantized(dtype)) {
      const int64_t block = dtype_block_elems(dtype);
      SF_CHECK(begin % block == 0 && count % block == 0,
               "tensor parallelism: {} is {} ({}-element blocks) but a rank's shard is columns [{}, {}) of {}: use a "
               "tensor-parallel size that cuts whole blocks", name, dtype_name(dtype), block, begin, begin + count, cols);
    }
    bytes += row_bytes(dtype, count);
  }
  Tensor out = Tensor::zeros(DType::U8, {static_cast<int64_t>(bytes)});
  uint8_t* at = static_cast<uint8_t*>(out.data);
  const uint8_t* base = static_cast<const uint8_t*>(t.data);
  for (int64_t i = 0; i < rows; ++i) {
    const DType dtype = layout.dtype[i];
    const size_t in_bytes = row_bytes(dtype, cols), out_bytes = row_bytes(dtype, count);
    quant::slice_row_columns(dtype, cols, {base + layout.offset[i], in_bytes}, begin, count, {at, out_bytes});
    at += out_bytes;
    push_run(runs, dtype);
  }
  out.shape = {rows, count};
  return finish_mixed(std::move(out), std::move(runs));
}

// Rank 0 keeps a row-parallel bias, the others add zeros: the sum over ranks adds it once.
Tensor rank0_bias(const Tensor& bias, const TensorParallelShard& shard) {
  if (bias.empty() || shard.rank == 0) return bias;
  return Tensor::zeros(bias.dtype, bias.shape);
}

bool touches(const PlanStep& step, Slot slot) {
  return step.input == slot || step.output == slot || step.normed == slot || step.product == slot;
}

}  // namespace

TensorParallelShard plan_tensor_parallel_shard(const ModelSpec& spec, int rank, int size) {
  SF_CHECK(size >= 1, "tensor parallelism: size must be >= 1, got {}", size);
  SF_CHECK(rank >= 0 && rank < size, "tensor parallelism: rank {} outside a group of {}", rank, size);
  const int heads = spec.attention.num_heads, kv_heads = spec.attention.num_kv_heads;
  const int64_t inter = spec.mlp.intermediate_size;
  SF_CHECK(heads % size == 0, "tensor parallelism: attention.num_heads {} does not divide among {} ranks", heads, size);
  SF_CHECK(kv_heads % size == 0 || size % kv_heads == 0,
           "tensor parallelism: attention.num_kv_heads {} and {} ranks: one must divide the other", kv_heads, size);
  SF_CHECK(inter % size == 0, "tensor parallelism: mlp.intermediate_size {} does not divide among {} ranks", inter,
           size);
  TensorParallelShard shard;
  shard.rank = rank;
  shard.size = size;
  shard.num_heads = heads / size;
  shard.head_begin = rank * shard.num_heads;
  if (kv_heads >= size) {
    shard.num_kv_heads = kv_heads / size;
    shard.kv_head_begin = rank * shard.num_kv_heads;
  } else {  // the kv head of this rank's query heads, replicated on size / kv_heads ranks
    shard.num_kv_heads = 1;
    shard.kv_head_begin = shard.head_begin / (heads / kv_heads);
  }
  shard.mlp_columns = inter / size;
  shard.mlp_begin = rank * shard.mlp_columns;
  // The head's vocabulary rows split evenly, or not at all (a ragged split would need padded rows,
  // in every packed type); encoders have no head.
  if (size > 1 && spec.network != NetworkType::EncoderOnly && spec.vocab_size % size == 0) {
    shard.vocab_rows = spec.vocab_size / size;
    shard.vocab_begin = rank * shard.vocab_rows;
  }
  return shard;
}

bool splits_embedding(const Tensor& embed) {
  return !embed.empty() && !embed.generated && embed.dtype != DType::Mixed && embed.shape.size() == 2;
}

ModelSpec shard_spec(const ModelSpec& spec, const TensorParallelShard& shard) {
  ModelSpec out = spec;
  out.attention.num_heads = shard.num_heads;
  out.attention.num_kv_heads = shard.num_kv_heads;
  out.attention.head_dim = spec.attention.head_dim;
  out.mlp.intermediate_size = static_cast<int>(shard.mlp_columns);
  return out;
}

ModelWeights shard_weights(const ModelSpec& spec, const ModelWeights& weights, const TensorParallelShard& shard) {
  const int64_t head_dim = spec.attention.head_dim;
  const int64_t q_dim = int64_t{spec.attention.num_heads} * head_dim;
  const int64_t kv_dim = int64_t{spec.attention.num_kv_heads} * head_dim;
  const int64_t inter = spec.mlp.intermediate_size;
  const std::vector<RowRange> qkv_rows = {
      {shard.head_begin * head_dim, shard.num_heads * head_dim},
      {q_dim + shard.kv_head_begin * head_dim, shard.num_kv_heads * head_dim},
      {q_dim + kv_dim + shard.kv_head_begin * head_dim, shard.num_kv_heads * head_dim},
  };
  std::vector<RowRange> up_rows = {{shard.mlp_begin, shard.mlp_columns}};
  if (spec.mlp.gated) up_rows.push_back({inter + shard.mlp_begin, shard.mlp_columns});

  ModelWeights out = weights;  // embeddings, norms, q/k norms and post norms replicated
  if (shard.vocab_rows > 0 && !weights.lm_head.empty())
    out.lm_head = take_rows(weights.lm_head, {{shard.vocab_begin, shard.vocab_rows}}, shard, uint64_t{1} << 40);
  if (shard.vocab_rows > 0 && splits_embedding(weights.embed))
    out.embed = rows_and_a_zero_row(weights.embed, shard.vocab_begin, shard.vocab_rows);
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const LayerWeights& in = weights.layers[l];
    LayerWeights& w = out.layers[l];
    const std::string layer = "layer " + std::to_string(l);
    const uint64_t part = l * 8;
    w.wqkv = take_rows(in.wqkv, qkv_rows, shard, part + 0);
    w.bqkv = take_rows(in.bqkv, qkv_rows, shard, part + 1);
    w.wo = take_columns(in.wo, shard.head_begin * head_dim, shard.num_heads * head_dim, shard, part + 2, layer + " wo");
    w.bo = rank0_bias(in.bo, shard);
    w.w_gate_up = take_rows(in.w_gate_up, up_rows, shard, part + 3);
    w.b_gate_up = take_rows(in.b_gate_up, up_rows, shard, part + 4);
    w.w_down = take_columns(in.w_down, shard.mlp_begin, shard.mlp_columns, shard, part + 5, layer + " w_down");
    w.b_down = rank0_bias(in.b_down, shard);
  }
  return out;
}

LayerPlan tensor_parallel_plan(const LayerPlan& plan) {
  LayerPlan out;
  bool pending = false;  // proj holds partial products not yet summed into hidden
  const auto flush = [&] {
    if (!pending) return;
    out.steps.push_back({StepKind::Allreduce, Slot::Proj, Slot::Hidden});
    pending = false;
  };
  for (PlanStep step : plan.steps) {
    const bool row_parallel = step.kind == StepKind::Linear &&
                              (step.weight == LayerWeight::Output || step.weight == LayerWeight::Down);
    SF_CHECK(step.kind != StepKind::Allreduce, "tensor parallelism: the plan is already tensor-parallel");
    if (row_parallel && step.output == Slot::Hidden && step.accumulate) {
      // hidden += x W^T becomes proj (+)= x W_shard^T, summed into hidden before hidden is next read.
      step.output = Slot::Proj;
      step.accumulate = pending;
      out.steps.push_back(step);
      pending = true;
      continue;
    }
    if (touches(step, Slot::Hidden) || touches(step, Slot::Proj)) flush();
    out.steps.push_back(step);
    if (row_parallel) {
      SF_CHECK(step.output == Slot::Proj && !step.accumulate,
               "tensor parallelism: a row-parallel projection writing {} is not supported", slot_name(step.output));
      out.steps.push_back({StepKind::Allreduce, Slot::Proj, Slot::Proj});  // summed before its post-norm
    }
  }
  flush();
  return out;
}

ShardedModel shard_model(const ModelSpec& spec, const ModelWeights& weights, int rank, int size) {
  ShardedModel model;
  model.shard = plan_tensor_parallel_shard(spec, rank, size);
  if (size == 1) {
    model.spec = spec;
    model.weights = weights;
    model.plan = build_layer_plan(spec);
    return model;
  }
  model.spec = shard_spec(spec, model.shard);
  model.weights = shard_weights(spec, weights, model.shard);
  model.plan = tensor_parallel_plan(build_layer_plan(spec));
  return model;
}

}  // namespace splitflow
