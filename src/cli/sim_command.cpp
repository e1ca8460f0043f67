// `splitflow sim ...`: the cluster simulator (src/sim, docs/simulator.md) as a command.
//   run     one cluster config on one workload: summary, per-request and batch-time CSVs
//   sweep   configs × request rates: slowdown vs rate table, CSV and plot
//   search  design search: cheapest / least-power shapes for a target rate, or the most
//           throughput within a cost or power budget
//   scale   simulation speed and memory vs cluster size
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/report.h"
#include "cli/commands.h"
#include "core/error.h"
#include "sim/config.h"
#include "sim/perf_model.h"
#include "sim/plots.h"
#include "sim/report.h"
#include "sim/search.h"
#include "sim/workload.h"

namespace splitflow::cli {

namespace {

using namespace splitflow::sim;

std::string shared_dir() {
  const char* env = std::getenv("SPLITFLOW_SHARED_DIR");
  return env != nullptr ? env : "../shared";
}

// Flags every mode shares: where the perf model and the trace come from, how the workload is made.
struct WorkloadFlags {
  std::string perf_model = shared_dir() + "/sim-reference/splitwise-sim/perf_model.csv";
  std::string trace = shared_dir() + "/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv";
  double duration_s = 600;
  uint64_t seed = 1;
  std::string out_dir;
  int threads = 1;
  std::string decode_model = "auto";

  PerfModel load_perf_model() const { return PerfModel::load_csv(perf_model, parse_decode_model_choice(decode_model)); }
};

void add_workload_flags(CLI::App& command, WorkloadFlags& flags, double default_duration_s) {
  flags.duration_s = default_duration_s;
  command.add_option("--perf-model", flags.perf_model, "performance-model CSV (profile schema, docs/simulator.md)")
      ->capture_default_str();
  command.add_option("--trace", flags.trace,
                     "request trace (Azure 2023 or SplitwiseSim CSV): replayed, or the lengths Poisson arrivals draw from")
      ->capture_default_str();
  command.add_option("--duration", flags.duration_s, "seconds of Poisson arrivals")->capture_default_str();
  command.add_option("--seed", flags.seed, "seed of the Poisson workload")->capture_default_str();
  command.add_option("--out", flags.out_dir, "directory for CSV, JSON and plots (created if missing)");
  command.add_option("--decode-model", flags.decode_model,
                     "decode step time: splitwise (SplitwiseSim's, context ignored), context (bilinear in batch and "
                     "context, needs a splitflow profile CSV) or auto (context when the CSV has a context grid)")
      ->capture_default_str();
}

void add_threads_flag(CLI::App& command, WorkloadFlags& flags) {
  command.add_option("--threads", flags.threads, "simulations run in parallel (results do not depend on it)")
      ->capture_default_str();
}

std::string trace_name(const std::string& path) { return std::filesystem::path(path).stem().string(); }

void check_workload_flags(const WorkloadFlags& flags) {
  SF_CHECK(std::isfinite(flags.duration_s) && flags.duration_s > 0, "--duration must be positive seconds, got {}",
           flags.duration_s);
  SF_CHECK(flags.threads > 0, "--threads must be positive, got {}", flags.threads);
}

std::string prepare_out_dir(const std::string& dir) {
  if (dir.empty()) return dir;
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  SF_CHECK(!error && std::filesystem::is_directory(dir), "--out '{}': cannot create the directory: {}", dir,
           error.message());
  return dir;
}

std::string out_path(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

nlohmann::json provenance() {
  return {{"date", bench::utc_timestamp()}, {"commit", bench::source_commit()}, {"host", bench::cpu_description(1)}};
}

void report_plot(const PlotOutcome& outcome) { fmt::print(stderr, "plot: {}\n", outcome.message); }

// ---- run ----

struct RunFlags {
  WorkloadFlags workload;
  std::string config;
  bool rate_given = false;  // Poisson at `rate`; otherwise the trace is replayed
  double rate = 0;
  double rate_scale = 1;    // replay only
};

void run_sim_run(const RunFlags& flags) {
  check_workload_flags(flags.workload);
  const ClusterConfig config = load_cluster_config(flags.config);
  const PerfModel perf_model = flags.workload.load_perf_model();
  const std::vector<Request> trace = load_trace(flags.workload.trace);
  Workload workload;
  if (flags.rate_given) {
    SF_CHECK(flags.rate_scale == 1, "--rate-scale applies to trace replay; with --rate, arrivals are Poisson");
    SF_CHECK(std::isfinite(flags.rate) && flags.rate > 0, "--rate must be positive requests per second, got {}",
             flags.rate);
    workload = poisson_workload_from(trace, flags.rate, flags.workload.duration_s, flags.workload.seed,
                                     trace_name(flags.workload.trace));
  } else {
    SF_CHECK(std::isfinite(flags.rate_scale) && flags.rate_scale > 0, "--rate-scale must be positive, got {}",
             flags.rate_scale);
    workload = replay_workload(trace, flags.rate_scale, trace_name(flags.workload.trace));
  }
  const Evaluation evaluation = evaluate(config, perf_model, workload);
  const std::string decode_model = decode_model_name(reference_curves(config, perf_model).decode_model);
  fmt::print("decode model: {}\n", decode_model);
  fmt::print("{}", format_summary(evaluation.summary, config.slo));
  const std::string dir = prepare_out_dir(flags.workload.out_dir);
  if (dir.empty()) return;
  nlohmann::json summary = summary_json(evaluation.summary, config.slo);
  summary["config"] = flags.config;
  summary["perf_model"] = {{"path", flags.workload.perf_model}, {"decode_model", decode_model}};
  summary["provenance"] = provenance();
  write_json(out_path(dir, "summary.json"), summary);
  write_requests_csv(out_path(dir, "requests.csv"), evaluation.result.requests, reference_curves(config, perf_model));
  write_batch_time_csv(out_path(dir, "batch_time.csv"), evaluation.summary.batch_time);
  fmt::print(stderr, "wrote {}/summary.json, requests.csv, batch_time.csv\n", dir);
}

// ---- sweep ----

struct SweepFlags {
  WorkloadFlags workload;
  std::vector<std::string> configs;
  std::string rates = "30:250:10";
};

WorkloadAtRate poisson_at(const std::vector<Request>& trace, const WorkloadFlags& flags) {
  const std::string name = trace_name(flags.trace);
  return [&trace, name, duration_s = flags.duration_s, seed = flags.seed](double rate) {
    return poisson_workload_from(trace, rate, duration_s, seed, name);
  };
}

void run_sim_sweep(const SweepFlags& flags) {
  check_workload_flags(flags.workload);
  const std::vector<double> rates = parse_rates(flags.rates);
  std::vector<ClusterConfig> configs;
  for (const std::string& path : flags.configs) configs.push_back(load_cluster_config(path));
  const PerfModel perf_model = flags.workload.load_perf_model();
  const std::vector<Request> trace = load_trace(flags.workload.trace);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<SweepRow> rows =
      sweep_rates(configs, perf_model, rates, poisson_at(trace, flags.workload), flags.workload.threads);
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("slowdown vs request rate (Poisson, {} s per rate, lengths from {}; {} runs in {:.1f} s)\n",
             flags.workload.duration_s, trace_name(flags.workload.trace), rows.size(), wall_s);
  fmt::print("{}", format_sweep(rows));
  size_t name_width = 6;
  for (const ClusterConfig& config : configs) name_width = std::max(name_width, config.name.size());
  fmt::print("\n{:<{}} {:>8} {:>8} {:>16} {:>14}\n", "design", name_width, "cost", "power", "max rate in SLO",
             "throughput/s");
  nlohmann::json designs = nlohmann::json::array();
  for (const ClusterConfig& config : configs) {
    const double max_rate = max_rate_meeting_slos(rows, config.name);
    double throughput = 0;
    for (const SweepRow& row : rows)
      if (row.design == config.name && row.rate_per_s == max_rate) throughput = row.summary.throughput_per_s;
    fmt::print("{:<{}} {:>8.2f} {:>8.1f} {:>16.1f} {:>14.2f}\n", config.name, name_width, config.total_cost(),
               config.total_power(), max_rate, throughput);
    designs.push_back({{"design", config.name}, {"machines", config.total_machines()}, {"cost", config.total_cost()},
                       {"power", config.total_power()}, {"max_rate_meeting_slos", max_rate},
                       {"throughput_per_s", throughput}});
  }
  const std::string dir = prepare_out_dir(flags.workload.out_dir);
  if (dir.empty()) return;
  write_sweep_csv(out_path(dir, "sweep.csv"), rows);
  write_json(out_path(dir, "sweep.json"),
             {{"workload", fmt::format("Poisson, {} s per rate, lengths from {} (seed {})", flags.workload.duration_s,
                                       trace_name(flags.workload.trace), flags.workload.seed)},
              {"rates", rates},
              {"configs", flags.configs},
              {"designs", designs},
              {"wall_s", wall_s},
              {"provenance", provenance()}});
  std::vector<std::string> names;
  for (const ClusterConfig& config : configs) names.push_back(config.name);
  report_plot(plot_latency_vs_rate(dir, "sweep.csv", names, configs.front().slo));
  fmt::print(stderr, "wrote {}/sweep.csv, sweep.json\n", dir);
}

// ---- search ----

struct SearchFlags {
  WorkloadFlags workload;
  std::string config;
  std::vector<std::string> designs;
  bool rate_given = false, iso_cost_given = false, iso_power_given = false;
  double rate = 0;
  double iso_cost = 0, iso_power = 0;
  std::string iso_cost_of, iso_power_of;
  std::string rates = "30:250:10";
  TargetSearchOptions limits;
};

void run_sim_search(const SearchFlags& flags) {
  check_workload_flags(flags.workload);
  const ClusterConfig base = load_cluster_config(flags.config);
  std::vector<Design> designs;
  for (const std::string& text : flags.designs) designs.push_back(parse_design(text, base));
  if (designs.empty()) designs = all_designs(base);

  int modes = 0;
  BudgetSearchOptions budget;
  budget.threads = flags.workload.threads;
  if (flags.rate_given) ++modes;
  if (flags.iso_cost_given || !flags.iso_cost_of.empty()) {
    ++modes;
    budget.kind = BudgetKind::Cost;
    budget.budget = flags.iso_cost_of.empty() ? flags.iso_cost : load_cluster_config(flags.iso_cost_of).total_cost();
  }
  if (flags.iso_power_given || !flags.iso_power_of.empty()) {
    ++modes;
    budget.kind = BudgetKind::Power;
    budget.budget =
        flags.iso_power_of.empty() ? flags.iso_power : load_cluster_config(flags.iso_power_of).total_power();
  }
  SF_CHECK(modes == 1, "sim search: give exactly one of --rate, --iso-cost/--iso-cost-of, --iso-power/--iso-power-of");
  SF_CHECK(flags.iso_cost_of.empty() || !flags.iso_cost_given, "sim search: --iso-cost and --iso-cost-of conflict");
  SF_CHECK(flags.iso_power_of.empty() || !flags.iso_power_given, "sim search: --iso-power and --iso-power-of conflict");

  const PerfModel perf_model = flags.workload.load_perf_model();
  const std::vector<Request> trace = load_trace(flags.workload.trace);
  const std::string dir = prepare_out_dir(flags.workload.out_dir);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };

  if (flags.rate_given) {
    SF_CHECK(std::isfinite(flags.rate) && flags.rate > 0, "--rate must be positive requests per second, got {}",
             flags.rate);
    TargetSearchOptions options = flags.limits;
    options.threads = flags.workload.threads;
    const Workload workload = poisson_workload_from(trace, flags.rate, flags.workload.duration_s,
                                                    flags.workload.seed, trace_name(flags.workload.trace));
    const TargetSearchResult result = search_target_rate(base, perf_model, designs, workload, options);
    fmt::print("workload: {} ({} requests); searched in {:.1f} s\n", workload.description, workload.requests.size(),
               elapsed());
    fmt::print("{}", format_target_search(result, flags.rate));
    if (dir.empty()) return;
    write_search_csv(out_path(dir, "design_space.csv"), result.points);
    nlohmann::json pareto = nlohmann::json::array();
    for (int i : result.pareto) pareto.push_back(search_point_json(result.points[i]));
    write_json(out_path(dir, "design_space.json"),
               {{"workload", workload.description},
                {"rate_per_s", flags.rate},
                {"shapes", result.points.size()},
                {"min_cost", result.min_cost >= 0 ? search_point_json(result.points[result.min_cost]) : nullptr},
                {"min_power", result.min_power >= 0 ? search_point_json(result.points[result.min_power]) : nullptr},
                {"pareto", pareto},
                {"wall_s", elapsed()},
                {"provenance", provenance()}});
    for (const Design& design : designs) {
      if (!design.splitwise()) continue;
      // The star marks this design's cheapest shape meeting the SLOs.
      const SearchPoint* cheapest = nullptr;
      for (const SearchPoint& p : result.points)
        if (p.slos_met && p.design.name() == design.name() && (cheapest == nullptr || p.cost < cheapest->cost))
          cheapest = &p;
      std::string stem = "design_space_" + design.prompt_type + "_" + design.token_type;
      report_plot(plot_design_space(dir, "design_space.csv", design, flags.rate, cheapest, stem));
    }
    fmt::print(stderr, "wrote {}/design_space.csv, design_space.json\n", dir);
    return;
  }

  budget.rates = parse_rates(flags.rates);
  const BudgetSearchResult result =
      search_budget(base, perf_model, designs, poisson_at(trace, flags.workload), budget);
  fmt::print("workload: Poisson, {} s per rate, lengths from {} (seed {}); searched in {:.1f} s\n",
             flags.workload.duration_s, trace_name(flags.workload.trace), flags.workload.seed, elapsed());
  fmt::print("{}", format_budget_search(result, budget));
  if (dir.empty()) return;
  const std::string kind = budget.kind == BudgetKind::Cost ? "cost" : "power";
  write_search_csv(out_path(dir, "iso_" + kind + ".csv"), result.points);
  nlohmann::json best = nlohmann::json::array();
  for (int i : result.best_per_design)
    if (i >= 0) best.push_back(search_point_json(result.points[i]));
  write_json(out_path(dir, "iso_" + kind + ".json"),
             {{"budget_kind", kind},
              {"budget", budget.budget},
              {"rates", budget.rates},
              {"duration_s", flags.workload.duration_s},
              {"best_per_design", best},
              {"optimum", result.best >= 0 ? search_point_json(result.points[result.best]) : nullptr},
              {"wall_s", elapsed()},
              {"provenance", provenance()}});
  fmt::print(stderr, "wrote {}/iso_{}.csv, iso_{}.json\n", dir, kind, kind);
}

// ---- scale ----

struct ScaleFlags {
  WorkloadFlags workload;
  std::vector<std::string> configs;
  std::string machines = "10,100,1000,10000";
  double load = 10;  // × the trace's mean rate for the config's own machine count
};

// The config with its pools scaled to `machines` in the same proportions (largest remainders).
ClusterConfig scaled(const ClusterConfig& config, int machines) {
  ClusterConfig result = config;
  const int total = config.total_machines();
  int assigned = 0;
  for (PoolConfig& pool : result.pools) {
    pool.count = static_cast<int>(std::floor(static_cast<double>(machines) * pool.count / total));
    assigned += pool.count;
  }
  for (size_t i = 0; assigned < machines; i = (i + 1) % result.pools.size(), ++assigned) ++result.pools[i].count;
  result.name = fmt::format("{} scaled to {}", config.name, machines);
  return result;
}

// Runs `measure` in a child process, so each row's peak RSS is its own run's, not the largest so
// far; the child sends its row back as JSON through a pipe.
nlohmann::json in_child_process(const std::function<nlohmann::json()>& measure) {
  int fds[2];
  SF_CHECK(::pipe(fds) == 0, "sim scale: pipe failed");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  SF_CHECK(pid >= 0, "sim scale: fork failed");
  if (pid == 0) {
    ::close(fds[0]);
    std::string text;
    int status = 0;
    try {
      text = measure().dump();
    } catch (const std::exception& e) {
      text = nlohmann::json{{"error", e.what()}}.dump();
      status = 1;
    }
    for (size_t done = 0; done < text.size();) {
      const ssize_t n = ::write(fds[1], text.data() + done, text.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::_exit(status);
  }
  ::close(fds[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  rusage usage{};
  ::wait4(pid, &status, 0, &usage);
  nlohmann::json row = text.empty() ? nlohmann::json{{"error", "the measuring process died"}} : nlohmann::json::parse(text);
  SF_CHECK(!row.contains("error"), "sim scale: {}", row.value("error", std::string()));
  row["peak_rss_mib"] = static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
  return row;
}

void run_sim_scale(const ScaleFlags& flags) {
  check_workload_flags(flags.workload);
  SF_CHECK(std::isfinite(flags.load) && flags.load > 0, "--load must be positive, got {}", flags.load);
  std::vector<int> sizes;
  for (double size : parse_rates(flags.machines)) {
    SF_CHECK(size == std::floor(size) && size <= 1e6, "--machines: '{}' is not a whole number of machines", size);
    sizes.push_back(static_cast<int>(size));
  }
  const PerfModel perf_model = flags.workload.load_perf_model();
  const std::vector<Request> trace = load_trace(flags.workload.trace);
  const double trace_rate = static_cast<double>(trace.size()) / trace.back().arrival_s;
  fmt::print("scale: Poisson for {} s at {}x the trace's rate ({:.3f} req/s) per config-sized cluster, "
             "proportionally more for larger ones; one thread\n",
             flags.workload.duration_s, flags.load, trace_rate);
  fmt::print("{:<40} {:>9} {:>10} {:>10} {:>11} {:>9} {:>10} {:>10}\n", "config", "machines", "rate/s", "requests",
             "events", "wall (s)", "M ev/s", "peak MiB");
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& path : flags.configs) {
    const ClusterConfig config = load_cluster_config(path);
    for (int machines : sizes) {
      const double rate = flags.load * trace_rate * machines / config.total_machines();
      const nlohmann::json row = in_child_process([&] {
        const ClusterConfig cluster = scaled(config, machines);
        const Workload workload = poisson_workload_from(trace, rate, flags.workload.duration_s, flags.workload.seed,
                                                        trace_name(flags.workload.trace));
        const auto start = std::chrono::steady_clock::now();
        const SimulationResult result = Simulation(cluster, perf_model, workload.requests).run();
        const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return nlohmann::json{{"config", path}, {"machines", machines}, {"rate_per_s", rate},
                              {"requests", workload.requests.size()}, {"events", result.events},
                              {"wall_s", wall_s}, {"events_per_s", result.events / wall_s}};
      });
      fmt::print("{:<40} {:>9} {:>10.1f} {:>10} {:>11} {:>9.3f} {:>10.2f} {:>10.0f}\n", config.name.substr(0, 40),
                 machines, rate, row["requests"].get<int64_t>(), row["events"].get<int64_t>(),
                 row["wall_s"].get<double>(), row["events_per_s"].get<double>() / 1e6, row["peak_rss_mib"].get<double>());
      rows.push_back(row);
    }
  }
  const std::string dir = prepare_out_dir(flags.workload.out_dir);
  if (dir.empty()) return;
  write_json(out_path(dir, "scale.json"),
             {{"workload", fmt::format("Poisson for {} s at {}x the trace rate per config-sized cluster (trace {})",
                                       flags.workload.duration_s, flags.load, trace_name(flags.workload.trace))},
              {"rows", rows},
              {"note", "each row runs in its own process; peak_rss_mib includes the loaded trace and perf model"},
              {"provenance", provenance()}});
  fmt::print(stderr, "wrote {}/scale.json\n", dir);
}

}  // namespace

void register_sim(CLI::App& app) {
  CLI::App* sim = app.add_subcommand("sim", "cluster simulator: Splitwise and baseline designs on request traces");
  sim->require_subcommand(1);

  auto run_flags = std::make_shared<RunFlags>();
  CLI::App* run = sim->add_subcommand("run", "simulate one cluster config on a trace replay or Poisson workload");
  run->add_option("--config", run_flags->config, "cluster config JSON (sim/configs/)")->required();
  CLI::Option* run_rate = run->add_option("--rate", run_flags->rate, "Poisson arrivals at this many req/s (lengths from --trace); "
                                             "without it the trace is replayed");
  run->add_option("--rate-scale", run_flags->rate_scale, "replay the trace this many times faster")
      ->capture_default_str();
  add_workload_flags(*run, run_flags->workload, 600);
  run->callback([run_flags, run_rate] {
    run_flags->rate_given = run_rate->count() > 0;
    run_sim_run(*run_flags);
  });

  auto sweep_flags = std::make_shared<SweepFlags>();
  CLI::App* sweep = sim->add_subcommand("sweep", "slowdown vs request rate for one or more cluster configs");
  sweep->add_option("--config", sweep_flags->configs, "cluster config JSON (repeat for several)")->required();
  sweep->add_option("--rates", sweep_flags->rates, "first:last:step or a comma-separated list, req/s")
      ->capture_default_str();
  add_workload_flags(*sweep, sweep_flags->workload, 600);
  add_threads_flag(*sweep, sweep_flags->workload);
  sweep->callback([sweep_flags] { run_sim_sweep(*sweep_flags); });

  auto search_flags = std::make_shared<SearchFlags>();
  CLI::App* search = sim->add_subcommand(
      "search", "design search: prompt/token machine counts and types for a target rate or within a budget");
  search->add_option("--config", search_flags->config,
                     "base cluster config: model, machine types, limits, link and SLOs")->required();
  search->add_option("--design", search_flags->designs,
                     "baseline:TYPE or splitwise:PROMPT_TYPE/TOKEN_TYPE (repeat; default: all)");
  CLI::Option* search_rate = search->add_option("--rate", search_flags->rate,
                                                "target request rate: find the cheapest / least-power shapes");
  CLI::Option* iso_cost =
      search->add_option("--iso-cost", search_flags->iso_cost, "cost budget: find the most throughput within it");
  CLI::Option* iso_power =
      search->add_option("--iso-power", search_flags->iso_power, "power budget: find the most throughput within it");
  search->add_option("--iso-cost-of", search_flags->iso_cost_of, "cost budget = this cluster config's cost");
  search->add_option("--iso-power-of", search_flags->iso_power_of, "power budget = this cluster config's power");
  search->add_option("--rates", search_flags->rates, "candidate rates for the budget search")->capture_default_str();
  search->add_option("--max-prompt", search_flags->limits.max_prompt_machines, "largest prompt pool tried")
      ->capture_default_str();
  search->add_option("--max-token", search_flags->limits.max_token_machines, "largest token pool tried")
      ->capture_default_str();
  search->add_option("--max-baseline", search_flags->limits.max_baseline_machines, "largest baseline cluster tried")
      ->capture_default_str();
  add_workload_flags(*search, search_flags->workload, 120);
  add_threads_flag(*search, search_flags->workload);
  search->callback([search_flags, search_rate, iso_cost, iso_power] {
    search_flags->rate_given = search_rate->count() > 0;
    search_flags->iso_cost_given = iso_cost->count() > 0;
    search_flags->iso_power_given = iso_power->count() > 0;
    run_sim_search(*search_flags);
  });

  auto scale_flags = std::make_shared<ScaleFlags>();
  CLI::App* scale = sim->add_subcommand("scale", "simulation time, events/s and peak memory vs cluster size");
  scale->add_option("--config", scale_flags->configs, "cluster config JSON to scale (repeat for several)")
      ->required();
  scale->add_option("--machines", scale_flags->machines, "cluster sizes, comma-separated")->capture_default_str();
  scale->add_option("--load", scale_flags->load, "request rate as a multiple of the trace's mean rate, for a cluster "
                                                 "of the config's own size; scaled with the machine count")
      ->capture_default_str();
  add_workload_flags(*scale, scale_flags->workload, 60);
  scale->callback([scale_flags] { run_sim_scale(*scale_flags); });
}

}  // namespace splitflow::cli
