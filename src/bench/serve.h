// bench/serve.h — `splitflow bench serve`: puts a Workload (bench/workload.h) on a running
// OpenAI-compatible server (`splitflow serve`) as streaming /v1/completions requests, one client
// thread and connection per in-flight request, and measures each request's time to first token,
// inter-token latencies and end-to-end latency; summarizes a run as the nine SLO percentiles
// (TTFT, ITL, E2E x p50, p90, p99), throughput and goodput under an SLO; writes sweeps over
// arrival rates as a CSV table drawn by scripts/plot_latency_vs_rate.gnuplot.
//
// What the client sends: the prompt as token ids (exact lengths, no tokenizer needed, no shared
// prefix), max_tokens = the output length, ignore_eos, temperature 0, stream with usage; or, with
// ClientOptions::endpoint "embeddings", the ids as one /v1/embeddings input.
// Definitions (as vLLM's benchmark_serving): TTFT = first streamed token - request sent;
// ITL = gaps between consecutive streamed chunks (the server sends one chunk per token unless a
// slow reader made it merge several: merged_tokens counts those); TPOT = (E2E - TTFT) /
// (tokens - 1) per request. A request is good when it completed with TTFT < the TTFT limit and
// TPOT < the ITL limit; a run meets the SLO when every request completed and the SLO percentile
// (default p99) of TTFT and of ITL are under their limits.
// The HTTP parts need cpp-httplib (SPLITFLOW_HAS_HTTPLIB); without it they throw saying so.
#pragma once

#include "bench/workload.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace splitflow::bench {

// http://host[:port][/prefix]; the port defaults to 80.
struct ServerUrl {
  std::string host;
  int port = 80;
  std::string path_prefix;  // "" or "/prefix" (no trailing slash), before /v1/...
  std::string text;         // as given
};
// Throws naming the URL and what is wrong with it (scheme, host, port).
ServerUrl parse_server_url(const std::string& url);

struct ServerInfo {
  std::string model;          // the first model /v1/models lists
  int32_t max_model_len = 0;  // 0 when the server does not say
};
// GET /v1/models; throws "cannot reach the server at URL: <why>" when it does not answer.
ServerInfo query_server(const ServerUrl& url, double timeout_s);

struct ClientOptions {
  std::string model;             // "model" field of each request
  int32_t prompt_vocab = 256;    // prompt token ids are drawn from [0, prompt_vocab)
  uint64_t seed = 0;             // prompt token ids
  double timeout_s = 600;        // per request: connect, and the longest wait for a chunk
  int32_t max_concurrency = 0;   // requests in flight at once; 0: no limit (arrivals never wait)
  bool progress = true;          // a line on stderr every 10 s of a run
  // "completions" (streamed, as above) or "embeddings": one POST /v1/embeddings of the prompt's
  // ids per request, answered whole; its TTFT is its E2E (the vectors come at once) and it has
  // no output tokens, so throughput counts input tokens.
  std::string endpoint = "completions";
  // embeddings: inputs in one request's `input` list (retrieval clients send chunks in batches;
  // OpenAI takes up to 2048), each --input-len tokens; and the `encoding_format` asked for
  // (float, or base64: little-endian float32, a quarter of the JSON's characters).
  int32_t inputs_per_request = 1;
  std::string encoding_format = "float";
};

// One request's outcome; times in seconds.
struct RequestRecord {
  int64_t index = 0;
  double arrival_s = 0;  // when the workload asked for it to be sent, after the run's start
  double send_s = 0;     // when it was sent
  double end_s = 0;      // when its stream ended (or failed)
  int32_t input_len = 0;
  int32_t output_len = 0;  // requested
  bool ok = false;
  std::string error;       // why not ok: transport error, HTTP status and message, stream error
  double ttft_s = 0;
  std::vector<double> itl_s;  // gaps between consecutive chunks after the first
  int64_t output_tokens = 0;  // usage.completion_tokens (the chunk count when absent)
  int64_t chunks = 0;         // streamed chunks that carried tokens

  double e2e_s() const { return end_s - send_s; }
};

// Sends one streaming completion and reads it to the end; never throws for the server's or the
// network's failures (they go to record.error). `run_start` is the run's clock origin.
RequestRecord send_request(const ServerUrl& url, const ClientOptions& options, const TimedRequest& request,
                           double run_start_s);
// Sends every request at its arrival time (a thread each) and waits for all; records by index.
std::vector<RequestRecord> run_workload(const ServerUrl& url, const ClientOptions& options, const Workload& workload);

// p-th percentile (p in [0, 100]) with linear interpolation between closest ranks (numpy's
// default): rank p/100 * (n - 1) of the sorted values. NaN for no values.
double percentile(std::vector<double> values, double p);

struct LatencyStats {  // milliseconds
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
LatencyStats latency_stats(const std::vector<double>& seconds);

struct SloLimits {
  double ttft_ms = 2000;
  double itl_ms = 250;
  double percentile = 99;  // the run-level check's percentile
};

// Throws naming the flag: limits must be positive, the percentile in (0, 100].
void check_slo(const SloLimits& slo);

struct RunSummary {
  int64_t num_requests = 0, num_completed = 0, num_failed = 0;
  double duration_s = 0;  // run start to the last request's end
  int64_t input_tokens = 0, output_tokens = 0;  // of completed requests
  double request_throughput = 0;  // completed requests / duration
  double output_throughput = 0;   // output tokens / s
  double total_token_throughput = 0;  // (input + output) tokens / s
  LatencyStats ttft, itl, e2e, tpot;
  int64_t num_good = 0;  // completed within TTFT and TPOT limits
  double goodput = 0;    // good requests / s
  double slo_ttft_ms = 0, slo_itl_ms = 0;  // the chosen percentile of TTFT and ITL
  bool meets_slo = false;
  int64_t merged_tokens = 0;    // output tokens that arrived in a chunk with others
  double max_send_lag_ms = 0;   // latest send behind its arrival time (client health)
  std::vector<std::string> errors;  // distinct error messages, at most 5, with counts
};
RunSummary summarize(const std::vector<RequestRecord>& records, const SloLimits& slo);
nlohmann::json summary_json(const RunSummary& summary);
nlohmann::json records_json(const std::vector<RequestRecord>& records);

// A sweep's table: one row per run (rate, counts, throughputs, the nine percentiles, SLO check).
struct SweepPoint {
  double rate_per_s = 0;
  RunSummary summary;
};
void write_sweep_csv(const std::string& path, const std::vector<SweepPoint>& points);
// The highest rate whose run met the SLO (0 when none did).
double max_rate_meeting_slo(const std::vector<SweepPoint>& points);

struct PlotSeries {
  std::string csv_path;
  std::string label;
};
// Runs `gnuplot -c script svg_path ttft_limit itl_limit csv label ...` (at most three series).
// Returns what happened for the user: the SVG written, or why it was skipped (no gnuplot on
// PATH, script not found) or failed. Never throws for those.
std::string plot_latency_vs_rate(const std::string& script, const std::string& svg_path, const SloLimits& slo,
                                 const std::vector<PlotSeries>& series);
// scripts/plot_latency_vs_rate.gnuplot next to the running binary's checkout (the binary's
// ../scripts or ../../scripts) or under the working directory; "" when not found.
std::string find_plot_script();

}  // namespace splitflow::bench
