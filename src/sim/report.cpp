#include "sim/report.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>

#include "core/error.h"

namespace splitflow::sim {

namespace {

constexpr std::array<InstanceRole, 3> kRoles = {InstanceRole::Prompt, InstanceRole::Token, InstanceRole::Mixed};

std::ofstream open_for_writing(const std::string& path) {
  std::ofstream out(path);
  SF_CHECK(out, "cannot write '{}'", path);
  return out;
}

double total(const std::vector<double>& seconds) {
  double sum = 0;
  for (double s : seconds) sum += s;
  return sum;
}

// Time-weighted mean of the histogram's index (batch size or batch tokens).
double weighted_mean(const std::vector<double>& seconds) {
  double sum = 0, weight = 0;
  for (size_t n = 0; n < seconds.size(); ++n) {
    sum += static_cast<double>(n) * seconds[n];
    weight += seconds[n];
  }
  return weight > 0 ? sum / weight : 0;
}

template <typename... Args>
void append_line(std::string& text, fmt::format_string<Args...> format, Args&&... args) {
  text += fmt::format(format, std::forward<Args>(args)...);
  text += '\n';
}

nlohmann::json percentiles_json(const Percentiles& p) { return {{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}}; }

}  // namespace

const char* role_name(InstanceRole role) {
  switch (role) {
    case InstanceRole::Prompt: return "prompt";
    case InstanceRole::Token: return "token";
    case InstanceRole::Mixed: return "mixed";
  }
  return "?";
}

std::string csv_text(std::string text) {
  for (char& c : text) {
    if (c == ',') c = ';';
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

const PerfCurves& reference_curves(const ClusterConfig& config, const PerfModel& perf_model) {
  const PerfKey key{config.model.name, config.slo.reference_hardware, config.slo.reference_tensor_parallel};
  SF_CHECK(perf_model.contains(key),
           "cluster config '{}': the SLO reference (model '{}' on '{}' at TP{}) has no profile in the perf model",
           config.name, key.model, key.hardware, key.tensor_parallel);
  return perf_model.curves(key);
}

RunSummary summarize(const ClusterConfig& config, const PerfModel& perf_model, const Workload& workload,
                     const SimulationResult& result, double wall_s) {
  RunSummary summary;
  summary.design = config.name;
  summary.workload = workload.description;
  summary.machines = config.total_machines();
  summary.cost = config.total_cost();
  summary.power = config.total_power();
  for (const PoolConfig& pool : config.pools) summary.machines_by_pool[static_cast<size_t>(pool.role)] += pool.count;
  summary.requests = static_cast<int64_t>(result.requests.size());
  summary.finished = result.finished_requests;
  summary.stopped_early = result.stopped_early;
  summary.stalled = result.stalled_requests;
  summary.events = result.events;
  summary.wall_s = wall_s;
  summary.end_time_s = result.end_time_s;
  summary.window_start_s = workload.window_start_s();
  summary.window_end_s = workload.window_end_s();
  summary.batch_time = result.batch_time;

  std::vector<RequestResult> finished;
  finished.reserve(result.requests.size());
  for (const RequestResult& r : result.requests)
    if (r.finished) finished.push_back(r);
  if (finished.empty()) return summary;
  std::vector<double> ttft, tbt, e2e;
  for (const RequestResult& r : finished) {
    ttft.push_back(r.ttft_s());
    tbt.push_back(r.tbt_s());
    e2e.push_back(r.e2e_s());
  }
  summary.ttft_s = percentiles(ttft);
  summary.tbt_s = percentiles(tbt);
  summary.e2e_s = percentiles(e2e);
  // A stalled request's latency is unbounded: it enters the SLO percentiles as an infinite slowdown.
  Slowdowns measured = slowdowns(finished, reference_curves(config, perf_model));
  for (int64_t i = 0; i < summary.stalled; ++i)
    for (std::vector<double>* values : {&measured.ttft, &measured.tbt, &measured.e2e}) values->push_back(INFINITY);
  summary.slo = check_slos(measured, config.slo);
  summary.slos_met = !result.stopped_early && summary.stalled == 0 && summary.slo.all_passed();
  if (summary.window_end_s > summary.window_start_s)
    summary.throughput_per_s = throughput_per_s(finished, summary.window_start_s, summary.window_end_s);
  return summary;
}

std::string format_summary(const RunSummary& s, const SloConfig& slo) {
  std::string text;
  append_line(text, "design:     {}", s.design);
  append_line(text, "cluster:    {} machines ({} prompt, {} token, {} mixed); cost {:.2f}, power {:.1f}", s.machines,
       s.machines_by_pool[0], s.machines_by_pool[1], s.machines_by_pool[2], s.cost, s.power);
  append_line(text, "workload:   {}: {} requests", s.workload, s.requests);
  append_line(text, "simulated:  {:.1f} s in {:.3f} s wall ({} events, {:.2f} M events/s){}", s.end_time_s, s.wall_s, s.events,
       s.wall_s > 0 ? s.events / s.wall_s / 1e6 : 0.0,
       s.stopped_early ? fmt::format("; stopped early after {} requests (an SLO could no longer be met)", s.finished)
                       : "");
  if (s.stalled > 0)
    append_line(text, "stalled:    {} requests never finished: their instance filled with queued decodes holding "
                "prompt KV and could start none (KV is reserved in full up front); they fail every SLO", s.stalled);
  append_line(text, "");
  append_line(text, "{:<10} {:>10} {:>10} {:>10}", "latency", "p50", "p90", "p99");
  append_line(text, "{:<10} {:>10.4f} {:>10.4f} {:>10.4f}", "TTFT (s)", s.ttft_s.p50, s.ttft_s.p90, s.ttft_s.p99);
  append_line(text, "{:<10} {:>10.4f} {:>10.4f} {:>10.4f}", "TBT (s)", s.tbt_s.p50, s.tbt_s.p90, s.tbt_s.p99);
  append_line(text, "{:<10} {:>10.4f} {:>10.4f} {:>10.4f}", "E2E (s)", s.e2e_s.p50, s.e2e_s.p90, s.e2e_s.p99);
  append_line(text, "");
  append_line(text, "SLOs (slowdown vs an unloaded {} at TP{}):", slo.reference_hardware, slo.reference_tensor_parallel);
  for (const SloCheck& check : s.slo.checks)
    append_line(text, "  {:<9} {:>9.3f} < {:<5} {}", check.metric, check.slowdown, check.limit, check.passed ? "pass" : "FAIL");
  append_line(text, "all nine SLOs met: {}", s.slos_met ? "yes" : "no");
  append_line(text, "throughput: {:.2f} req/s (completions in [{:.0f}, {:.0f}) s)", s.throughput_per_s, s.window_start_s,
       s.window_end_s);
  append_line(text, "");
  append_line(text, "{:<7} {:>9} {:>12} {:>18} {:>19}", "pool", "machines", "busy (s)", "mean batch size", "mean batch tokens");
  for (InstanceRole role : kRoles) {
    const BatchTime& time = s.batch_time[static_cast<size_t>(role)];
    const int machines = s.machines_by_pool[static_cast<size_t>(role)];
    if (machines == 0 && time.seconds_by_batch_size.empty()) continue;
    append_line(text, "{:<7} {:>9} {:>12.1f} {:>18.2f} {:>19.1f}", role_name(role), machines, total(time.seconds_by_batch_size),
         weighted_mean(time.seconds_by_batch_size), weighted_mean(time.seconds_by_batch_tokens));
  }
  return text;
}

nlohmann::json summary_json(const RunSummary& s, const SloConfig& slo) {
  nlohmann::json slos = nlohmann::json::array();
  for (const SloCheck& check : s.slo.checks)
    slos.push_back({{"metric", check.metric}, {"slowdown", check.slowdown}, {"limit", check.limit},
                    {"passed", check.passed}});
  nlohmann::json pools = nlohmann::json::object();
  for (InstanceRole role : kRoles) {
    const BatchTime& time = s.batch_time[static_cast<size_t>(role)];
    const int machines = s.machines_by_pool[static_cast<size_t>(role)];
    if (machines == 0 && time.seconds_by_batch_size.empty()) continue;
    nlohmann::json by_size = nlohmann::json::array();
    for (size_t n = 0; n < time.seconds_by_batch_size.size(); ++n)
      if (time.seconds_by_batch_size[n] > 0) by_size.push_back({n, time.seconds_by_batch_size[n]});
    pools[role_name(role)] = {{"machines", machines},
                              {"busy_s", total(time.seconds_by_batch_size)},
                              {"mean_batch_size", weighted_mean(time.seconds_by_batch_size)},
                              {"mean_batch_tokens", weighted_mean(time.seconds_by_batch_tokens)},
                              {"seconds_by_batch_size", by_size}};
  }
  return {{"design", s.design},
          {"workload", s.workload},
          {"machines", s.machines},
          {"cost", s.cost},
          {"power", s.power},
          {"requests", s.requests},
          {"finished", s.finished},
          {"stopped_early", s.stopped_early},
          {"stalled", s.stalled},
          {"events", s.events},
          {"wall_s", s.wall_s},
          {"simulated_s", s.end_time_s},
          {"ttft_s", percentiles_json(s.ttft_s)},
          {"tbt_s", percentiles_json(s.tbt_s)},
          {"e2e_s", percentiles_json(s.e2e_s)},
          {"slo_reference", fmt::format("{} TP{}", slo.reference_hardware, slo.reference_tensor_parallel)},
          {"slo_checks", slos},
          {"slos_met", s.slos_met},
          {"throughput_per_s", s.throughput_per_s},
          {"throughput_window_s", {s.window_start_s, s.window_end_s}},
          {"pools", pools}};
}

void write_requests_csv(const std::string& path, const std::vector<RequestResult>& requests,
                        const PerfCurves& reference) {
  std::ofstream out = open_for_writing(path);
  out << "id,arrival_s,prompt_tokens,output_tokens,prompt_instance,token_instance,prompt_start_s,prompt_end_s,"
         "decode_start_s,completion_s,ttft_s,tbt_s,e2e_s,nth_token_overhead_s,ttft_slowdown,tbt_slowdown,"
         "e2e_slowdown\n";
  for (const RequestResult& r : requests) {
    if (!r.finished) continue;  // left when the run stopped early
    const RequestSlowdown s = slowdown(r, reference);
    out << fmt::format("{},{:.9g},{},{},{},{},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.6g},{:.6g},{:.6g}\n",
                       r.id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.prompt_instance, r.token_instance,
                       r.prompt_start_s, r.prompt_end_s, r.decode_start_s, r.completion_s, r.ttft_s(), r.tbt_s(),
                       r.e2e_s(), r.nth_token_overhead_s(), s.ttft, s.tbt, s.e2e);
  }
  SF_CHECK(out.good(), "error writing '{}'", path);
}

void write_batch_time_csv(const std::string& path, const std::array<BatchTime, 3>& batch_time) {
  std::ofstream out = open_for_writing(path);
  out << "pool,measure,value,seconds\n";
  for (InstanceRole role : kRoles) {
    const BatchTime& time = batch_time[static_cast<size_t>(role)];
    for (size_t n = 0; n < time.seconds_by_batch_size.size(); ++n)
      if (time.seconds_by_batch_size[n] > 0)
        out << fmt::format("{},batch_size,{},{:.9g}\n", role_name(role), n, time.seconds_by_batch_size[n]);
    for (size_t x = 0; x < time.seconds_by_batch_tokens.size(); ++x)
      if (time.seconds_by_batch_tokens[x] > 0)
        out << fmt::format("{},batch_tokens,{},{:.9g}\n", role_name(role), x, time.seconds_by_batch_tokens[x]);
  }
  SF_CHECK(out.good(), "error writing '{}'", path);
}

void write_json(const std::string& path, const nlohmann::json& value) {
  std::ofstream out = open_for_writing(path);
  out << value.dump(2) << "\n";
  SF_CHECK(out.good(), "error writing '{}'", path);
}

}  // namespace splitflow::sim
