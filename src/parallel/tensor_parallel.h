// parallel/tensor_parallel.h — tensor parallelism as a transformation of a model (gpt-fast and
// Megatron style): which heads and MLP columns a rank owns, its shard of every weight, its spec
// (the shard's head and intermediate counts), and the layer plan with the sums over ranks added.
// Pure host logic over model/ and runtime/'s plan types: it never touches a device, runs nothing
// and never chooses a collective (the backend's allreduce does).
//
// Split, for T ranks (rank r):
//   q heads         [r H/T, (r+1) H/T)                      wqkv q rows, bqkv, wo columns
//   kv heads        [r KV/T, (r+1) KV/T) when KV >= T;       wqkv k and v rows
//                   else the one head of r's query group (replicated: T/KV ranks hold each)
//   MLP columns     [r I/T, (r+1) I/T)                       w_gate_up gate and up rows, w_down columns
//   vocabulary      [r V/T, (r+1) V/T) when T divides V      lm_head rows (each rank's logits columns,
//                                                            gathered by the backend's gather_columns);
//                                                            embed rows plus a zero row (copied), the
//                                                            ranks' lookups summed (runtime VocabShard)
//   everything else (norms, q/k norms, position embeddings; lm_head and embed when V % T != 0; a
//   generated (dummy) or Mixed embed)                        replicated (views, no copy)
// Row-parallel biases (bo, b_down) stay on rank 0 (zeros elsewhere) so the sum adds them once.
// Shards are views of the source where they are one contiguous range of rows; otherwise only
// the shard's bytes are copied (a packed type stays packed: quant/row_slice.h). Generated (dummy)
// weights are regenerated per shard with a key of their own: the same distribution, not slices
// of the one-rank model.
//
// Plan: each output projection that adds into the residual stream (o, down) writes its partial
// product into `proj` instead, and an Allreduce step adds the sum over ranks to `hidden` before
// anything reads `hidden` again (a parallel residual's two projections share one sum); a post-norm
// projection (Gemma's) is summed in place before its norm.
#pragma once

#include "model/spec.h"
#include "model/weights.h"
#include "runtime/layer_plan.h"

#include <cstdint>

namespace splitflow {

struct TensorParallelShard {
  int rank = 0, size = 1;
  int head_begin = 0, num_heads = 0;        // query heads
  int kv_head_begin = 0, num_kv_heads = 0;  // key/value heads (replicated when the model has fewer than size)
  int64_t mlp_begin = 0, mlp_columns = 0;   // intermediate columns
  int64_t vocab_begin = 0, vocab_rows = 0;  // LM head rows (0 rows: the head is replicated)
};

// The shard of `rank` among `size`. Throws splitflow::Error naming the count that does not divide:
// num_heads % size, num_kv_heads vs size (one must divide the other), intermediate_size % size
// (and, for packed matrices, the block size of the columns a row-parallel shard cuts).
TensorParallelShard plan_tensor_parallel_shard(const ModelSpec& spec, int rank, int size);

// Whether shard_weights splits this embedding table with the vocabulary (not a generated or Mixed
// one: those stay replicated).
bool splits_embedding(const Tensor& embed);

// The spec a rank runs: its head and kv-head counts, its intermediate size, head_dim explicit.
ModelSpec shard_spec(const ModelSpec& spec, const TensorParallelShard& shard);

// The rank's weights (see the split above).
ModelWeights shard_weights(const ModelSpec& spec, const ModelWeights& weights, const TensorParallelShard& shard);

// The plan with the sums over ranks (see above).
LayerPlan tensor_parallel_plan(const LayerPlan& plan);

struct ShardedModel {
  TensorParallelShard shard;
  ModelSpec spec;
  ModelWeights weights;
  LayerPlan plan;
};

// All of the above for one rank; size 1 returns the model as it is (and build_layer_plan's plan).
ShardedModel shard_model(const ModelSpec& spec, const ModelWeights& weights, int rank, int size);

}  // namespace splitflow
