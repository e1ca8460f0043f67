// bench/serve.h without a server: percentiles and run summaries (goodput, the SLO check) against
// values computed by hand, URL parsing, an unreachable server, the sweep CSV and its plot.
#include "bench/serve.h"
#include "core/error.h"
#include "sim/plots.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace splitflow::bench {
namespace {

TEST(Percentile, LinearInterpolationBetweenClosestRanks) {
  // numpy.percentile([1..10], q): rank q/100 * 9.
  const std::vector<double> values = {7, 3, 10, 1, 5, 2, 9, 4, 8, 6};
  EXPECT_DOUBLE_EQ(percentile(values, 50), 5.5);
  EXPECT_DOUBLE_EQ(percentile(values, 90), 9.1);
  EXPECT_DOUBLE_EQ(percentile(values, 99), 9.91);
  EXPECT_DOUBLE_EQ(percentile(values, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(values, 100), 10);
  EXPECT_DOUBLE_EQ(percentile({42}, 99), 42);
  EXPECT_DOUBLE_EQ(percentile({1, 3}, 25), 1.5);
  EXPECT_TRUE(std::isnan(percentile({}, 50)));
  EXPECT_THROW(percentile(values, 101), Error);
  EXPECT_THROW(percentile(values, -1), Error);
}

TEST(LatencyStats, MillisecondsOfSeconds) {
  const LatencyStats stats = latency_stats({0.1, 0.2, 0.3, 0.4});
  EXPECT_EQ(stats.count, 4);
  EXPECT_NEAR(stats.mean, 250, 1e-9);
  EXPECT_NEAR(stats.p50, 250, 1e-9);
  EXPECT_NEAR(stats.p90, 370, 1e-9);  // rank 2.7: 300 + 0.7 * 100
  EXPECT_NEAR(stats.p99, 397, 1e-9);  // rank 2.97
  EXPECT_NEAR(stats.max, 400, 1e-9);
  EXPECT_EQ(latency_stats({}).count, 0);
}

RequestRecord completed(int64_t index, double send_s, double ttft_s, std::vector<double> itl_s, int64_t tokens) {
  RequestRecord r;
  r.index = index;
  r.arrival_s = send_s;
  r.send_s = send_s;
  r.input_len = 100;
  r.output_len = tokens;
  r.ok = true;
  r.ttft_s = ttft_s;
  r.itl_s = std::move(itl_s);
  r.chunks = static_cast<int64_t>(r.itl_s.size()) + 1;
  r.output_tokens = tokens;
  double end = send_s + ttft_s;
  for (double gap : r.itl_s) end += gap;
  r.end_s = end;
  return r;
}

TEST(Summarize, GoodputThroughputAndTheNinePercentiles) {
  std::vector<RequestRecord> records;
  records.push_back(completed(0, 0.0, 0.5, {0.1, 0.1, 0.1}, 4));  // good: TTFT 0.5 s, TPOT 0.1 s; ends 0.8
  records.push_back(completed(1, 1.0, 2.5, {0.1}, 2));             // TTFT over 2 s; ends 3.6
  records.push_back(completed(2, 2.0, 0.2, {0.3, 0.3}, 3));        // TPOT 0.3 s over 250 ms; ends 2.8
  records.push_back(completed(3, 3.0, 1.0, {0.05, 0.05}, 5));      // good; 5 tokens in 3 chunks; ends 4.1
  RequestRecord failed;
  failed.index = 4;
  failed.arrival_s = 3.5;
  failed.send_s = 3.52;
  failed.end_s = 3.6;
  failed.error = "HTTP 429: queue full";
  records.push_back(failed);

  const RunSummary s = summarize(records, SloLimits{});
  EXPECT_EQ(s.num_requests, 5);
  EXPECT_EQ(s.num_completed, 4);
  EXPECT_EQ(s.num_failed, 1);
  EXPECT_NEAR(s.duration_s, 4.1, 1e-12);
  EXPECT_EQ(s.output_tokens, 4 + 2 + 3 + 5);
  EXPECT_EQ(s.input_tokens, 400);
  EXPECT_NEAR(s.output_throughput, 14 / 4.1, 1e-9);
  EXPECT_NEAR(s.request_throughput, 4 / 4.1, 1e-9);
  EXPECT_NEAR(s.total_token_throughput, 414 / 4.1, 1e-9);
  EXPECT_EQ(s.num_good, 2);
  EXPECT_NEAR(s.goodput, 2 / 4.1, 1e-9);
  EXPECT_EQ(s.merged_tokens, 2);  // request 3: 5 tokens, 3 chunks
  EXPECT_NEAR(s.max_send_lag_ms, 20, 1e-9);
  ASSERT_EQ(s.errors.size(), 1u);
  EXPECT_EQ(s.errors[0], "1 x HTTP 429: queue full");

  // TTFT (ms) sorted 200, 500, 1000, 2500: p50 rank 1.5 -> 750; p90 rank 2.7 -> 2050; p99 rank 2.97 -> 2455.
  EXPECT_EQ(s.ttft.count, 4);
  EXPECT_NEAR(s.ttft.p50, 750, 1e-9);
  EXPECT_NEAR(s.ttft.p90, 2050, 1e-9);
  EXPECT_NEAR(s.ttft.p99, 2455, 1e-9);
  EXPECT_NEAR(s.ttft.mean, 1050, 1e-9);
  // ITL (ms) pooled, sorted 50, 50, 100, 100, 100, 100, 300, 300: p50 100; p90 rank 6.3 -> 300; p99 300.
  EXPECT_EQ(s.itl.count, 8);
  EXPECT_NEAR(s.itl.p50, 100, 1e-9);
  EXPECT_NEAR(s.itl.p90, 300, 1e-9);
  EXPECT_NEAR(s.itl.p99, 300, 1e-9);
  // E2E (ms) sorted 800, 800, 1100, 2600: p50 rank 1.5 -> 950; p90 rank 2.7 -> 2150; p99 2555.
  EXPECT_NEAR(s.e2e.p50, 950, 1e-9);
  EXPECT_NEAR(s.e2e.p90, 2150, 1e-9);
  EXPECT_NEAR(s.e2e.p99, 2555, 1e-9);
  // TPOT per request: 0.1, 0.1, 0.3, 0.025 s -> mean 131.25 ms.
  EXPECT_NEAR(s.tpot.mean, 131.25, 1e-9);
  EXPECT_FALSE(s.meets_slo);  // a failure, and p99 TTFT 2455 ms and ITL 300 ms are over

  const nlohmann::json json = summary_json(s);
  for (const char* key : {"num_requests", "num_completed", "num_failed", "duration_s", "output_throughput_tps",
                          "goodput_rps", "ttft_ms", "itl_ms", "e2e_ms", "tpot_ms", "meets_slo", "errors"}) {
    EXPECT_TRUE(json.contains(key)) << key;
  }
  EXPECT_DOUBLE_EQ(json["ttft_ms"]["p99"].get<double>(), 2455);
}

TEST(Summarize, TheSloCheckUsesTheChosenPercentile) {
  // 100 requests: TTFT 10..1000 ms in steps of 10, every ITL 0.1 s except request 99's 0.5 s gap.
  std::vector<RequestRecord> records;
  for (int i = 0; i < 100; ++i) {
    records.push_back(completed(i, i, 0.01 * (i + 1), {0.1, i == 99 ? 0.5 : 0.1}, 3));
  }
  SloLimits slo{.ttft_ms = 995, .itl_ms = 250, .percentile = 99};
  RunSummary s = summarize(records, slo);
  // TTFT p99 rank 98.01 -> 990.1 ms < 995; ITL p99 of 200 gaps (the 500 ms one last): rank 197.01,
  // between two 100 ms gaps -> 100 ms.
  EXPECT_NEAR(s.slo_ttft_ms, 990.1, 1e-9);
  EXPECT_NEAR(s.slo_itl_ms, 100, 1e-9);
  EXPECT_TRUE(s.meets_slo);
  EXPECT_EQ(s.num_good, 99);  // request 99: TTFT 1000 ms over the limit (and TPOT 300 ms)
  slo.ttft_ms = 990;
  EXPECT_FALSE(summarize(records, slo).meets_slo);
  slo.ttft_ms = 2000;
  slo.percentile = 100;  // the 500 ms gap now counts
  EXPECT_FALSE(summarize(records, slo).meets_slo);
  EXPECT_THROW(summarize(records, SloLimits{.ttft_ms = 0}), Error);
  EXPECT_THROW(summarize(records, SloLimits{.percentile = 0}), Error);
  EXPECT_THROW(summarize(records, SloLimits{.percentile = 120}), Error);
}

TEST(ServerUrl, ParsesHostPortAndPrefix) {
  ServerUrl url = parse_server_url("http://127.0.0.1:8000");
  EXPECT_EQ(url.host, "127.0.0.1");
  EXPECT_EQ(url.port, 8000);
  EXPECT_EQ(url.path_prefix, "");
  url = parse_server_url("http://localhost");
  EXPECT_EQ(url.host, "localhost");
  EXPECT_EQ(url.port, 80);
  url = parse_server_url("http://gpu-box:9000/serving/");
  EXPECT_EQ(url.port, 9000);
  EXPECT_EQ(url.path_prefix, "/serving");
  url = parse_server_url("http://[::1]:8080");
  EXPECT_EQ(url.host, "::1");
  EXPECT_EQ(url.port, 8080);
}

TEST(ServerUrl, RejectsBadUrlsNamingTheProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {"https://host:443", "https is not supported"},
      {"ftp://host", "expected http://host[:port][/prefix]"},
      {"127.0.0.1:8000", "expected http://host[:port][/prefix]"},
      {"", "expected http://host[:port][/prefix]"},
      {"http://:8000", "no host"},
      {"http://host:abc", "the port 'abc' is not a number in [1, 65535]"},
      {"http://host:0", "the port '0'"},
      {"http://host:70000", "the port '70000'"},
      {"http://host:", "the port ''"},
      {"http://[::1", "unclosed '['"},
  };
  for (const auto& [url, expected] : cases) {
    try {
      parse_server_url(url);
      ADD_FAILURE() << url << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << url << ": " << e.what();
    }
  }
}

#ifdef SPLITFLOW_HAS_HTTPLIB
TEST(ServerClient, AnUnreachableServerIsAClearError) {
  // Port 1 (tcpmux) is closed here: the connection is refused at once.
  const ServerUrl url = parse_server_url("http://127.0.0.1:1");
  try {
    query_server(url, 2.0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot reach the server at http://127.0.0.1:1"), std::string::npos) << e.what();
  }
  ClientOptions options;
  options.model = "model";
  const RequestRecord record = send_request(url, options, TimedRequest{0, 0, 8, 4}, 0);
  EXPECT_FALSE(record.ok);
  EXPECT_FALSE(record.error.empty());
  EXPECT_EQ(record.chunks, 0);
}
#endif

TEST(SweepCsv, OneRowPerRateAndTheBestRateMeetingTheSlo) {
  const std::string dir = ::testing::TempDir() + "/bench_sweep_csv";
  std::filesystem::create_directories(dir);
  std::vector<SweepPoint> points(3);
  points[0].rate_per_s = 1;
  points[0].summary.meets_slo = true;
  points[0].summary.num_requests = 10;
  points[0].summary.num_good = 10;
  points[0].summary.ttft.p99 = 120.5;
  points[1].rate_per_s = 2;
  points[1].summary.meets_slo = true;
  points[2].rate_per_s = 4;
  points[2].summary.meets_slo = false;
  EXPECT_EQ(max_rate_meeting_slo(points), 2);
  EXPECT_EQ(max_rate_meeting_slo({}), 0);
  const std::string path = dir + "/sweep.csv";
  write_sweep_csv(path, points);
  std::ifstream in(path);
  std::string header, line;
  std::getline(in, header);
  EXPECT_EQ(header.rfind("rate_rps,num_requests,", 0), 0u) << header;
  for (const char* column : {"ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms",
                             "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms", "goodput_rps", "meets_slo"}) {
    EXPECT_NE(header.find(column), std::string::npos) << column;
  }
  std::vector<std::string> rows;
  while (std::getline(in, line)) rows.push_back(line);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].rfind("1,10,", 0), 0u) << rows[0];
  EXPECT_NE(rows[0].find(",120.50,"), std::string::npos) << rows[0];
  EXPECT_EQ(rows[2].back(), '0');
  EXPECT_THROW(write_sweep_csv(dir + "/no/such/dir/x.csv", points), Error);
}

TEST(SweepPlot, DrawnWithGnuplotOrSkippedWithAMessage) {
  const std::string dir = ::testing::TempDir() + "/bench_sweep_plot";
  std::filesystem::create_directories(dir);
  std::vector<SweepPoint> points(2);
  for (int i = 0; i < 2; ++i) {
    points[i].rate_per_s = i + 1;
    RunSummary& s = points[i].summary;
    s.num_requests = 5;
    s.num_good = 5 - i;
    s.output_throughput = 100 * (i + 1);
    s.goodput = 0.9 * (i + 1);
    const double scale = i + 1;
    s.ttft = {5, 100 * scale, 90 * scale, 110 * scale, 130 * scale, 140 * scale};
    s.itl = {20, 20 * scale, 18 * scale, 22 * scale, 30 * scale, 40 * scale};
    s.e2e = {5, 500 * scale, 450 * scale, 600 * scale, 700 * scale, 800 * scale};
  }
  write_sweep_csv(dir + "/a.csv", points);
  const std::string script = find_plot_script();
  ASSERT_FALSE(script.empty()) << "scripts/plot_latency_vs_rate.gnuplot not found from the test binary";
  const std::string svg = dir + "/a.svg";
  std::filesystem::remove(svg);
  const std::string message =
      plot_latency_vs_rate(script, svg, SloLimits{}, {{dir + "/a.csv", "SplitFuse"}, {dir + "/a.csv", "copy"}});
  if (sim::find_program("gnuplot").empty()) {
    EXPECT_NE(message.find("plot skipped: gnuplot not found on PATH"), std::string::npos) << message;
  } else {
    EXPECT_EQ(message, "plot: " + svg);
    const std::string text = test::read_file(svg);
    EXPECT_NE(text.find("<svg"), std::string::npos);
    EXPECT_NE(text.find("TTFT p99"), std::string::npos);
    EXPECT_NE(text.find("SplitFuse"), std::string::npos);
  }
  EXPECT_NE(plot_latency_vs_rate("", svg, SloLimits{}, {{dir + "/a.csv", "x"}}).find("plot skipped"), std::string::npos);
  EXPECT_THROW(plot_latency_vs_rate(script, svg, SloLimits{}, {}), Error);
}

}  // namespace
}  // namespace splitflow::bench
