#include "parallel/partition.h"

#include "core/error.h"

#include <sstream>

namespace splitflow {

std::vector<int> parse_stage_layers(const std::string& text) {
  std::vector<int> counts;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    size_t used = 0;
    int count = 0;
    try {
      count = std::stoi(item, &used);
    } catch (const std::logic_error&) {
      used = 0;
    }
    SF_CHECK(used == item.size() && !item.empty() && count > 0,
             "--pipeline-layers: '{}' is not a positive layer count (give one per stage: 12,20)", item);
    counts.push_back(count);
  }
  SF_CHECK(!counts.empty(), "--pipeline-layers: no layer counts in '{}'", text);
  return counts;
}

std::vector<std::pair<int, int>> stage_layer_ranges(int num_layers, const ParallelLayout& layout) {
  const int stages = layout.pipeline_parallel;
  SF_CHECK(stages >= 1, "pipeline parallelism: {} stages", stages);
  std::vector<int> counts = layout.stage_layers;
  if (counts.empty()) {
    SF_CHECK(num_layers >= stages, "pipeline parallelism: {} layers cannot fill {} stages", num_layers, stages);
    for (int s = 0; s < stages; ++s) counts.push_back(num_layers / stages + (s < num_layers % stages ? 1 : 0));
  }
  SF_CHECK(static_cast<int>(counts.size()) == stages, "pipeline parallelism: {} layer counts for {} stages",
           counts.size(), stages);
  std::vector<std::pair<int, int>> ranges;
  int first = 0;
  for (const int count : counts) {
    SF_CHECK(count > 0, "pipeline parallelism: a stage of {} layers", count);
    ranges.emplace_back(first, count);
    first += count;
  }
  SF_CHECK(first == num_layers, "pipeline parallelism: the stages' layer counts add up to {}, the model has {}", first,
           num_layers);
  return ranges;
}

ModelSpec stage_spec(const ModelSpec& spec, int first, int count) {
  SF_CHECK(first >= 0 && count > 0 && first + count <= spec.num_layers, "pipeline stage: layers [{}, {}) of {}", first,
           first + count, spec.num_layers);
  ModelSpec out = spec;
  out.num_layers = count;
  if (spec.attention.sliding_window > 0) {
    out.attention.layer_types.clear();
    for (int l = first; l < first + count; ++l) out.attention.layer_types.push_back(spec.layer_attention(l));
    out.attention.full_attention_interval = 0;
  }
  return out;
}

PartitionedModel partition_model(const ModelSpec& spec, const ModelWeights& weights, const ParallelLayout& layout,
                                 int rank) {
  SF_CHECK(layout.tensor_parallel >= 1 && layout.pipeline_parallel >= 1,
           "parallel layout: tensor {} x pipeline {} ranks", layout.tensor_parallel, layout.pipeline_parallel);
  SF_CHECK(rank >= 0 && rank < layout.world_size(), "parallel layout: rank {} outside a job of {}", rank,
           layout.world_size());
  SF_CHECK(spec.network != NetworkType::EncoderDecoder || layout.world_size() == 1,
           "parallel layout: encoder_decoder models run on one rank (no tensor or pipeline parallelism yet), not "
           "tensor {} x pipeline {}", layout.tensor_parallel, layout.pipeline_parallel);
  SF_CHECK(layout.pipeline_parallel == 1 || spec.network == NetworkType::DecoderOnly ||
               spec.network == NetworkType::EncoderOnly,
           "pipeline parallelism: only decoder-only and encoder-only networks");
  PartitionedModel model;
  model.stage = layout.stage_of(rank);
  model.tp_rank = layout.tp_rank_of(rank);
  const std::pair<int, int> range = stage_layer_ranges(spec.num_layers, layout)[static_cast<size_t>(model.stage)];
  model.first_layer = range.first;
  model.num_layers = range.second;

  ModelSpec stage = stage_spec(spec, range.first, range.second);
  // The embeddings go to the first stage, the final norm and the head to the last.
  const bool first = model.stage == 0, last = model.stage == layout.pipeline_parallel - 1;
  ModelWeights stage_weights;
  if (first) {
    stage_weights.embed = weights.embed;
    stage_weights.pos_embed = weights.pos_embed;
    stage_weights.embed_norm = weights.embed_norm;
    stage_weights.embed_norm_bias = weights.embed_norm_bias;
  }
  if (last) {
    stage_weights.final_norm = weights.final_norm;
    stage_weights.final_norm_bias = weights.final_norm_bias;
    stage_weights.lm_head = weights.lm_head;
    if (!first && stage_weights.lm_head.empty()) stage_weights.lm_head = weights.embed;
  }
  stage_weights.layers.assign(weights.layers.begin() + range.first,
                              weights.layers.begin() + range.first + range.second);
  ShardedModel sharded = shard_model(stage, stage_weights, model.tp_rank, layout.tensor_parallel);
  model.shard = sharded.shard;
  model.spec = std::move(sharded.spec);
  model.weights = std::move(sharded.weights);
  if (layout.tensor_parallel > 1) model.runner.plan = std::move(sharded.plan);
  if (model.shard.vocab_rows > 0)
    model.runner.vocab = {model.tp_rank, layout.tensor_parallel, model.shard.vocab_rows,
                          first && layout.tensor_parallel > 1 && splits_embedding(stage_weights.embed)};

  PipelineLinks& links = model.runner.pipeline;
  const int last_stage = layout.pipeline_parallel - 1;
  links.self = rank;
  links.prev = model.stage > 0 ? layout.rank_of(model.stage - 1, model.tp_rank) : -1;
  links.next = model.stage < last_stage ? layout.rank_of(model.stage + 1, model.tp_rank) : -1;
  links.leader = 0;
  links.output_source = layout.rank_of(last_stage, 0);
  links.split = layout.tensor_parallel;
  links.split_rank = model.tp_rank;
  return model;
}

}  // namespace splitflow
