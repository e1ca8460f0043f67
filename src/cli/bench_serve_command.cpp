// `splitflow bench serve` (bench/serve.h: load on a running server, latency percentiles, SLO
// goodput, arrival-rate sweeps) and `splitflow bench throughput` (bench/throughput.h: offline,
// in-process). Both print a table and write JSON (serve: also CSV and the plot) under
// bench/results/serve/ with the date and commit; throughput also the device and its roofline.
#include "bench/report.h"
#include "bench/serve.h"
#include "bench/throughput.h"
#include "bench/workload.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "cli/roofline.h"
#include "core/error.h"
#include "runtime/kv_cache_sizing.h"
#include "sim/workload.h"

#include <fmt/format.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace splitflow::cli {

namespace {

struct ServeBenchFlags {
  std::string url;
  std::string model;
  double rate = 0;
  std::vector<double> sweep;
  double duration_s = 0;
  int64_t num_requests = 0;
  std::string trace;
  double time_scale = 1;
  int32_t input_len = 0;
  int32_t output_len = 0;
  bench::SloLimits slo;
  uint64_t seed = 0;
  bench::ClientOptions client;
  std::string label;
  bool per_request = false;
  bool no_plot = false;
  int32_t stop_after_misses = 0;
  std::string results_dir = "bench/results/serve";
};

std::string stem_of(const std::string& json_path) {
  return (std::filesystem::path(json_path).parent_path() / std::filesystem::path(json_path).stem()).string();
}

void print_serve_header() {
  fmt::print("| {:>8} | {:>6} | {:>4} | {:>9} | {:>8} | {:>27} | {:>23} | {:>27} | {:>3} |\n", "rate/s", "done",
             "fail", "out tok/s", "goodput", "TTFT p50 / p90 / p99 (ms)", "ITL p50 / p90 / p99", "E2E p50 / p90 / p99 (ms)",
             "SLO");
  fmt::print("|{:->10}|{:->8}|{:->6}|{:->11}|{:->10}|{:->29}|{:->25}|{:->29}|{:->5}|\n", "", "", "", "", "", "", "", "", "");
  std::fflush(stdout);
}

void print_serve_row(const std::string& rate, const bench::RunSummary& s) {
  auto three = [](const bench::LatencyStats& l, int digits) {
    return fmt::format("{:.{}f} / {:.{}f} / {:.{}f}", l.p50, digits, l.p90, digits, l.p99, digits);
  };
  fmt::print("| {:>8} | {:>6} | {:>4} | {:>9.1f} | {:>8.3f} | {:>27} | {:>23} | {:>27} | {:>3} |\n", rate,
             s.num_completed, s.num_failed, s.output_throughput, s.goodput, three(s.ttft, 1), three(s.itl, 1),
             three(s.e2e, 0), s.meets_slo ? "yes" : "no");
  std::fflush(stdout);  // a row per run as it ends, also when piped
}

void run_bench_serve(const ServeBenchFlags& flags) {
  SF_CHECK(!flags.url.empty(), "--url is required (the running server, e.g. http://127.0.0.1:8000)");
  SF_CHECK(flags.sweep.empty() || flags.rate == 0, "give --rate or --sweep, not both");
  for (double rate : flags.sweep) {
    SF_CHECK(std::isfinite(rate) && rate > 0, "--sweep rates must be positive numbers of requests per second, not {}", rate);
  }
  SF_CHECK(flags.stop_after_misses >= 0, "--stop-after-misses must not be negative, not {}", flags.stop_after_misses);
  SF_CHECK(std::isfinite(flags.client.timeout_s) && flags.client.timeout_s > 0, "--timeout must be positive seconds, not {}",
           flags.client.timeout_s);
  SF_CHECK(flags.client.prompt_vocab > 0, "--prompt-vocab must be positive, not {}", flags.client.prompt_vocab);
  SF_CHECK(flags.client.endpoint == "completions" || flags.client.endpoint == "embeddings",
           "--endpoint must be completions or embeddings, not '{}'", flags.client.endpoint);
  SF_CHECK(flags.client.inputs_per_request >= 1 && flags.client.inputs_per_request <= 2048,
           "--inputs-per-request must be in [1, 2048] (OpenAI's limit on an input list), not {}",
           flags.client.inputs_per_request);
  SF_CHECK(flags.client.encoding_format == "float" || flags.client.encoding_format == "base64",
           "--encoding-format must be float or base64, not '{}'", flags.client.encoding_format);
  SF_CHECK(flags.client.endpoint == "embeddings" ||
               (flags.client.inputs_per_request == 1 && flags.client.encoding_format == "float"),
           "--inputs-per-request and --encoding-format are for --endpoint embeddings");
  bench::check_slo(flags.slo);
  const bench::ServerUrl url = bench::parse_server_url(flags.url);

  bench::WorkloadSpec spec;
  spec.rate_per_s = flags.rate;
  spec.trace_path = flags.trace;
  spec.time_scale = flags.time_scale;
  spec.duration_s = flags.duration_s;
  spec.num_requests = flags.num_requests;
  spec.input_len = flags.input_len;
  // Embeddings generate nothing: a nominal output of one token keeps the workload's length rules
  // (and fit_context) as they are; the client sends no max_tokens.
  spec.output_len = flags.client.endpoint == "embeddings" && flags.output_len == 0 ? 1 : flags.output_len;
  spec.seed = flags.seed;
  std::vector<sim::Request> trace;
  if (!flags.trace.empty()) {
    SF_CHECK(std::filesystem::is_regular_file(flags.trace), "--trace '{}': no such file", flags.trace);
    trace = sim::load_trace(flags.trace);
  }
  // Every run's workload is built (and checked) before the first request.
  std::vector<double> rates = flags.sweep;
  if (rates.empty()) rates.push_back(flags.rate);
  std::vector<bench::Workload> workloads;
  for (double rate : rates) {
    spec.rate_per_s = rate;
    workloads.push_back(bench::make_workload(spec, trace));
  }

  const bench::ServerInfo server = bench::query_server(url, std::min(flags.client.timeout_s, 10.0));
  bench::ClientOptions client = flags.client;
  client.seed = flags.seed;
  client.model = flags.model.empty() ? server.model : flags.model;
  fmt::print(stderr, "server {}: model '{}', context {} tokens\n", url.text, server.model,
             server.max_model_len > 0 ? std::to_string(server.max_model_len) : "not given");

  nlohmann::json result = {
      {"benchmark", "serve"},
      {"label", flags.label},
      {"url", url.text},
      {"model", client.model},
      {"server_max_model_len", server.max_model_len},
      {"date", bench::utc_timestamp()},
      {"commit", bench::source_commit()},
      {"client", bench::cpu_description(omp_get_max_threads())},
      {"slo", {{"ttft_ms", flags.slo.ttft_ms}, {"itl_ms", flags.slo.itl_ms}, {"percentile", flags.slo.percentile}}},
      {"prompt_vocab", client.prompt_vocab},
      {"endpoint", client.endpoint},
      {"inputs_per_request", client.inputs_per_request},
      {"encoding_format", client.encoding_format},
      {"seed", flags.seed},
      {"max_concurrency", client.max_concurrency},
      {"rates_requested", flags.sweep},
      {"runs", nlohmann::json::array()},
  };
  std::vector<bench::SweepPoint> points;
  int32_t misses = 0;  // consecutive runs that missed the SLO
  print_serve_header();
  for (size_t r = 0; r < workloads.size(); ++r) {
    bench::Workload& workload = workloads[r];
    if (server.max_model_len > 0) bench::fit_context(workload, server.max_model_len);
    fmt::print(stderr, "run {}/{}: {} ({} requests{})\n", r + 1, workloads.size(), workload.description,
               workload.requests.size(),
               workload.num_clipped > 0 ? fmt::format(", {} shortened to fit the context", workload.num_clipped) : "");
    const std::vector<bench::RequestRecord> records = bench::run_workload(url, client, workload);
    const bench::RunSummary summary = bench::summarize(records, flags.slo);
    // A replay's rate is the one it offered: its requests over its span of arrivals.
    const double rate = rates[r] > 0 ? rates[r]
                        : workload.last_arrival_s > 0
                            ? static_cast<double>(workload.requests.size()) / workload.last_arrival_s
                            : 0.0;
    points.push_back({rate, summary});
    print_serve_row(rates[r] > 0 ? fmt::format("{:g}", rate) : fmt::format("~{:.2f}", rate), summary);
    for (const std::string& error : summary.errors) fmt::print(stderr, "  failed: {}\n", error);
    nlohmann::json run = {{"rate_rps", rate},
                          {"poisson", rates[r] > 0},
                          {"workload", workload.description},
                          {"num_clipped_to_context", workload.num_clipped},
                          {"last_arrival_s", workload.last_arrival_s},
                          {"summary", bench::summary_json(summary)}};
    if (flags.per_request) run["requests"] = bench::records_json(records);
    result["runs"].push_back(std::move(run));
    misses = summary.meets_slo ? 0 : misses + 1;
    if (flags.stop_after_misses > 0 && misses == flags.stop_after_misses && r + 1 < workloads.size()) {
      fmt::print(stderr, "sweep stopped: {} runs in a row missed the SLO\n", misses);
      break;
    }
  }
  if (points.size() > 1) result["max_rate_meeting_slo"] = bench::max_rate_meeting_slo(points);

  const std::string json_path = bench::write_result(result, flags.results_dir, "serve");
  const std::string stem = stem_of(json_path);
  bench::write_sweep_csv(stem + ".csv", points);
  fmt::print("result: {}\ntable: {}.csv\n", json_path, stem);
  if (points.size() > 1) {
    fmt::print("highest rate meeting the SLO (p{:g} TTFT < {:g} ms, ITL < {:g} ms): {:g} req/s\n", flags.slo.percentile,
               flags.slo.ttft_ms, flags.slo.itl_ms, bench::max_rate_meeting_slo(points));
    if (!flags.no_plot) {
      const std::string label = flags.label.empty() ? client.model : flags.label;
      fmt::print("{}\n", bench::plot_latency_vs_rate(bench::find_plot_script(), stem + ".svg", flags.slo,
                                                     {{stem + ".csv", label}}));
    }
  }
}

struct ThroughputFlags {
  ModelFlags model;
  bench::ThroughputOptions options;
  std::string kv_cache_dtype = "auto";
  std::string kv_cache_gb;  // GiB, or "auto"
  std::optional<double> gpu_memory_utilization;
  bool no_splitfuse = false;
  std::string results_dir = "bench/results/serve";
};

void run_bench_throughput(const ThroughputFlags& flags) {
  const int threads = flags.model.threads > 0 ? flags.model.threads : omp_get_max_threads();
  bench::ThroughputOptions options = flags.options;
  options.splitfuse = !flags.no_splitfuse;
  options.kv_cache_dtype = parse_kv_cache_dtype_flag(flags.kv_cache_dtype);
  // Without a size: on CUDA what the GPU's memory leaves (vLLM's default too), on the CPU room for
  // min(N, max-seqs) whole requests.
  const KvCacheSizeRequest kv_size = parse_kv_cache_size(0, flags.kv_cache_gb, flags.gpu_memory_utilization);
  if (kv_size.mode == KvCacheSizeRequest::Mode::Gib) options.kv_cache_gb = kv_size.gib;
  if (kv_size.mode == KvCacheSizeRequest::Mode::Memory ||
      (kv_size.mode == KvCacheSizeRequest::Mode::Default && flags.model.backend == "cuda"))
    options.kv_cache_memory_fraction = kv_size.memory_fraction;
  ParallelRank ranks = flags.model.join_ranks();
  std::unique_ptr<Backend> backend = flags.model.make_backend(&ranks);
  const auto load_start = std::chrono::steady_clock::now();
  LoadedModel model = load_model(flags.model.options());
  ranks.partition(model);
  if (!ranks.leader()) return ranks.follow(model.spec, std::move(model.weights), *backend);
  options.parallel = &ranks;
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  fmt::print(stderr, "model: {} (loaded in {:.1f} s)\n", model.description, load_seconds);
  bench::check_throughput_options(options, model.spec);
  const Roofline roofline = measure_roofline(flags.model, threads);
  const std::string description = model.description;
  nlohmann::json result =
      bench::run_throughput(std::move(model), *backend, options, roofline.bandwidth_gbps, roofline.gemm_tflops);
  result["benchmark"] = "throughput";
  result["model"] = description;
  if (!flags.model.quantization.empty()) result["quantization"] = flags.model.quantization;  // fp8: W8A8
  result["load_s"] = load_seconds + result["runner_setup_s"].get<double>();
  result["backend"] = backend->name();
  result["device"] = roofline.device;
  result["date"] = bench::utc_timestamp();
  result["commit"] = bench::source_commit();

  fmt::print("| {:<34} | {:>16} |\n|{:-<36}|{:->18}|\n", "throughput", "value", "", "");
  auto row = [](const std::string& name, const std::string& value) { fmt::print("| {:<34} | {:>16} |\n", name, value); };
  row("device", roofline.device.substr(0, 16));
  row("requests x (in / out)", fmt::format("{} x {}/{}", options.num_requests, options.input_len, options.output_len));
  row("scheduler", fmt::format("{} {}/{}", options.splitfuse ? "splitfuse" : "prefill-first", options.max_batch_tokens,
                               options.max_seqs));
  row(result["kv_cache_sizing"] == "memory" ? "KV blocks (GiB), from memory" : "KV blocks (GiB)",
      fmt::format("{} ({:.2f})", result["kv_cache_blocks"].get<int64_t>(), result["kv_cache_gib"].get<double>()));
  row("elapsed (s)", fmt::format("{:.2f}", result["elapsed_s"].get<double>()));
  row("output tokens/s", fmt::format("{:.1f}", result["output_throughput_tps"].get<double>()));
  row("total tokens/s", fmt::format("{:.1f}", result["total_token_throughput_tps"].get<double>()));
  row("requests/s", fmt::format("{:.3f}", result["request_throughput_rps"].get<double>()));
  row("preemptions (swapped)", fmt::format("{} ({})", result["preemptions"].get<int64_t>(),
                                            result["swap_outs"].get<int64_t>()));
  const nlohmann::json& saturation = result["saturation"];
  if (!saturation.is_null()) {
    row("saturated decode batch", fmt::format("{}", saturation["batch"].get<int64_t>()));
    row("decode step at saturation (ms)", fmt::format("{:.2f}", saturation["mean_step_ms"].get<double>()));
    row("(weights + KV) / bandwidth (ms)", fmt::format("{:.2f}", saturation["roofline_step_ms"].get<double>()));
    row("step / roofline", fmt::format("{:.3f}", saturation["ratio_to_roofline"].get<double>()));
  }
  for (const char* kind : {"mixed", "decode"}) {
    const nlohmann::json& steps = result["step_kinds"][kind];
    if (steps.is_null()) continue;
    row(fmt::format("{} steps: mean / bound (ms)", kind),
        fmt::format("{:.1f} / {:.1f}", steps["mean_ms"].get<double>(), steps["bound_ms"].get<double>()));
  }
  const nlohmann::json& bound = result["bound"];
  if (roofline.gemm_tflops > 0) {
    row("bound, kernels in sequence (tok/s)", fmt::format("{:.0f}", bound["serial_output_tps"].get<double>()));
    row("bound, all overlapped (tok/s)", fmt::format("{:.0f}", bound["overlapped_output_tps"].get<double>()));
    row("bound in sequence / run", fmt::format("{:.3f}", bound["fraction_of_serial"].get<double>()));
  } else {  // no GEMM rate measured (CPU): the bytes alone
    row("bound, bytes only (tok/s)", fmt::format("{:.0f}", bound["serial_output_tps"].get<double>()));
    row("bound / run", fmt::format("{:.3f}", bound["fraction_of_serial"].get<double>()));
  }
  row("measured bandwidth (GB/s)", fmt::format("{:.1f}", roofline.bandwidth_gbps));
  if (roofline.gemm_tflops > 0) row("measured bf16 GEMM (TFLOP/s)", fmt::format("{:.1f}", roofline.gemm_tflops));
  fmt::print("result: {}\n", bench::write_result(result, flags.results_dir, "throughput"));
}

}  // namespace

void register_bench_serving(CLI::App& bench) {
  auto serve_flags = std::make_shared<ServeBenchFlags>();
  auto* serve = bench.add_subcommand("serve", "load a running server: TTFT, ITL, E2E percentiles, goodput, rate sweeps");
  ServeBenchFlags& s = *serve_flags;
  serve->add_option("--url", s.url, "the server, http://host:port")->required();
  serve->add_option("--model", s.model, "model name sent with each request (default: the server's)");
  serve->add_option("--rate", s.rate, "Poisson arrivals, requests per second");
  serve->add_option("--sweep", s.sweep, "one Poisson run per rate, e.g. 1,2,4,8")->delimiter(',');
  serve->add_option("--duration", s.duration_s, "seconds of arrivals per run (0: no limit)");
  serve->add_option("--num-requests", s.num_requests, "requests per run (0: no limit)");
  serve->add_option("--trace", s.trace, "Azure (or SplitwiseSim) trace CSV: lengths, and arrivals without --rate");
  serve->add_option("--time-scale", s.time_scale, "trace replay: arrival times multiplied by this (0.5: twice the rate)")
      ->capture_default_str();
  serve->add_option("--input-len", s.input_len, "prompt tokens per request (instead of the trace's)");
  serve->add_option("--output-len", s.output_len, "output tokens per request (instead of the trace's)");
  serve->add_option("--slo-ttft-ms", s.slo.ttft_ms, "SLO: time to first token limit")->capture_default_str();
  serve->add_option("--slo-itl-ms", s.slo.itl_ms, "SLO: inter-token latency limit")->capture_default_str();
  serve->add_option("--slo-percentile", s.slo.percentile, "SLO: percentile of TTFT and ITL a run must keep under the limits")
      ->capture_default_str();
  serve->add_option("--seed", s.seed, "arrivals and prompt token ids")->capture_default_str();
  serve->add_option("--prompt-vocab", s.client.prompt_vocab, "prompt token ids are drawn from [0, N)")->capture_default_str();
  serve->add_option("--endpoint", s.client.endpoint,
                    "completions (streamed) or embeddings (each prompt one /v1/embeddings input; its latency is TTFT "
                    "and E2E; no --output-len needed)")
      ->capture_default_str();
  serve->add_option("--inputs-per-request", s.client.inputs_per_request,
                    "embeddings: inputs in each request's list, --input-len tokens each (input throughput counts them all)")
      ->capture_default_str();
  serve->add_option("--encoding-format", s.client.encoding_format, "embeddings: float or base64, as the request asks")
      ->capture_default_str();
  serve->add_option("--timeout", s.client.timeout_s, "seconds a request may wait to connect or for its next chunk")
      ->capture_default_str();
  serve->add_option("--max-concurrency", s.client.max_concurrency, "requests in flight at once (0: no limit)")
      ->capture_default_str();
  serve->add_option("--label", s.label, "what was served (scheduler, GPU), for the result and the plot");
  serve->add_flag("--per-request", s.per_request, "also write every request's times to the JSON");
  serve->add_flag("--no-plot", s.no_plot, "do not draw the sweep's plot");
  serve->add_option("--stop-after-misses", s.stop_after_misses,
                    "end a sweep after this many runs in a row miss the SLO (0: run every rate)");
  serve->add_option("--results-dir", s.results_dir, "where the JSON, CSV and plot go")->capture_default_str();
  serve->callback([serve_flags] { run_bench_serve(*serve_flags); });

  auto throughput_flags = std::make_shared<ThroughputFlags>();
  auto* throughput = bench.add_subcommand("throughput", "offline: N requests submitted at once to an in-process engine");
  ThroughputFlags& t = *throughput_flags;
  add_model_flags(*throughput, t.model);
  throughput->add_option("--num-requests", t.options.num_requests, "requests, all submitted at the start")
      ->capture_default_str();
  throughput->add_option("--input-len", t.options.input_len, "prompt tokens per request")->capture_default_str();
  throughput->add_option("--output-len", t.options.output_len, "tokens generated per request (EOS ignored)")
      ->capture_default_str();
  throughput->add_option("--max-batch-tokens", t.options.max_batch_tokens, "tokens of one step (the SplitFuse budget)")
      ->capture_default_str();
  throughput->add_option("--max-seqs", t.options.max_seqs, "sequences running at once")->capture_default_str();
  throughput->add_flag("--no-splitfuse", t.no_splitfuse, "prefill-first scheduling");
  throughput->add_option("--steps-in-flight", t.options.steps_in_flight,
                         "steps submitted before the oldest one's tokens come back (micro-batches through pipeline "
                         "stages); 0: one per pipeline stage")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  throughput->add_option("--kv-cache-gb", t.kv_cache_gb,
                         "KV cache in GiB, or auto: what the device's memory leaves once the weights and step "
                         "buffers are allocated (default on cuda; on cpu: room for min(N, max-seqs) whole requests)");
  throughput->add_option("--gpu-memory-utilization", t.gpu_memory_utilization,
                         "with --kv-cache-gb auto (implied): the fraction of the device's total memory this process "
                         "may use, in (0, 1] (default 0.9; the CPU backend's device is host memory)");
  throughput->add_option("--swap-space", t.options.swap_space_gb,
                         "host memory in GiB for KV swapped out by preemption (0: recompute only)")
      ->capture_default_str();
  throughput->add_option("--swap-min-tokens", t.options.swap_min_tokens,
                         "preempt by swap (not recompute) when the recompute would rerun at least this many tokens")
      ->capture_default_str();
  throughput->add_option("--block-size", t.options.block_size, "tokens per KV block")->capture_default_str();
  add_kv_cache_dtype_flag(*throughput, t.kv_cache_dtype);
  throughput->add_option("--seed", t.options.seed, "prompt token ids")->capture_default_str();
  throughput->add_option("--results-dir", t.results_dir, "where the JSON result goes")->capture_default_str();
  throughput->callback([throughput_flags] { run_bench_throughput(*throughput_flags); });
}

}  // namespace splitflow::cli
