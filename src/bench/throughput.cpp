#include "bench/throughput.h"

#include "bench/latency.h"
#include "bench/workload.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "runtime/kv_cache_sizing.h"
#include "runtime/model_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

namespace splitflow::bench {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

struct StepRecord {
  double seconds = 0;
  int32_t prefill_tokens = 0;
  int32_t decode_tokens = 0;
  int32_t preempted = 0;  // sequences preempted or swapped in: the step also ran block copies
  int32_t sampled_rows = 0;  // rows through the LM head: a token each
  int64_t kv_tokens = 0;  // positions its decode attention reads: num_tokens of each decoding sequence before it
};

double gemm_seconds(double flops, double gemm_tflops) { return gemm_tflops > 0 ? flops / (gemm_tflops * 1e12) : 0.0; }

// KV reads, then GEMMs at the longer of reading their weights and computing: the time of work
// whose decode attention runs beside no GEMM (throughput_bound's serial_s).
double in_sequence_seconds(double kv_bytes, double weight_bytes, double flops, double bandwidth_gbps,
                           double gemm_tflops) {
  const double bytes_per_s = bandwidth_gbps * 1e9;
  return kv_bytes / bytes_per_s + std::max(weight_bytes / bytes_per_s, gemm_seconds(flops, gemm_tflops));
}

}  // namespace

void check_throughput_options(const ThroughputOptions& options, const ModelSpec& spec) {
  SF_CHECK(options.num_requests >= 1, "--num-requests must be at least 1, not {}", options.num_requests);
  SF_CHECK(options.input_len >= 1 && options.output_len >= 1, "--input-len and --output-len must be at least 1 ({}, {})",
           options.input_len, options.output_len);
  SF_CHECK(options.max_seqs >= 1, "--max-seqs must be at least 1, not {}", options.max_seqs);
  SF_CHECK(options.max_batch_tokens >= options.max_seqs,
           "--max-batch-tokens ({}) must be at least --max-seqs ({}) so every running sequence can decode",
           options.max_batch_tokens, options.max_seqs);
  SF_CHECK(options.block_size >= 1, "--block-size must be at least 1, not {}", options.block_size);
  SF_CHECK(std::isfinite(options.kv_cache_gb) && options.kv_cache_gb >= 0, "--kv-cache-gb must not be negative, not {}",
           options.kv_cache_gb);
  if (const std::optional<double> fraction = options.kv_cache_memory_fraction) {
    SF_CHECK(std::isfinite(*fraction) && *fraction > 0 && *fraction <= 1,
             "--gpu-memory-utilization must be a fraction of the device's memory in (0, 1], not {}", *fraction);
    SF_CHECK(options.kv_cache_gb == 0,
             "--gpu-memory-utilization sizes the KV cache from device memory: give it alone or with --kv-cache-gb "
             "auto, not with --kv-cache-gb {}", options.kv_cache_gb);
  }
  SF_CHECK(std::isfinite(options.swap_space_gb) && options.swap_space_gb >= 0, "--swap-space must not be negative, not {}",
           options.swap_space_gb);
  SF_CHECK(options.swap_min_tokens >= 1, "--swap-min-tokens must be at least 1, not {}", options.swap_min_tokens);
  const int64_t total_len = static_cast<int64_t>(options.input_len) + options.output_len;
  SF_CHECK(total_len <= spec.max_position, "--input-len + --output-len = {} exceeds the model's context {}", total_len,
           spec.max_position);
}

int64_t throughput_kv_blocks(const ThroughputOptions& options, int64_t kv_bytes_per_block) {
  SF_CHECK(kv_bytes_per_block > 0, "KV block size in bytes must be positive, not {}", kv_bytes_per_block);
  if (options.kv_cache_memory_fraction) return 0;
  if (options.kv_cache_gb > 0) {
    return static_cast<int64_t>(options.kv_cache_gb * double(int64_t{1} << 30) / static_cast<double>(kv_bytes_per_block));
  }
  const int64_t total_len = static_cast<int64_t>(options.input_len) + options.output_len;
  return int64_t{std::min(options.num_requests, options.max_seqs)} * blocks_for_tokens(total_len, options.block_size);
}

ThroughputBound throughput_bound(const ThroughputOptions& options, const ModelCost& cost, double bandwidth_gbps,
                                 double gemm_tflops) {
  SF_CHECK(bandwidth_gbps > 0 && gemm_tflops >= 0, "throughput bound: bandwidth {} GB/s and GEMM rate {} TFLOP/s",
           bandwidth_gbps, gemm_tflops);
  const int64_t n = options.num_requests, in = options.input_len, out = options.output_len;
  const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  ThroughputBound bound;
  bound.min_steps = std::max(ceil_div(n * (out - 1), options.max_seqs), ceil_div(n * (in + out - 1), options.max_batch_tokens));
  bound.weight_read_bytes = static_cast<double>(bound.min_steps) * static_cast<double>(cost.weight_bytes);
  // Sum over j = 1 .. out - 1 of (in + j) positions, per request.
  const double kv_positions = static_cast<double>(n) * static_cast<double>(out - 1) * (static_cast<double>(in) + out / 2.0);
  bound.kv_read_bytes = kv_positions * static_cast<double>(cost.kv_bytes_per_token);
  bound.gemm_flops = 2.0 * static_cast<double>(n) *
                     (static_cast<double>(cost.layer_matrix_params) * static_cast<double>(in + out - 1) +
                      static_cast<double>(cost.head_matrix_params) * static_cast<double>(out));
  bound.serial_s =
      in_sequence_seconds(bound.kv_read_bytes, bound.weight_read_bytes, bound.gemm_flops, bandwidth_gbps, gemm_tflops);
  bound.overlapped_s = std::max((bound.kv_read_bytes + bound.weight_read_bytes) / (bandwidth_gbps * 1e9),
                                gemm_seconds(bound.gemm_flops, gemm_tflops));
  return bound;
}

nlohmann::json run_throughput(LoadedModel model, Backend& backend, const ThroughputOptions& options,
                              double bandwidth_gbps, double gemm_tflops) {
  check_throughput_options(options, model.spec);
  const ModelSpec spec = model.spec;
  const int64_t total_len = static_cast<int64_t>(options.input_len) + options.output_len;
  const DType kv_cache_dtype = resolve_kv_cache_dtype(backend, options.kv_cache_dtype);
  const int64_t kv_bytes_per_token = kv_cache_bytes_per_token(spec, kv_cache_dtype);
  const ModelCost cost = model_cost(model.weights, kv_bytes_per_token);
  const int64_t weight_bytes = cost.weight_bytes;
  const bool sized_from_memory = options.kv_cache_memory_fraction.has_value();
  int64_t num_blocks = throughput_kv_blocks(options, kv_bytes_per_token * options.block_size);
  const int64_t blocks_per_request = blocks_for_tokens(total_len, options.block_size);
  const int64_t num_host_blocks =
      std::min<int64_t>(static_cast<int64_t>(options.swap_space_gb * double(int64_t{1} << 30) /
                                             static_cast<double>(kv_bytes_per_token * options.block_size)),
                        INT32_MAX);
  SF_CHECK(sized_from_memory || (num_blocks >= blocks_per_request && num_blocks <= INT32_MAX),
           "--kv-cache-gb {} gives {} KV blocks of {} tokens; one request of {} tokens needs {}", options.kv_cache_gb,
           num_blocks, options.block_size, total_len, blocks_per_request);

  KvCacheConfig kv_config{static_cast<int32_t>(num_blocks), options.block_size, static_cast<int32_t>(num_host_blocks),
                          kv_cache_dtype};
  if (sized_from_memory)
    kv_config.memory_budget = KvCacheMemoryBudget{*options.kv_cache_memory_fraction, kDefaultKvReserveBytes, total_len};
  const auto setup_start = Clock::now();
  ModelRunner runner(spec, std::move(model.weights), backend, kv_config,
                     RunnerLimits{options.max_batch_tokens, options.max_seqs},
                     options.parallel ? options.parallel->runner_partition() : RunnerPartition{});
  if (options.parallel) options.parallel->lead(runner);
  backend.synchronize();
  const double setup_seconds = seconds_between(setup_start, Clock::now());
  num_blocks = runner.kv_config().num_blocks;
  nlohmann::json kv_memory = nullptr;  // what an automatic size came from
  if (const std::optional<KvCacheSizing>& sizing = runner.kv_cache_sizing()) {
    const KvCacheMemoryBudget& budget = *runner.kv_config().memory_budget;
    kv_memory = {{"memory_fraction", budget.memory_fraction},
                 {"reserve_bytes", budget.reserve_bytes},
                 {"device_free_bytes", sizing->memory.free_bytes},
                 {"device_total_bytes", sizing->memory.total_bytes},
                 {"usable_bytes", sizing->usable_bytes},
                 {"bytes_per_block", sizing->bytes_per_block}};
  }

  SchedulerConfig config;
  config.max_batch_tokens = options.max_batch_tokens;
  config.max_seqs = options.max_seqs;
  config.max_model_len = static_cast<int32_t>(
      std::min<int64_t>({runner.context_limit(), num_blocks * options.block_size, INT32_MAX}));
  config.num_blocks = static_cast<int32_t>(num_blocks);
  config.block_size = options.block_size;
  config.num_host_blocks = static_cast<int32_t>(num_host_blocks);
  config.swap_min_tokens = options.swap_min_tokens;
  config.splitfuse = options.splitfuse;
  const int32_t stages = options.parallel ? options.parallel->layout().pipeline_parallel : 1;
  const int32_t steps_in_flight = options.steps_in_flight > 0 ? options.steps_in_flight : stages;
  Engine engine(runner, model.tokenizer.get(), config, EngineOptions{.max_steps_in_flight = steps_in_flight});
  const WarmupReport warmup = engine.warm_up();

  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = options.output_len;
  params.ignore_eos = true;

  std::vector<StepRecord> steps;
  int64_t output_tokens = 0;
  int64_t finished = 0;
  const auto start = Clock::now();
  for (int32_t i = 0; i < options.num_requests; ++i) {
    engine.add_request(prompt_token_ids(options.seed, i, options.input_len, spec.vocab_size), params);
  }
  auto last_report = start;
  while (engine.has_unfinished()) {
    StepRecord record;
    for (const Sequence* seq : engine.scheduler().running())
      if (seq->is_decoding()) record.kv_tokens += seq->num_tokens();
    const auto step_start = Clock::now();
    const EngineStep step = engine.step();
    const auto step_end = Clock::now();
    record.seconds = seconds_between(step_start, step_end);
    record.prefill_tokens = step.num_prefill_tokens;
    record.decode_tokens = step.num_decode_tokens;
    record.preempted = step.num_preempted + step.num_swapped_in;
    record.sampled_rows = static_cast<int32_t>(step.outputs.size());
    steps.push_back(record);
    output_tokens += static_cast<int64_t>(step.outputs.size());
    finished += static_cast<int64_t>(step.finished_requests.size());
    if (seconds_between(last_report, step_end) >= 10) {
      fmt::print(stderr, "  {:.0f} s: {} steps, {} of {} requests finished, {} output tokens\n",
                 seconds_between(start, step_end), steps.size(), finished, options.num_requests, output_tokens);
      last_report = step_end;
    }
  }
  const double elapsed = seconds_between(start, Clock::now());

  // Saturation: pure decode steps (no prompt chunk, no preemption) at the largest batch seen.
  int32_t saturated_batch = 0;
  for (const StepRecord& s : steps) {
    if (s.prefill_tokens == 0 && s.preempted == 0) saturated_batch = std::max(saturated_batch, s.decode_tokens);
  }
  std::vector<const StepRecord*> saturated;
  for (const StepRecord& s : steps) {
    if (s.prefill_tokens == 0 && s.preempted == 0 && s.decode_tokens == saturated_batch) saturated.push_back(&s);
  }
  nlohmann::json saturation = nullptr;
  if (!saturated.empty() && saturated_batch > 0) {
    double time_sum = 0, kv_sum = 0, roofline_sum = 0;
    std::vector<double> times;
    for (const StepRecord* s : saturated) {
      const double kv_bytes = static_cast<double>(s->kv_tokens) * static_cast<double>(kv_bytes_per_token);
      time_sum += s->seconds;
      kv_sum += kv_bytes;
      roofline_sum += (static_cast<double>(weight_bytes) + kv_bytes) / (bandwidth_gbps * 1e9);
      times.push_back(s->seconds);
    }
    const double n = static_cast<double>(saturated.size());
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    const double mean_step = time_sum / n, mean_roofline = roofline_sum / n;
    saturation = {
        {"batch", saturated_batch},
        {"steps", saturated.size()},
        {"mean_step_ms", mean_step * 1e3},
        {"median_step_ms", times[times.size() / 2] * 1e3},
        {"mean_kv_bytes", kv_sum / n},
        {"mean_context_tokens", kv_sum / n / static_cast<double>(kv_bytes_per_token) / saturated_batch},
        {"roofline_step_ms", mean_roofline * 1e3},
        {"ratio_to_roofline", mean_step / mean_roofline},
        {"achieved_gbps", (static_cast<double>(weight_bytes) + kv_sum / n) / mean_step / 1e9},
        {"decode_tokens_per_s", saturated_batch / mean_step},
    };
  }

  // Each kind of step against its own bound, throughput_bound's serial_s for one step (the
  // prefill attention left out).
  const auto step_bound_s = [&](const StepRecord& s) {
    const double flops = 2.0 * (static_cast<double>(cost.layer_matrix_params) * (s.prefill_tokens + s.decode_tokens) +
                                static_cast<double>(cost.head_matrix_params) * s.sampled_rows);
    return in_sequence_seconds(static_cast<double>(s.kv_tokens) * static_cast<double>(kv_bytes_per_token),
                               static_cast<double>(weight_bytes), flops, bandwidth_gbps, gemm_tflops);
  };
  struct KindSum {
    int64_t steps = 0;
    double seconds = 0, bound_s = 0, prefill_tokens = 0, decode_tokens = 0;
  };
  KindSum prefill_kind, mixed_kind, decode_kind;
  double step_time_sum = 0;
  for (const StepRecord& s : steps) {
    step_time_sum += s.seconds;
    KindSum& kind = s.prefill_tokens == 0 ? decode_kind : s.decode_tokens == 0 ? prefill_kind : mixed_kind;
    ++kind.steps;
    kind.seconds += s.seconds;
    kind.bound_s += step_bound_s(s);
    kind.prefill_tokens += s.prefill_tokens;
    kind.decode_tokens += s.decode_tokens;
  }
  const auto kind_json = [](const KindSum& kind) -> nlohmann::json {
    if (kind.steps == 0) return nullptr;
    const double n = static_cast<double>(kind.steps);
    return {{"steps", kind.steps},
            {"seconds", kind.seconds},
            {"mean_ms", kind.seconds / n * 1e3},
            {"mean_prefill_tokens", kind.prefill_tokens / n},
            {"mean_decode_tokens", kind.decode_tokens / n},
            {"bound_ms", kind.bound_s / n * 1e3},
            {"ratio_to_bound", kind.seconds / kind.bound_s}};
  };
  const int64_t prefill_steps = prefill_kind.steps, mixed_steps = mixed_kind.steps, decode_steps = decode_kind.steps;
  const int64_t input_tokens = int64_t{options.num_requests} * options.input_len;
  const ThroughputBound bound = throughput_bound(options, cost, bandwidth_gbps, gemm_tflops);
  const double expected_output = static_cast<double>(options.num_requests) * options.output_len;
  const nlohmann::json bound_json = {
      {"min_steps", bound.min_steps},
      {"weight_read_bytes", bound.weight_read_bytes},
      {"kv_read_bytes", bound.kv_read_bytes},
      {"gemm_flops", bound.gemm_flops},
      {"serial_s", bound.serial_s},
      {"overlapped_s", bound.overlapped_s},
      {"serial_output_tps", expected_output / bound.serial_s},
      {"overlapped_output_tps", expected_output / bound.overlapped_s},
      {"fraction_of_serial", bound.serial_s / elapsed},
  };
  return {
      {"num_requests", options.num_requests},
      {"input_len", options.input_len},
      {"output_len", options.output_len},
      {"max_batch_tokens", options.max_batch_tokens},
      {"max_seqs", options.max_seqs},
      {"splitfuse", options.splitfuse},
      {"block_size", options.block_size},
      {"kv_cache_dtype", dtype_name(kv_cache_dtype)},
      {"kv_cache_sizing", sized_from_memory ? "memory" : options.kv_cache_gb > 0 ? "gib" : "requests"},
      {"kv_cache_memory", kv_memory},
      {"kv_cache_blocks", num_blocks},
      {"kv_cache_gib", static_cast<double>(num_blocks * kv_bytes_per_token * options.block_size) / double(int64_t{1} << 30)},
      {"swap_space_blocks", num_host_blocks},
      {"weight_bytes", weight_bytes},
      {"kv_bytes_per_token", kv_bytes_per_token},
      {"runner_setup_s", setup_seconds},
      {"warmup_s", warmup.seconds},
      {"swap_min_tokens", options.swap_min_tokens},
      {"elapsed_s", elapsed},
      {"input_tokens", input_tokens},
      {"output_tokens", output_tokens},
      {"expected_output_tokens", int64_t{options.num_requests} * options.output_len},
      {"output_throughput_tps", static_cast<double>(output_tokens) / elapsed},
      {"total_token_throughput_tps", static_cast<double>(input_tokens + output_tokens) / elapsed},
      {"request_throughput_rps", options.num_requests / elapsed},
      {"steps", steps.size()},
      {"prefill_only_steps", prefill_steps},
      {"mixed_steps", mixed_steps},
      {"decode_only_steps", decode_steps},
      {"step_kinds", {{"prefill", kind_json(prefill_kind)}, {"mixed", kind_json(mixed_kind)}, {"decode", kind_json(decode_kind)}}},
      {"mean_step_ms", steps.empty() ? 0.0 : step_time_sum / static_cast<double>(steps.size()) * 1e3},
      {"preemptions", engine.scheduler().num_preemptions()},
      {"swap_outs", engine.scheduler().num_swap_outs()},
      {"bandwidth_gbps", bandwidth_gbps},
      {"gemm_tflops", gemm_tflops},
      {"layer_matrix_params", cost.layer_matrix_params},
      {"head_matrix_params", cost.head_matrix_params},
      {"saturation", saturation},
      {"bound", bound_json},
      // With tensor parallelism the bytes, FLOPs and bound are one rank's (its shard), on one GPU.
      {"tensor_parallel_size", options.parallel ? options.parallel->layout().tensor_parallel : 1},
      {"pipeline_parallel_size", options.parallel ? options.parallel->layout().pipeline_parallel : 1},
      {"steps_in_flight", steps_in_flight},
  };
}

}  // namespace splitflow::bench
