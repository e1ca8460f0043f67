#include "sim/workload.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <cmath>
#include <random>

#include "core/error.h"
#include "sim/csv.h"

namespace splitflow::sim {

std::vector<Request> load_splitwise_trace(const std::string& path) {
  const CsvTable table = read_csv(path);
  const size_t id_col = table.column("request_id");
  const size_t arrival_col = table.column("arrival_timestamp");
  const size_t prompt_col = table.column("prompt_size");
  const size_t output_col = table.column("token_size");
  std::vector<Request> requests;
  requests.reserve(table.rows.size());
  for (size_t r = 0; r < table.rows.size(); ++r) {
    Request request{table.integer(r, id_col), table.number(r, arrival_col), table.integer(r, prompt_col),
                    table.integer(r, output_col)};
    SF_CHECK(request.prompt_tokens > 0 && request.output_tokens > 0 && request.arrival_s >= 0,
             "{}: data row {}: prompt_size and token_size must be positive and arrival_timestamp "
             "non-negative", path, r + 1);
    requests.push_back(request);
  }
  return requests;
}

namespace {

// Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar (H. Hinnant's algorithm).
int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

}  // namespace

double parse_azure_timestamp(const std::string& text) {
  // YYYY-MM-DD HH:MM:SS[.fraction]
  auto field = [&](size_t pos, size_t len) {
    int64_t value = -1;
    SF_CHECK(pos + len <= text.size(), "Azure timestamp '{}': too short", text);
    auto [end, ec] = std::from_chars(text.data() + pos, text.data() + pos + len, value);
    SF_CHECK(ec == std::errc() && end == text.data() + pos + len, "Azure timestamp '{}': expected "
             "YYYY-MM-DD HH:MM:SS.fffffff", text);
    return value;
  };
  SF_CHECK(text.size() >= 19 && text[4] == '-' && text[7] == '-' && text[10] == ' ' && text[13] == ':' &&
               text[16] == ':',
           "Azure timestamp '{}': expected YYYY-MM-DD HH:MM:SS.fffffff", text);
  const int64_t month = field(5, 2), day = field(8, 2), hour = field(11, 2), minute = field(14, 2);
  const int64_t second = field(17, 2);
  SF_CHECK(month >= 1 && month <= 12 && day >= 1 && day <= 31 && hour < 24 && minute < 60 && second < 61,
           "Azure timestamp '{}': a date or time field is out of range", text);
  double fraction = 0;
  if (text.size() > 19) {
    SF_CHECK(text[19] == '.' && text.size() > 20, "Azure timestamp '{}': expected '.' and digits after the seconds",
             text);
    const int64_t digits = field(20, text.size() - 20);
    fraction = static_cast<double>(digits) / std::pow(10.0, static_cast<double>(text.size() - 20));
  }
  const int64_t days = days_from_civil(field(0, 4), month, day);
  return static_cast<double>(days * 86400 + hour * 3600 + minute * 60 + second) + fraction;
}

std::vector<Request> load_azure_trace(const std::string& path) {
  const CsvTable table = read_csv(path);
  const size_t time_col = table.column("TIMESTAMP");
  const size_t prompt_col = table.column("ContextTokens");
  const size_t output_col = table.column("GeneratedTokens");
  std::vector<Request> requests;
  requests.reserve(table.rows.size());
  double first_s = 0;
  for (size_t r = 0; r < table.rows.size(); ++r) {
    const double time_s = parse_azure_timestamp(table.text(r, time_col));
    if (r == 0) first_s = time_s;
    Request request{static_cast<int64_t>(r), time_s - first_s, table.integer(r, prompt_col),
                    table.integer(r, output_col)};
    SF_CHECK(request.prompt_tokens > 0 && request.output_tokens > 0,
             "{}: data row {}: ContextTokens and GeneratedTokens must be positive", path, r + 1);
    SF_CHECK(request.arrival_s >= 0, "{}: data row {}: timestamp earlier than the first row", path, r + 1);
    requests.push_back(request);
  }
  return requests;
}

std::vector<Request> poisson_workload(const std::vector<Request>& lengths_from, double rate_per_s,
                                      double duration_s, uint64_t seed) {
  SF_CHECK(!lengths_from.empty(), "Poisson workload: no requests to sample lengths from");
  SF_CHECK(rate_per_s > 0 && duration_s > 0, "Poisson workload: rate ({}) and duration ({}) must be positive",
           rate_per_s, duration_s);
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate_per_s);
  std::uniform_int_distribution<size_t> pick(0, lengths_from.size() - 1);
  std::vector<Request> requests;
  double time_s = gap(rng);
  while (time_s < duration_s) {
    const int64_t prompt_tokens = lengths_from[pick(rng)].prompt_tokens;
    const int64_t output_tokens = lengths_from[pick(rng)].output_tokens;
    requests.push_back(Request{static_cast<int64_t>(requests.size()), time_s, prompt_tokens, output_tokens});
    time_s += gap(rng);
  }
  return requests;
}

}  // namespace splitflow::sim

namespace splitflow::sim {

std::vector<Request> load_trace(const std::string& path) {
  std::ifstream in(path);
  SF_CHECK(in, "cannot open trace '{}'", path);
  std::string header;
  std::getline(in, header);
  if (header.find("TIMESTAMP") != std::string::npos) return load_azure_trace(path);
  if (header.find("arrival_timestamp") != std::string::npos) return load_splitwise_trace(path);
  fail("trace '{}': header '{}' is neither the Azure format (TIMESTAMP, ContextTokens, GeneratedTokens) nor "
       "SplitwiseSim's (request_id, ..., arrival_timestamp, ..., prompt_size, token_size)", path, header);
}

Workload replay_workload(const std::vector<Request>& trace, double rate_scale, const std::string& trace_name) {
  SF_CHECK(!trace.empty(), "trace replay of '{}': the trace has no requests", trace_name);
  SF_CHECK(std::isfinite(rate_scale) && rate_scale > 0, "trace replay of '{}': rate scale must be positive, got {}",
           trace_name, rate_scale);
  Workload workload;
  workload.requests = trace;
  for (Request& request : workload.requests) {
    request.arrival_s /= rate_scale;
    workload.duration_s = std::max(workload.duration_s, request.arrival_s);
  }
  workload.description = rate_scale == 1 ? fmt::format("{} trace replay", trace_name)
                                         : fmt::format("{} trace replay at {}x rate", trace_name, rate_scale);
  return workload;
}

Workload poisson_workload_from(const std::vector<Request>& trace, double rate_per_s, double duration_s,
                               uint64_t seed, const std::string& trace_name) {
  SF_CHECK(std::isfinite(rate_per_s) && rate_per_s > 0, "Poisson workload: rate must be positive req/s, got {}",
           rate_per_s);
  SF_CHECK(std::isfinite(duration_s) && duration_s > 0, "Poisson workload: duration must be positive seconds, got {}",
           duration_s);
  Workload workload;
  workload.requests = poisson_workload(trace, rate_per_s, duration_s, seed);
  workload.duration_s = duration_s;
  workload.description =
      fmt::format("Poisson {} req/s for {} s, lengths from {} (seed {})", rate_per_s, duration_s, trace_name, seed);
  return workload;
}

}  // namespace splitflow::sim
