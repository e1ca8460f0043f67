#include "bench/serve.h"

#include "core/error.h"
#include "sim/plots.h"

#include <fmt/format.h>

#ifdef SPLITFLOW_HAS_HTTPLIB
#include <httplib.h>
#endif

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

namespace splitflow::bench {

using nlohmann::json;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace

ServerUrl parse_server_url(const std::string& url) {
  ServerUrl result;
  result.text = url;
  const std::string scheme = "http://";
  SF_CHECK(url.rfind("https://", 0) != 0, "--url '{}': https is not supported; give the server's http:// address", url);
  SF_CHECK(url.rfind(scheme, 0) == 0, "--url '{}': expected http://host[:port][/prefix]", url);
  const std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  if (slash != std::string::npos) {
    result.path_prefix = rest.substr(slash);
    while (!result.path_prefix.empty() && result.path_prefix.back() == '/') result.path_prefix.pop_back();
  }
  size_t colon = authority.rfind(':');
  if (!authority.empty() && authority.front() == '[') {  // [IPv6]:port
    const size_t close = authority.find(']');
    SF_CHECK(close != std::string::npos, "--url '{}': unclosed '[' in the host", url);
    result.host = authority.substr(1, close - 1);
    colon = close + 1 < authority.size() && authority[close + 1] == ':' ? close + 1 : std::string::npos;
    SF_CHECK(close + 1 == authority.size() || colon != std::string::npos, "--url '{}': expected ':' after ']'", url);
  } else {
    result.host = authority.substr(0, colon);
  }
  SF_CHECK(!result.host.empty(), "--url '{}': no host", url);
  if (colon != std::string::npos) {
    const std::string port = authority.substr(colon + 1);
    int value = -1;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    SF_CHECK(!port.empty() && ec == std::errc() && end == port.data() + port.size() && value > 0 && value <= 65535,
             "--url '{}': the port '{}' is not a number in [1, 65535]", url, port);
    result.port = value;
  }
  return result;
}

#ifdef SPLITFLOW_HAS_HTTPLIB

namespace {

void set_timeouts(httplib::Client& client, double timeout_s) {
  const auto whole = static_cast<time_t>(timeout_s);
  const auto micros = static_cast<time_t>((timeout_s - static_cast<double>(whole)) * 1e6);
  client.set_connection_timeout(whole, micros);
  client.set_read_timeout(whole, micros);
  client.set_write_timeout(whole, micros);
}

// The message of an OpenAI error body, else the body itself (shortened).
std::string error_message(const std::string& body) {
  const json value = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (value.is_object() && value.contains("error") && value["error"].is_object() &&
      value["error"].value("message", json()).is_string()) {
    return value["error"]["message"].get<std::string>();
  }
  return body.size() > 200 ? body.substr(0, 200) + "..." : body;
}

}  // namespace

ServerInfo query_server(const ServerUrl& url, double timeout_s) {
  httplib::Client client(url.host, url.port);
  set_timeouts(client, timeout_s);
  const std::string path = url.path_prefix + "/v1/models";
  const httplib::Result result = client.Get(path.c_str());
  SF_CHECK(result, "cannot reach the server at {}: {} (is `splitflow serve` running there?)", url.text,
           httplib::to_string(result.error()));
  SF_CHECK(result->status == 200, "the server at {} answered GET {} with HTTP {}: {}", url.text, path, result->status,
           error_message(result->body));
  const json body = json::parse(result->body, nullptr, /*allow_exceptions=*/false);
  SF_CHECK(body.is_object() && body.contains("data") && body["data"].is_array() && !body["data"].empty() &&
               body["data"][0].is_object() && body["data"][0].value("id", json()).is_string(),
           "the server at {} answered GET {} without a model list: {}", url.text, path, error_message(result->body));
  ServerInfo info;
  info.model = body["data"][0]["id"].get<std::string>();
  const json& max_len = body["data"][0].value("max_model_len", json());
  if (max_len.is_number_integer() && max_len.get<int64_t>() > 0 && max_len.get<int64_t>() <= INT32_MAX) {
    info.max_model_len = max_len.get<int32_t>();
  }
  return info;
}

namespace {

// One /v1/embeddings request of inputs_per_request prompts' ids, answered whole.
RequestRecord send_embedding_request(const ServerUrl& url, const ClientOptions& options, const TimedRequest& request,
                                     double run_start_s, RequestRecord record) {
  record.output_len = 0;
  const int32_t count = options.inputs_per_request;
  json input;
  if (count == 1) {
    input = prompt_token_ids(options.seed, request.index, request.input_len, options.prompt_vocab);
  } else {
    for (int32_t i = 0; i < count; ++i)
      input.push_back(prompt_token_ids(options.seed, request.index * count + i, request.input_len, options.prompt_vocab));
  }
  record.input_len = request.input_len * count;
  json body = {{"model", options.model}, {"input", std::move(input)}};
  if (options.encoding_format != "float") body["encoding_format"] = options.encoding_format;
  httplib::Client client(url.host, url.port);
  set_timeouts(client, options.timeout_s);
  record.send_s = now_s() - run_start_s;
  const httplib::Result result = client.Post((url.path_prefix + "/v1/embeddings").c_str(), body.dump(), "application/json");
  record.end_s = now_s() - run_start_s;
  if (!result) {
    record.error = httplib::to_string(result.error());
  } else if (result->status != 200) {
    record.error = fmt::format("HTTP {}: {}", result->status, error_message(result->body));
  } else {
    const json answer = json::parse(result->body, nullptr, /*allow_exceptions=*/false);
    const bool base64 = options.encoding_format == "base64";
    const auto encoded_as_asked = [&](const json& item) {
      const auto embedding = item.find("embedding");
      return item.is_object() && embedding != item.end() &&
             (base64 ? embedding->is_string() && !embedding->get_ref<const std::string&>().empty()
                     : embedding->is_array() && !embedding->empty());
    };
    if (!answer.is_object() || !answer.contains("data") || !answer["data"].is_array() ||
        answer["data"].size() != static_cast<size_t>(count))
      record.error = fmt::format("the answer is not {} embedding(s): {}", count, result->body.substr(0, 200));
    else if (!std::all_of(answer["data"].begin(), answer["data"].end(), encoded_as_asked))
      record.error = fmt::format("an embedding is not {} as asked: {}", base64 ? "a base64 string" : "a list of floats",
                                 result->body.substr(0, 200));
    else
      record.ok = true;
  }
  record.ttft_s = record.end_s - record.send_s;
  return record;
}

}  // namespace

RequestRecord send_request(const ServerUrl& url, const ClientOptions& options, const TimedRequest& request,
                           double run_start_s) {
  RequestRecord record;
  record.index = request.index;
  record.arrival_s = request.arrival_s;
  record.input_len = request.input_len;
  record.output_len = request.output_len;
  if (options.endpoint == "embeddings") return send_embedding_request(url, options, request, run_start_s, record);
  const json body = {
      {"model", options.model},
      {"prompt", prompt_token_ids(options.seed, request.index, request.input_len, options.prompt_vocab)},
      {"max_tokens", request.output_len},
      {"ignore_eos", true},
      {"temperature", 0},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}},
  };

  httplib::Client client(url.host, url.port);
  set_timeouts(client, options.timeout_s);
  httplib::Request http;
  http.method = "POST";
  http.path = url.path_prefix + "/v1/completions";
  http.set_header("Content-Type", "application/json");
  http.set_header("Accept", "text/event-stream");
  http.body = body.dump();

  int status = 0;
  std::string pending;     // SSE text not yet split into events
  std::string error_body;  // the body of a non-200 answer
  std::string stream_error;
  bool done = false;
  double last_chunk_s = 0;
  http.response_handler = [&](const httplib::Response& response) {
    status = response.status;
    return true;
  };
  // Every event of one read shares its arrival time: they reached the client together.
  http.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    const double time_s = now_s() - run_start_s;
    if (status != 200) {
      error_body.append(data, size);
      return true;
    }
    pending.append(data, size);
    size_t event_end;
    while ((event_end = pending.find("\n\n")) != std::string::npos) {
      const std::string event = pending.substr(0, event_end);
      pending.erase(0, event_end + 2);
      if (event.rfind("data:", 0) != 0) continue;  // comments and other fields
      std::string payload = event.substr(5);
      payload.erase(0, payload.find_first_not_of(' '));
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      const json chunk = json::parse(payload, nullptr, /*allow_exceptions=*/false);
      if (!chunk.is_object()) {
        stream_error = fmt::format("a streamed event is not JSON: {}", payload.substr(0, 200));
        return false;
      }
      if (chunk.contains("error")) {
        stream_error = fmt::format("the server failed mid-stream: {}", error_message(payload));
        continue;
      }
      if (chunk.contains("usage") && chunk["usage"].is_object() &&
          chunk["usage"].value("completion_tokens", json()).is_number_integer()) {
        record.output_tokens = chunk["usage"]["completion_tokens"].get<int64_t>();
      }
      if (chunk.contains("choices") && chunk["choices"].is_array() && !chunk["choices"].empty()) {
        if (record.chunks == 0) {
          record.ttft_s = time_s - record.send_s;
        } else {
          record.itl_s.push_back(time_s - last_chunk_s);
        }
        last_chunk_s = time_s;
        ++record.chunks;
      }
    }
    return true;
  };

  record.send_s = now_s() - run_start_s;
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client.send(http, response, error);
  record.end_s = now_s() - run_start_s;
  if (!stream_error.empty()) {
    record.error = stream_error;
  } else if (!sent) {
    record.error = fmt::format("{} {}", httplib::to_string(error),
                               error == httplib::Error::Read ? fmt::format("(no data for {} s, or the connection closed)",
                                                                           options.timeout_s)
                                                             : "");
  } else if (status != 200) {
    record.error = fmt::format("HTTP {}: {}", status, error_message(error_body));
  } else if (!done) {
    record.error = "the stream ended without [DONE]";
  } else if (record.chunks == 0) {
    record.error = "the stream carried no tokens";
  } else {
    record.ok = true;
    if (record.output_tokens == 0) record.output_tokens = record.chunks;
  }
  return record;
}

std::vector<RequestRecord> run_workload(const ServerUrl& url, const ClientOptions& options, const Workload& workload) {
  SF_CHECK(options.max_concurrency >= 0, "--max-concurrency must not be negative, not {}", options.max_concurrency);
  const size_t count = workload.requests.size();
  std::vector<RequestRecord> records(count);
  std::vector<std::thread> threads;
  threads.reserve(count);
  std::mutex mutex;
  std::condition_variable changed;
  int64_t in_flight = 0, finished = 0;
  bool all_sent = false;

  std::thread progress;
  const auto start = std::chrono::steady_clock::now();
  const double start_s = std::chrono::duration<double>(start.time_since_epoch()).count();
  if (options.progress) {
    progress = std::thread([&] {
      std::unique_lock lock(mutex);
      while (!(all_sent && finished == static_cast<int64_t>(count))) {
        if (changed.wait_for(lock, std::chrono::seconds(10), [&] { return all_sent && finished == static_cast<int64_t>(count); })) {
          break;
        }
        fmt::print(stderr, "  {:.0f} s: {} sent, {} finished, {} in flight\n", now_s() - start_s,
                   finished + in_flight, finished, in_flight);
      }
    });
  }
  for (size_t i = 0; i < count; ++i) {
    const TimedRequest& request = workload.requests[i];
    std::this_thread::sleep_until(
        start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(request.arrival_s)));
    {
      std::unique_lock lock(mutex);
      if (options.max_concurrency > 0) changed.wait(lock, [&] { return in_flight < options.max_concurrency; });
      ++in_flight;
    }
    threads.emplace_back([&, i] {
      records[i] = send_request(url, options, workload.requests[i], start_s);
      {
        std::lock_guard lock(mutex);
        --in_flight;
        ++finished;
      }
      changed.notify_all();
    });
  }
  {
    std::lock_guard lock(mutex);
    all_sent = true;
  }
  for (std::thread& thread : threads) thread.join();
  changed.notify_all();
  if (progress.joinable()) progress.join();
  return records;
}

#else

ServerInfo query_server(const ServerUrl&, double) {
  fail("`splitflow bench serve` needs cpp-httplib, which this build lacks (install libcpp-httplib-dev and reconfigure)");
}
RequestRecord send_request(const ServerUrl&, const ClientOptions&, const TimedRequest&, double) {
  fail("`splitflow bench serve` needs cpp-httplib, which this build lacks (install libcpp-httplib-dev and reconfigure)");
}
std::vector<RequestRecord> run_workload(const ServerUrl&, const ClientOptions&, const Workload&) {
  fail("`splitflow bench serve` needs cpp-httplib, which this build lacks (install libcpp-httplib-dev and reconfigure)");
}

#endif

double percentile(std::vector<double> values, double p) {
  SF_CHECK(p >= 0 && p <= 100, "percentile {} is outside [0, 100]", p);
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(rank));
  const size_t above = std::min(below + 1, values.size() - 1);
  const double weight = rank - static_cast<double>(below);
  return values[below] + weight * (values[above] - values[below]);
}

LatencyStats latency_stats(const std::vector<double>& seconds) {
  LatencyStats stats;
  stats.count = static_cast<int64_t>(seconds.size());
  if (seconds.empty()) return stats;
  std::vector<double> ms(seconds.size());
  double sum = 0;
  for (size_t i = 0; i < seconds.size(); ++i) {
    ms[i] = seconds[i] * 1e3;
    sum += ms[i];
  }
  stats.mean = sum / static_cast<double>(ms.size());
  stats.p50 = percentile(ms, 50);
  stats.p90 = percentile(ms, 90);
  stats.p99 = percentile(ms, 99);
  stats.max = *std::max_element(ms.begin(), ms.end());
  return stats;
}

void check_slo(const SloLimits& slo) {
  SF_CHECK(slo.ttft_ms > 0 && slo.itl_ms > 0, "--slo-ttft-ms and --slo-itl-ms must be positive, not {} and {}",
           slo.ttft_ms, slo.itl_ms);
  SF_CHECK(slo.percentile > 0 && slo.percentile <= 100, "--slo-percentile must be in (0, 100], not {}", slo.percentile);
}

RunSummary summarize(const std::vector<RequestRecord>& records, const SloLimits& slo) {
  check_slo(slo);
  RunSummary summary;
  summary.num_requests = static_cast<int64_t>(records.size());
  std::vector<double> ttft, itl, e2e, tpot;
  std::map<std::string, int64_t> errors;
  for (const RequestRecord& record : records) {
    summary.duration_s = std::max(summary.duration_s, record.end_s);
    summary.max_send_lag_ms = std::max(summary.max_send_lag_ms, (record.send_s - record.arrival_s) * 1e3);
    if (!record.ok) {
      ++summary.num_failed;
      ++errors[record.error];
      continue;
    }
    ++summary.num_completed;
    summary.input_tokens += record.input_len;
    summary.output_tokens += record.output_tokens;
    summary.merged_tokens += std::max<int64_t>(0, record.output_tokens - record.chunks);
    ttft.push_back(record.ttft_s);
    e2e.push_back(record.e2e_s());
    itl.insert(itl.end(), record.itl_s.begin(), record.itl_s.end());
    bool good = record.ttft_s * 1e3 < slo.ttft_ms;
    if (record.output_tokens > 1) {
      const double request_tpot_s = (record.e2e_s() - record.ttft_s) / static_cast<double>(record.output_tokens - 1);
      tpot.push_back(request_tpot_s);
      good = good && request_tpot_s * 1e3 < slo.itl_ms;
    }
    summary.num_good += good ? 1 : 0;
  }
  summary.ttft = latency_stats(ttft);
  summary.itl = latency_stats(itl);
  summary.e2e = latency_stats(e2e);
  summary.tpot = latency_stats(tpot);
  if (summary.duration_s > 0) {
    summary.request_throughput = static_cast<double>(summary.num_completed) / summary.duration_s;
    summary.output_throughput = static_cast<double>(summary.output_tokens) / summary.duration_s;
    summary.total_token_throughput =
        static_cast<double>(summary.input_tokens + summary.output_tokens) / summary.duration_s;
    summary.goodput = static_cast<double>(summary.num_good) / summary.duration_s;
  }
  for (double& value : ttft) value *= 1e3;
  for (double& value : itl) value *= 1e3;
  summary.slo_ttft_ms = ttft.empty() ? 0 : percentile(ttft, slo.percentile);
  summary.slo_itl_ms = itl.empty() ? 0 : percentile(itl, slo.percentile);
  summary.meets_slo = summary.num_failed == 0 && summary.num_completed > 0 && summary.slo_ttft_ms < slo.ttft_ms &&
                      summary.slo_itl_ms < slo.itl_ms;
  for (const auto& [message, count] : errors) {
    if (summary.errors.size() == 5) break;
    summary.errors.push_back(fmt::format("{} x {}", count, message));
  }
  return summary;
}

namespace {

json stats_json(const LatencyStats& stats) {
  return {{"count", stats.count}, {"mean", stats.mean}, {"p50", stats.p50},
          {"p90", stats.p90},     {"p99", stats.p99},   {"max", stats.max}};
}

}  // namespace

json summary_json(const RunSummary& s) {
  return {{"num_requests", s.num_requests},
          {"num_completed", s.num_completed},
          {"num_failed", s.num_failed},
          {"duration_s", s.duration_s},
          {"input_tokens", s.input_tokens},
          {"output_tokens", s.output_tokens},
          {"request_throughput_rps", s.request_throughput},
          {"output_throughput_tps", s.output_throughput},
          {"total_token_throughput_tps", s.total_token_throughput},
          {"ttft_ms", stats_json(s.ttft)},
          {"itl_ms", stats_json(s.itl)},
          {"e2e_ms", stats_json(s.e2e)},
          {"tpot_ms", stats_json(s.tpot)},
          {"num_good", s.num_good},
          {"goodput_rps", s.goodput},
          {"slo_percentile_ttft_ms", s.slo_ttft_ms},
          {"slo_percentile_itl_ms", s.slo_itl_ms},
          {"meets_slo", s.meets_slo},
          {"merged_tokens", s.merged_tokens},
          {"max_send_lag_ms", s.max_send_lag_ms},
          {"errors", s.errors}};
}

json records_json(const std::vector<RequestRecord>& records) {
  json rows = json::array();
  for (const RequestRecord& r : records) {
    rows.push_back({{"index", r.index},
                    {"arrival_s", r.arrival_s},
                    {"send_s", r.send_s},
                    {"end_s", r.end_s},
                    {"input_len", r.input_len},
                    {"output_len", r.output_len},
                    {"ok", r.ok},
                    {"error", r.error},
                    {"ttft_ms", r.ttft_s * 1e3},
                    {"output_tokens", r.output_tokens},
                    {"chunks", r.chunks},
                    {"max_itl_ms", r.itl_s.empty() ? 0.0 : *std::max_element(r.itl_s.begin(), r.itl_s.end()) * 1e3}});
  }
  return rows;
}

void write_sweep_csv(const std::string& path, const std::vector<SweepPoint>& points) {
  std::ofstream out(path);
  SF_CHECK(out, "cannot write '{}'", path);
  out << "rate_rps,num_requests,num_completed,num_failed,duration_s,request_throughput_rps,output_throughput_tps,"
         "goodput_rps,good_fraction,ttft_mean_ms,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,itl_mean_ms,itl_p50_ms,itl_p90_ms,"
         "itl_p99_ms,e2e_mean_ms,e2e_p50_ms,e2e_p90_ms,e2e_p99_ms,tpot_mean_ms,meets_slo\n";
  for (const SweepPoint& point : points) {
    const RunSummary& s = point.summary;
    const double good_fraction = s.num_requests > 0 ? static_cast<double>(s.num_good) / s.num_requests : 0.0;
    out << fmt::format("{},{},{},{},{:.3f},{:.4f},{:.2f},{:.4f},{:.4f},{:.2f},{:.2f},{:.2f},{:.2f},{:.3f},{:.3f},{:.3f},"
                       "{:.3f},{:.2f},{:.2f},{:.2f},{:.2f},{:.3f},{}\n",
                       point.rate_per_s, s.num_requests, s.num_completed, s.num_failed, s.duration_s,
                       s.request_throughput, s.output_throughput, s.goodput, good_fraction, s.ttft.mean, s.ttft.p50,
                       s.ttft.p90, s.ttft.p99, s.itl.mean, s.itl.p50, s.itl.p90, s.itl.p99, s.e2e.mean, s.e2e.p50,
                       s.e2e.p90, s.e2e.p99, s.tpot.mean, s.meets_slo ? 1 : 0);
  }
  SF_CHECK(out.good(), "error writing '{}'", path);
}

double max_rate_meeting_slo(const std::vector<SweepPoint>& points) {
  double best = 0;
  for (const SweepPoint& point : points) {
    if (point.summary.meets_slo) best = std::max(best, point.rate_per_s);
  }
  return best;
}

std::string find_plot_script() {
  const std::string relative = "scripts/plot_latency_vs_rate.gnuplot";
  std::vector<std::filesystem::path> candidates;
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    candidates.push_back(exe.parent_path().parent_path() / relative);
    candidates.push_back(exe.parent_path().parent_path().parent_path() / relative);
  }
  candidates.push_back(std::filesystem::current_path() / relative);
  for (const auto& candidate : candidates) {
    if (std::filesystem::is_regular_file(candidate)) return candidate.lexically_normal().string();
  }
  return "";
}

std::string plot_latency_vs_rate(const std::string& script, const std::string& svg_path, const SloLimits& slo,
                                 const std::vector<PlotSeries>& series) {
  SF_CHECK(!series.empty() && series.size() <= 3, "a latency-vs-rate plot takes 1 to 3 series, not {}", series.size());
  if (script.empty() || !std::filesystem::is_regular_file(script)) {
    return fmt::format("plot skipped: scripts/plot_latency_vs_rate.gnuplot not found{}", script.empty() ? "" : " at " + script);
  }
  const std::string gnuplot = sim::find_program("gnuplot");
  if (gnuplot.empty()) return fmt::format("plot skipped: gnuplot not found on PATH ({} is the plot's table)", series[0].csv_path);
  std::string command = fmt::format("{} -c {} {} {} {}", shell_quote(gnuplot), shell_quote(script), shell_quote(svg_path),
                                    slo.ttft_ms, slo.itl_ms);
  for (const PlotSeries& s : series) command += fmt::format(" {} {}", shell_quote(s.csv_path), shell_quote(s.label));
  command += " 2>&1";
  const int status = std::system(command.c_str());
  if (status != 0 || !std::filesystem::is_regular_file(svg_path)) {
    return fmt::format("plot failed: gnuplot exited with status {} on {}", status, script);
  }
  return fmt::format("plot: {}", svg_path);
}

}  // namespace splitflow::bench
