#include "sim/search.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>

#include "core/error.h"

namespace splitflow::sim {

namespace {

// Runs body(i) for i in [0, count) on `threads` threads. Each body stores its own result, so the
// outcome never depends on the thread count; the first error is rethrown after the loop.
void parallel_for(size_t count, int threads, const std::function<void(size_t)>& body) {
  SF_CHECK(threads > 0, "threads must be positive, got {}", threads);
  std::vector<std::string> errors(count);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (size_t i = 0; i < count; ++i) {
    try {
      body(i);
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  }
  for (const std::string& error : errors)
    if (!error.empty()) fail("{}", error);
}

double price(const MachineType& type, BudgetKind kind) { return kind == BudgetKind::Cost ? type.cost : type.power; }

const char* budget_name(BudgetKind kind) { return kind == BudgetKind::Cost ? "cost" : "power"; }

std::string shape_text(const SearchPoint& p) {
  return p.design.splitwise() ? fmt::format("{} P + {} T", p.shape.prompt_machines, p.shape.token_machines)
                              : fmt::format("{} mixed", p.shape.prompt_machines);
}

SearchPoint make_point(const ClusterConfig& base, const Design& design, Shape shape) {
  const ClusterConfig config = make_cluster(base, design, shape);
  SearchPoint point;
  point.design = design;
  point.shape = shape;
  point.cost = config.total_cost();
  point.power = config.total_power();
  return point;
}

int machines(const SearchPoint& p) { return p.shape.prompt_machines + p.shape.token_machines; }

// Costs and powers are sums of per-machine constants, so equal clusters can differ in the last bit
// (24 × 4.76 + 3 × 4.76 vs 25 × 4.76 + 2 × 4.76): compare them with a relative tolerance.
int compare(double a, double b) {
  const double tolerance = 1e-9 * std::max(std::abs(a), std::abs(b));
  return a < b - tolerance ? -1 : a > b + tolerance ? 1 : 0;
}

// Cheaper (or lower-power with by_cost false), then the other measure, then fewer machines.
bool preferred(const SearchPoint& a, const SearchPoint& b, bool by_cost) {
  const int first = by_cost ? compare(a.cost, b.cost) : compare(a.power, b.power);
  if (first != 0) return first < 0;
  const int second = by_cost ? compare(a.power, b.power) : compare(a.cost, b.cost);
  if (second != 0) return second < 0;
  return machines(a) < machines(b);
}

}  // namespace

Evaluation evaluate(const ClusterConfig& config, const PerfModel& perf_model, const Workload& workload,
                    const EvaluateOptions& options) {
  SimulationOptions sim_options;
  std::optional<SloFailureDetector> detector;
  if (options.stop_when_slos_fail && !workload.requests.empty()) {
    detector.emplace(static_cast<int64_t>(workload.requests.size()), reference_curves(config, perf_model),
                     config.slo);
    sim_options.stop_when = [&detector](const RequestResult& r) { return detector->observe(r); };
  }
  const auto start = std::chrono::steady_clock::now();
  Simulation simulation(config, perf_model, workload.requests, sim_options);
  SimulationResult result = simulation.run();
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  RunSummary summary = summarize(config, perf_model, workload, result, wall_s);
  return {std::move(summary), std::move(result)};
}

std::vector<double> parse_rates(const std::string& text) {
  auto number = [&](const std::string& part) {
    size_t used = 0;
    double value = 0;
    try {
      value = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SF_CHECK(used == part.size() && !part.empty() && std::isfinite(value) && value > 0,
             "rates '{}': '{}' is not a positive number of requests per second", text, part);
    return value;
  };
  std::vector<double> rates;
  if (text.find(':') != std::string::npos) {
    const size_t a = text.find(':'), b = text.find(':', a + 1);
    SF_CHECK(b != std::string::npos && text.find(':', b + 1) == std::string::npos,
             "rates '{}': expected first:last:step or a comma-separated list", text);
    const double first = number(text.substr(0, a)), last = number(text.substr(a + 1, b - a - 1));
    const double step = number(text.substr(b + 1));
    SF_CHECK(last >= first, "rates '{}': last rate is below the first", text);
    SF_CHECK((last - first) / step < 10000, "rates '{}': more than 10,000 rates", text);
    for (int i = 0; first + i * step <= last * (1 + 1e-12); ++i) rates.push_back(first + i * step);
  } else {
    size_t begin = 0;
    while (begin <= text.size()) {
      const size_t end = std::min(text.find(',', begin), text.size());
      rates.push_back(number(text.substr(begin, end - begin)));
      begin = end + 1;
    }
    for (size_t i = 1; i < rates.size(); ++i)
      SF_CHECK(rates[i] > rates[i - 1], "rates '{}': rates must be ascending", text);
  }
  return rates;
}

int highest_passing(size_t count, const std::function<bool(size_t)>& passes) {
  int lo = -1, hi = static_cast<int>(count);  // invariant: lo passes (or -1), hi fails (or count)
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (passes(static_cast<size_t>(mid))) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

std::vector<SweepRow> sweep_rates(const std::vector<ClusterConfig>& configs, const PerfModel& perf_model,
                                  const std::vector<double>& rates, const WorkloadAtRate& workload_at, int threads) {
  std::vector<SweepRow> rows(configs.size() * rates.size());
  parallel_for(rows.size(), threads, [&](size_t i) {
    const ClusterConfig& config = configs[i / rates.size()];
    const double rate = rates[i % rates.size()];
    rows[i] = SweepRow{config.name, rate, evaluate(config, perf_model, workload_at(rate)).summary};
  });
  return rows;
}

double max_rate_meeting_slos(const std::vector<SweepRow>& rows, const std::string& design) {
  std::vector<const SweepRow*> mine;
  for (const SweepRow& row : rows)
    if (row.design == design) mine.push_back(&row);
  std::sort(mine.begin(), mine.end(), [](const SweepRow* a, const SweepRow* b) { return a->rate_per_s < b->rate_per_s; });
  double best = 0;
  for (const SweepRow* row : mine) {
    if (!row->summary.slos_met) break;
    best = row->rate_per_s;
  }
  return best;
}

void write_sweep_csv(const std::string& path, const std::vector<SweepRow>& rows) {
  std::ofstream out(path);
  SF_CHECK(out, "cannot write '{}'", path);
  out << "design,rate_per_s,throughput_per_s,slos_met,cost,power";
  for (const char* metric : {"ttft", "tbt", "e2e"})
    for (const char* q : {"p50", "p90", "p99"}) out << "," << metric << "_" << q << "_s";
  for (const char* metric : {"ttft", "tbt", "e2e"})
    for (const char* q : {"p50", "p90", "p99"}) out << "," << metric << "_" << q << "_slowdown";
  out << "\n";
  for (const SweepRow& row : rows) {
    const RunSummary& s = row.summary;
    out << fmt::format("{},{},{:.6g},{},{:.6g},{:.6g}", csv_text(row.design), row.rate_per_s, s.throughput_per_s,
                       s.slos_met ? 1 : 0, s.cost, s.power);
    for (const Percentiles& p : {s.ttft_s, s.tbt_s, s.e2e_s}) out << fmt::format(",{:.6g},{:.6g},{:.6g}", p.p50, p.p90, p.p99);
    for (const SloCheck& check : s.slo.checks) out << fmt::format(",{:.6g}", check.slowdown);
    out << "\n";
  }
  SF_CHECK(out.good(), "error writing '{}'", path);
}

std::string format_sweep(const std::vector<SweepRow>& rows) {
  std::string text;
  std::string design;
  for (const SweepRow& row : rows) {
    const RunSummary& s = row.summary;
    if (row.design != design) {
      design = row.design;
      text += fmt::format("\n{} (cost {:.2f}, power {:.1f})\n", design, s.cost, s.power);
      text += fmt::format("{:>7} {:>9} | {:>22} | {:>22} | {:>22} | {}\n", "rate", "thr/s", "TTFT slowdown p50/90/99",
                          "TBT slowdown p50/90/99", "E2E slowdown p50/90/99", "SLOs");
    }
    const auto& c = s.slo.checks;
    text += fmt::format("{:>7.1f} {:>9.2f} | {:>6.2f} {:>7.2f} {:>7.2f} | {:>6.2f} {:>7.2f} {:>7.2f} | {:>6.2f} {:>7.2f} "
                        "{:>7.2f} | {}\n",
                        row.rate_per_s, s.throughput_per_s, c[0].slowdown, c[1].slowdown, c[2].slowdown,
                        c[3].slowdown, c[4].slowdown, c[5].slowdown, c[6].slowdown, c[7].slowdown, c[8].slowdown,
                        s.slos_met ? "met" : "missed");
  }
  return text;
}

std::string Design::name() const {
  return splitwise() ? fmt::format("splitwise {}/{}", prompt_type, token_type) : fmt::format("baseline {}", prompt_type);
}

Design parse_design(const std::string& text, const ClusterConfig& base) {
  const size_t colon = text.find(':');
  SF_CHECK(colon != std::string::npos, "design '{}': expected baseline:TYPE or splitwise:PROMPT_TYPE/TOKEN_TYPE", text);
  const std::string kind = text.substr(0, colon), types = text.substr(colon + 1);
  Design design;
  if (kind == "baseline") {
    design.prompt_type = types;
  } else if (kind == "splitwise") {
    const size_t slash = types.find('/');
    SF_CHECK(slash != std::string::npos, "design '{}': expected splitwise:PROMPT_TYPE/TOKEN_TYPE", text);
    design.prompt_type = types.substr(0, slash);
    design.token_type = types.substr(slash + 1);
    SF_CHECK(!design.token_type.empty(), "design '{}': empty token machine type", text);
  } else {
    fail("design '{}': kind '{}' is not baseline or splitwise", text, kind);
  }
  for (const std::string& type : {design.prompt_type, design.token_type})
    if (!type.empty()) base.machine_type(type);  // fails naming the unknown type
  return design;
}

std::vector<Design> all_designs(const ClusterConfig& base) {
  std::vector<Design> designs;
  for (const MachineType& type : base.machine_types) designs.push_back(Design{type.name, ""});
  for (const MachineType& prompt : base.machine_types)
    for (const MachineType& token : base.machine_types) designs.push_back(Design{prompt.name, token.name});
  return designs;
}

ClusterConfig make_cluster(const ClusterConfig& base, const Design& design, Shape shape) {
  auto tensor_parallel = [&](const std::string& type) {
    for (const PoolConfig& pool : base.pools)
      if (pool.machine_type == type) return pool.tensor_parallel;
    return base.machine_type(type).num_gpus;
  };
  ClusterConfig config = base;
  config.pools.clear();
  if (design.splitwise()) {
    SF_CHECK(shape.prompt_machines > 0 && shape.token_machines > 0,
             "design {}: needs at least one prompt and one token machine, got {} and {}", design.name(),
             shape.prompt_machines, shape.token_machines);
    config.pools.push_back({design.prompt_type, InstanceRole::Prompt, shape.prompt_machines,
                            tensor_parallel(design.prompt_type)});
    config.pools.push_back({design.token_type, InstanceRole::Token, shape.token_machines,
                            tensor_parallel(design.token_type)});
    config.scheduler.kind = SchedulerKind::MixedPool;
    config.name = fmt::format("{} {}P+{}T", design.name(), shape.prompt_machines, shape.token_machines);
  } else {
    SF_CHECK(shape.prompt_machines > 0 && shape.token_machines == 0,
             "design {}: needs a positive machine count and no token pool", design.name());
    config.pools.push_back({design.prompt_type, InstanceRole::Mixed, shape.prompt_machines,
                            tensor_parallel(design.prompt_type)});
    config.scheduler.kind = SchedulerKind::TokenJsq;
    config.name = fmt::format("{} x{}", design.name(), shape.prompt_machines);
  }
  return config;
}

TargetSearchResult search_target_rate(const ClusterConfig& base, const PerfModel& perf_model,
                                      const std::vector<Design>& designs, const Workload& workload,
                                      const TargetSearchOptions& options) {
  SF_CHECK(options.max_prompt_machines > 0 && options.max_token_machines > 0 && options.max_baseline_machines > 0,
           "design search: machine-count limits must be positive");
  TargetSearchResult result;
  for (const Design& design : designs) {
    if (design.splitwise()) {
      for (int p = 1; p <= options.max_prompt_machines; ++p)
        for (int t = 1; t <= options.max_token_machines; ++t) result.points.push_back(make_point(base, design, {p, t}));
    } else {
      for (int n = 1; n <= options.max_baseline_machines; ++n)
        result.points.push_back(make_point(base, design, {n, 0}));
    }
  }
  const double target_rate = workload.duration_s > 0 ? static_cast<double>(workload.requests.size()) / workload.duration_s : 0;
  parallel_for(result.points.size(), options.threads, [&](size_t i) {
    SearchPoint& point = result.points[i];
    point.rate_per_s = target_rate;
    try {
      const RunSummary summary =
          evaluate(make_cluster(base, point.design, point.shape), perf_model, workload, {.stop_when_slos_fail = true})
              .summary;
      point.slos_met = summary.slos_met;
      point.throughput_per_s = summary.throughput_per_s;
    } catch (const Error& e) {
      point.error = e.what();
    }
  });

  auto better = [&](int a, int b, bool by_cost) { return preferred(result.points[a], result.points[b], by_cost); };
  std::vector<int> passing;
  for (int i = 0; i < static_cast<int>(result.points.size()); ++i)
    if (result.points[i].slos_met) passing.push_back(i);
  for (int i : passing) {
    if (result.min_cost < 0 || better(i, result.min_cost, true)) result.min_cost = i;
    if (result.min_power < 0 || better(i, result.min_power, false)) result.min_power = i;
  }
  // Pareto front in (cost, power): sorted by cost (then power), keep each point whose power is
  // strictly below every cheaper point's.
  std::vector<int> by_cost = passing;
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](int a, int b) { return better(a, b, true); });
  for (int i : by_cost)
    if (result.pareto.empty() || compare(result.points[i].power, result.points[result.pareto.back()].power) < 0)
      result.pareto.push_back(i);
  return result;
}

std::vector<Shape> budget_shapes(const ClusterConfig& base, const Design& design, BudgetKind kind, double budget) {
  SF_CHECK(std::isfinite(budget) && budget > 0, "{} budget must be positive, got {}", budget_name(kind), budget);
  const double limit = budget * (1 + 1e-9);
  const double prompt_price = price(base.machine_type(design.prompt_type), kind);
  SF_CHECK(prompt_price > 0, "machine type '{}' has no {}: a {} budget cannot bound it", design.prompt_type,
           budget_name(kind), budget_name(kind));
  std::vector<Shape> shapes;
  if (!design.splitwise()) {
    const int n = static_cast<int>(std::floor(limit / prompt_price));
    if (n > 0) shapes.push_back({n, 0});
    return shapes;
  }
  const double token_price = price(base.machine_type(design.token_type), kind);
  SF_CHECK(token_price > 0, "machine type '{}' has no {}: a {} budget cannot bound it", design.token_type,
           budget_name(kind), budget_name(kind));
  for (int p = 1; p * prompt_price <= limit; ++p) {
    const int t = static_cast<int>(std::floor((limit - p * prompt_price) / token_price));
    if (t > 0) shapes.push_back({p, t});
  }
  return shapes;
}

BudgetSearchResult search_budget(const ClusterConfig& base, const PerfModel& perf_model,
                                 const std::vector<Design>& designs, const WorkloadAtRate& workload_at,
                                 const BudgetSearchOptions& options) {
  SF_CHECK(!options.rates.empty(), "budget search: no rates to try");
  BudgetSearchResult result;
  result.designs = designs;
  std::vector<size_t> design_of;
  for (size_t d = 0; d < designs.size(); ++d)
    for (Shape shape : budget_shapes(base, designs[d], options.kind, options.budget)) {
      result.points.push_back(make_point(base, designs[d], shape));
      design_of.push_back(d);
    }
  parallel_for(result.points.size(), options.threads, [&](size_t i) {
    SearchPoint& point = result.points[i];
    const ClusterConfig config = make_cluster(base, point.design, point.shape);
    std::map<size_t, double> throughput;
    try {
      const int best = highest_passing(options.rates.size(), [&](size_t r) {
        const RunSummary summary =
            evaluate(config, perf_model, workload_at(options.rates[r]), {.stop_when_slos_fail = true}).summary;
        throughput[r] = summary.throughput_per_s;
        return summary.slos_met;
      });
      if (best >= 0) {
        point.slos_met = true;
        point.rate_per_s = options.rates[best];
        point.throughput_per_s = throughput[best];
      }
    } catch (const Error& e) {
      point.error = e.what();
    }
  });

  auto better = [&](int a, int b) {
    const SearchPoint &pa = result.points[a], &pb = result.points[b];
    if (pa.rate_per_s != pb.rate_per_s) return pa.rate_per_s > pb.rate_per_s;
    if (pa.throughput_per_s != pb.throughput_per_s) return pa.throughput_per_s > pb.throughput_per_s;
    return preferred(pa, pb, true);
  };
  result.best_per_design.assign(designs.size(), -1);
  for (int i = 0; i < static_cast<int>(result.points.size()); ++i) {
    if (!result.points[i].slos_met) continue;
    int& best = result.best_per_design[design_of[i]];
    if (best < 0 || better(i, best)) best = i;
    if (result.best < 0 || better(i, result.best)) result.best = i;
  }
  return result;
}

void write_search_csv(const std::string& path, const std::vector<SearchPoint>& points) {
  std::ofstream out(path);
  SF_CHECK(out, "cannot write '{}'", path);
  out << "design,prompt_machines,token_machines,cost,power,rate_per_s,slos_met,throughput_per_s,error\n";
  for (const SearchPoint& p : points) {
    out << fmt::format("{},{},{},{:.6g},{:.6g},{:.6g},{},{:.6g},{}\n", csv_text(p.design.name()),
                       p.shape.prompt_machines, p.shape.token_machines, p.cost, p.power, p.rate_per_s,
                       p.slos_met ? 1 : 0, p.throughput_per_s, csv_text(p.error));
  }
  SF_CHECK(out.good(), "error writing '{}'", path);
}

nlohmann::json search_point_json(const SearchPoint& p) {
  return {{"design", p.design.name()},    {"prompt_machines", p.shape.prompt_machines},
          {"token_machines", p.shape.token_machines}, {"cost", p.cost},
          {"power", p.power},             {"rate_per_s", p.rate_per_s},
          {"slos_met", p.slos_met},       {"throughput_per_s", p.throughput_per_s}};
}

std::string format_target_search(const TargetSearchResult& result, double rate_per_s) {
  std::string text;
  const auto passing = std::count_if(result.points.begin(), result.points.end(), [](auto& p) { return p.slos_met; });
  const auto errors = std::count_if(result.points.begin(), result.points.end(), [](auto& p) { return !p.error.empty(); });
  text += fmt::format("design search at {} req/s: {} shapes simulated, {} meet all nine SLOs{}\n", rate_per_s,
                      result.points.size(), passing,
                      errors ? fmt::format(" ({} could not finish; see the CSV)", errors) : "");
  auto row = [](const SearchPoint& p) {
    return fmt::format("{:<36} {:>14} {:>9.2f} {:>9.1f} {:>12.2f}\n", p.design.name(), shape_text(p), p.cost, p.power,
                       p.throughput_per_s);
  };
  const std::string header =
      fmt::format("{:<36} {:>14} {:>9} {:>9} {:>12}\n", "design", "machines", "cost", "power", "throughput/s");
  if (result.min_cost < 0) return text + "no shape within the limits meets all SLOs\n";
  // Shapes as good on both measures (e.g. every 23-machine split of a homogeneous design).
  auto ties = [&](int best) {
    const auto count = std::count_if(result.points.begin(), result.points.end(), [&](const SearchPoint& p) {
      return p.slos_met && compare(p.cost, result.points[best].cost) == 0 &&
             compare(p.power, result.points[best].power) == 0;
    });
    return count > 1 ? fmt::format("({} shapes tie on cost and power; listed: the fewest machines, then the first in "
                                   "design and prompt-count order)\n", count)
                     : std::string();
  };
  text += "\noptimum, minimal cost:\n" + header + row(result.points[result.min_cost]) + ties(result.min_cost);
  text += "\noptimum, minimal power:\n" + header + row(result.points[result.min_power]) + ties(result.min_power);
  text += "\ncheapest shape per design:\n" + header;
  std::map<std::string, int> cheapest;
  std::vector<std::string> order;
  for (int i = 0; i < static_cast<int>(result.points.size()); ++i) {
    const SearchPoint& p = result.points[i];
    const std::string name = p.design.name();
    if (!cheapest.count(name)) {
      order.push_back(name);
      cheapest[name] = -1;
    }
    if (!p.slos_met) continue;
    int& best = cheapest[name];
    if (best < 0 || preferred(p, result.points[best], true))
      best = i;
  }
  for (const std::string& name : order)
    text += cheapest[name] >= 0 ? row(result.points[cheapest[name]]) : fmt::format("{:<36} {:>14}\n", name, "none");
  text += "\nPareto front (no other shape is both cheaper and lower-power):\n" + header;
  for (int i : result.pareto) text += row(result.points[i]);
  return text;
}

std::string format_budget_search(const BudgetSearchResult& result, const BudgetSearchOptions& options) {
  std::string text = fmt::format("maximal throughput at iso-{} ({} <= {:.6g}): {} shapes, rates {:g}..{:g} req/s\n",
                                 budget_name(options.kind), budget_name(options.kind), options.budget,
                                 result.points.size(), options.rates.front(), options.rates.back());
  text += fmt::format("{:<36} {:>14} {:>9} {:>9} {:>9} {:>12}\n", "design", "best shape", "max rate", "cost", "power",
                      "throughput/s");
  for (size_t d = 0; d < result.best_per_design.size(); ++d) {
    const int i = result.best_per_design[d];
    if (i < 0) {
      text += fmt::format("{:<36} {:>14}\n", result.designs[d].name(), "none");
      continue;
    }
    const SearchPoint& p = result.points[i];
    text += fmt::format("{:<36} {:>14} {:>9.1f} {:>9.2f} {:>9.1f} {:>12.2f}\n", p.design.name(), shape_text(p),
                        p.rate_per_s, p.cost, p.power, p.throughput_per_s);
  }
  if (result.best >= 0) {
    const SearchPoint& p = result.points[result.best];
    text += fmt::format("optimum: {} with {} ({:.1f} req/s within the SLOs, throughput {:.2f}/s)\n", p.design.name(),
                        shape_text(p), p.rate_per_s, p.throughput_per_s);
  } else {
    text += "no shape meets the SLOs at the lowest rate\n";
  }
  return text;
}

}  // namespace splitflow::sim
