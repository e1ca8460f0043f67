#include "bench/latency.h"

#include "core/error.h"
#include "engine/generator.h"
#include "runtime/block_allocator.h"
#include "runtime/model_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

namespace splitflow::bench {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

int64_t weight_stream_bytes(const ModelWeights& weights) {
  int64_t bytes = static_cast<int64_t>(weights.lm_head.nbytes() + weights.final_norm.nbytes() + weights.final_norm_bias.nbytes());
  for (const LayerWeights& layer : weights.layers) {
    for (const Tensor* tensor : {&layer.attn_norm, &layer.attn_norm_bias, &layer.wqkv, &layer.bqkv, &layer.wo, &layer.bo,
                                 &layer.ffn_norm, &layer.ffn_norm_bias, &layer.w_gate_up, &layer.b_gate_up, &layer.w_down,
                                 &layer.b_down}) {
      bytes += static_cast<int64_t>(tensor->nbytes());
    }
  }
  return bytes;
}

ModelCost model_cost(const ModelWeights& weights, int64_t kv_bytes_per_token) {
  ModelCost cost{weight_stream_bytes(weights), kv_bytes_per_token, 0, weights.lm_head.numel()};
  for (const LayerWeights& layer : weights.layers) {
    cost.layer_matrix_params += layer.wqkv.numel() + layer.wo.numel() + layer.w_gate_up.numel() + layer.w_down.numel();
  }
  return cost;
}

nlohmann::json run_latency(LoadedModel model, Backend& backend, const LatencyOptions& options, double bandwidth_gbps,
                           double gemm_tflops) {
  SF_CHECK(options.input_len >= 1 && options.output_len >= 1 && options.batch >= 1,
           "--input-len, --output-len and --batch must be at least 1");
  const ModelSpec spec = model.spec;
  const std::string description = model.description;
  const int64_t total_len = static_cast<int64_t>(options.input_len) + options.output_len;
  SF_CHECK(total_len <= spec.max_position, "--input-len + --output-len = {} exceeds the model's context {}", total_len,
           spec.max_position);
  const ModelCost cost = model_cost(model.weights, 0);  // KV bytes: from the runner's cache dtype, below
  const int64_t weight_bytes = cost.weight_bytes;
  const int64_t matrix_params = cost.layer_matrix_params + cost.head_matrix_params;
  const int32_t blocks_per_seq = blocks_for_tokens(total_len, options.block_size);
  const int32_t prefill_chunk = std::min(options.max_batch_tokens, options.input_len);
  const auto setup_start = Clock::now();
  const KvCacheConfig kv{blocks_per_seq * options.batch, options.block_size, 0, options.kv_cache_dtype};
  const RunnerLimits limits{std::max(prefill_chunk, options.batch), options.batch};
  std::unique_ptr<LocalPipeline> split;  // -ngl: stages on the CPU and the GPU
  std::unique_ptr<ModelRunner> own;
  if (options.gpu_cpu_split) split = options.gpu_cpu_split(model, kv, limits);
  if (!split) {
    own = std::make_unique<ModelRunner>(spec, std::move(model.weights), backend, kv, limits,
                                        options.parallel ? options.parallel->runner_partition() : RunnerPartition{});
    if (options.parallel) options.parallel->lead(*own);
  }
  ModelRunner& runner = split ? split->leader() : *own;
  // Ranks reading weights at the same time in a step: a stage's tensor-parallel ranks (pipeline
  // stages take turns).
  const int concurrent_ranks = options.parallel ? options.parallel->layout().tensor_parallel : 1;
  backend.synchronize();
  const double setup_seconds = seconds_since(setup_start);

  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<int32_t> token(0, spec.vocab_size - 1);
  BlockAllocator allocator(blocks_per_seq * options.batch);
  std::vector<std::vector<int32_t>> tables(options.batch);
  for (auto& table : tables) allocator.grow_table(table, total_len, options.block_size);

  if (options.warmup) {
    const int32_t count = prefill_chunk;
    ForwardBatch prefill;
    for (int32_t i = 0; i < count; ++i) prefill.token_ids.push_back(token(rng));
    prefill.spans.push_back({count, 0, tables[0], true});
    runner.forward(prefill);
    ForwardBatch decode;
    for (int32_t s = 0; s < options.batch; ++s) {
      decode.token_ids.push_back(0);
      decode.spans.push_back({1, 0, tables[s], true});
    }
    runner.forward(decode);
    rng.seed(options.seed);
  }

  // Prefill: every sequence's prompt, in chunks of the token budget (one sequence at a time).
  std::vector<int32_t> next(options.batch);
  const auto run_prefill = [&] {
    rng.seed(options.seed);
    const auto prefill_start = Clock::now();
    for (int32_t s = 0; s < options.batch; ++s) {
      for (int32_t start = 0; start < options.input_len; start += prefill_chunk) {
        const int32_t count = std::min(prefill_chunk, options.input_len - start);
        ForwardBatch batch;
        for (int32_t i = 0; i < count; ++i) batch.token_ids.push_back(token(rng));
        batch.spans.push_back({count, start, tables[s], start + count == options.input_len});
        const bool last = start + count == options.input_len;
        const std::vector<int32_t> sampled = runner.forward_sample(batch, std::vector<SamplingRow>(last ? 1 : 0));
        if (last) next[s] = sampled[0];
      }
    }
    return seconds_since(prefill_start);
  };
  // Decode: one token of every sequence per step, greedy on the device (only the tokens come back).
  const std::vector<SamplingRow> greedy(options.batch);
  std::vector<int32_t> first;  // the prompts' sampled tokens, each decode run's start
  const int32_t decode_steps = options.output_len - 1;
  const auto run_decode = [&] {
    next = first;
    const auto decode_start = Clock::now();
    for (int32_t step = 0; step < decode_steps; ++step) {
      ForwardBatch batch;
      for (int32_t s = 0; s < options.batch; ++s) {
        batch.token_ids.push_back(next[s]);
        batch.spans.push_back({1, options.input_len + step, tables[s], true});
      }
      next = runner.forward_sample(batch, greedy);
    }
    return decode_steps > 0 ? seconds_since(decode_start) / decode_steps : 0.0;
  };
  const int32_t repetitions = std::max(options.repetitions, 1);
  std::vector<double> ttft_runs, tpot_runs;
  // The region marked for a profiler is the first run's prefill, or its decode steps by default.
  for (int32_t rep = 0; rep < repetitions; ++rep) {
    if (rep == 0 && options.profile_prefill) backend.profile_region(true);
    ttft_runs.push_back(run_prefill());
    if (rep == 0 && options.profile_prefill) backend.profile_region(false);
  }
  first = next;
  for (int32_t rep = 0; rep < repetitions; ++rep) {
    if (rep == 0 && !options.profile_prefill) backend.profile_region(true);
    tpot_runs.push_back(run_decode());
    if (rep == 0 && !options.profile_prefill) backend.profile_region(false);
  }
  // Means of the runs' times (ttft_ms, tpot_ms and the rates from them); deviations of their rates.
  const auto mean = [](const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / v.size(); };
  const auto stddev_of_rate = [&](const std::vector<double>& seconds, double work) {
    std::vector<double> rates;
    for (double s : seconds) rates.push_back(s > 0 ? work / s : 0.0);
    const double m = mean(rates);
    double squares = 0.0;
    for (double r : rates) squares += (r - m) * (r - m);
    return rates.size() > 1 ? std::sqrt(squares / (rates.size() - 1)) : 0.0;
  };
  const double ttft_seconds = mean(ttft_runs);
  const double tpot_seconds = mean(tpot_runs);

  // KV bytes read per step, averaged over the decode steps: K and V of every cached position, in
  // the cache dtype.
  const double mean_context = options.input_len + decode_steps / 2.0;
  const double kv_bytes = kv_cache_bytes_per_token(spec, runner.kv_cache_dtype()) * mean_context * options.batch;
  const double achieved_gbps = tpot_seconds > 0 ? (weight_bytes + kv_bytes) / tpot_seconds / 1e9 : 0.0;
  // Model FLOPs of the prefill: 2 per weight per token (attention's quadratic part left out).
  const double prefill_gflops = 2.0 * matrix_params * options.input_len * options.batch / ttft_seconds / 1e9;

  nlohmann::json result = {
      {"model", description},
      {"input_len", options.input_len},
      {"output_len", options.output_len},
      {"batch", options.batch},
      {"weight_bytes", weight_bytes},
      {"kv_cache_dtype", dtype_name(runner.kv_cache_dtype())},
      {"kv_bytes_per_step", kv_bytes},
      {"runner_setup_s", setup_seconds},
      {"ttft_ms", ttft_seconds * 1e3},
      {"prefill_tokens_per_s", options.input_len * options.batch / ttft_seconds},
      {"prefill_stddev", stddev_of_rate(ttft_runs, double{options.input_len} * options.batch)},
      {"repetitions", repetitions},
      {"prefill_gflops", prefill_gflops},
      {"tpot_ms", tpot_seconds * 1e3},
      {"decode_tokens_per_s", tpot_seconds > 0 ? options.batch / tpot_seconds : 0.0},
      {"decode_stddev", stddev_of_rate(tpot_runs, options.batch)},
      {"achieved_gbps", achieved_gbps},
      {"bandwidth_gbps", bandwidth_gbps},
      {"fraction_of_bandwidth", achieved_gbps / bandwidth_gbps},
      // In a parallel job the bytes above are rank 0's (its layers, shard and KV heads), the
      // bandwidth one GPU's; a stage's tensor-parallel ranks read about that many times as much.
      {"tensor_parallel_size", options.parallel ? options.parallel->layout().tensor_parallel : 1},
      {"pipeline_parallel_size", options.parallel ? options.parallel->layout().pipeline_parallel : 1},
      {"aggregate_gbps", achieved_gbps * concurrent_ranks},
  };
  if (gemm_tflops > 0) {
    result["gemm_tflops"] = gemm_tflops;
    result["prefill_tflops"] = prefill_gflops / 1e3;
    result["prefill_fraction_of_gemm"] = prefill_gflops / 1e3 / gemm_tflops;
  }
  return result;
}

}  // namespace splitflow::bench
