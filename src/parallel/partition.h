// parallel/partition.h — a job's ranks as a grid of pipeline stages x tensor-parallel ranks
// (Inferflow's hybrid partition, reference 002 §4: each device owns a range of layers and a range
// of heads; pure tensor and pure pipeline parallelism are its two corners), and the model one rank
// runs: its stage's layers (parallel/partition.cpp), then its tensor-parallel shard of those
// (parallel/tensor_parallel.h), and the links its runner uses (runtime/model_runner.h's
// PipelineLinks). Pure host logic: never a device, never a collective.
//
// Ranks: rank = stage * tensor_parallel + tp_rank (a stage's ranks adjacent, as GPUs of one NVLink
// domain should be). Rank 0 (stage 0, tp rank 0) leads: the scheduler runs there, and the last
// stage's tp rank 0 sends it the logits / tokens / states of each forward.
#pragma once

#include "model/spec.h"
#include "model/weights.h"
#include "parallel/tensor_parallel.h"
#include "runtime/model_runner.h"

#include <string>
#include <utility>
#include <vector>

namespace splitflow {

struct ParallelLayout {
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  // Layers of each stage, in order (their sum is the model's layer count); empty: balanced.
  std::vector<int> stage_layers;

  int world_size() const { return tensor_parallel * pipeline_parallel; }
  int stage_of(int rank) const { return rank / tensor_parallel; }
  int tp_rank_of(int rank) const { return rank % tensor_parallel; }
  int rank_of(int stage, int tp_rank) const { return stage * tensor_parallel + tp_rank; }
};

// "12,20" -> {12, 20}. Throws naming the flag on anything but positive integers.
std::vector<int> parse_stage_layers(const std::string& text);

// [first layer, layer count) of each stage: layout.stage_layers, or the layers split as evenly as
// possible (the first num_layers % stages stages one more). Throws naming the counts when a stage
// would be empty or the given counts do not add up to num_layers.
std::vector<std::pair<int, int>> stage_layer_ranges(int num_layers, const ParallelLayout& layout);

// The spec of layers [first, first + count) as a model of its own: num_layers = count and the
// per-layer attention kinds (attention.layer_types, full_attention_interval) written out for
// those layers, so layer-indexed lookups stay right.
ModelSpec stage_spec(const ModelSpec& spec, int first, int count);

struct PartitionedModel {
  int stage = 0, tp_rank = 0;
  int first_layer = 0, num_layers = 0;  // the stage's layers in the whole model
  TensorParallelShard shard;
  ModelSpec spec;          // the rank's: its stage's layers, its shard's heads and columns
  ModelWeights weights;    // the same
  RunnerPartition runner;  // its layer plan and pipeline links
};

// Rank `rank`'s model. Throws as plan_tensor_parallel_shard / stage_layer_ranges do, and when the
// layout's world does not hold the rank.
PartitionedModel partition_model(const ModelSpec& spec, const ModelWeights& weights, const ParallelLayout& layout,
                                 int rank);

}  // namespace splitflow
