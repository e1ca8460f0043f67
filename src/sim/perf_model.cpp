#include "sim/perf_model.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "sim/csv.h"

namespace splitflow::sim {

PiecewiseLinear::PiecewiseLinear(std::vector<double> knots_x, std::vector<double> knots_y)
    : knots_x_(std::move(knots_x)), knots_y_(std::move(knots_y)) {
  SF_CHECK(knots_x_.size() == knots_y_.size(), "piecewise-linear curve: {} x knots but {} y knots",
           knots_x_.size(), knots_y_.size());
  SF_CHECK(knots_x_.size() >= 2, "piecewise-linear curve: needs at least 2 knots, got {}",
           knots_x_.size());
  for (size_t i = 1; i < knots_x_.size(); ++i)
    SF_CHECK(knots_x_[i] > knots_x_[i - 1],
             "piecewise-linear curve: knots must be strictly ascending, x[{}]={} after x[{}]={}", i,
             knots_x_[i], i - 1, knots_x_[i - 1]);
}

double PiecewiseLinear::operator()(double x) const {
  // scipy: hi = searchsorted(x_knots, x) clipped to [1, n-1]; lo = hi - 1.
  const size_t n = knots_x_.size();
  size_t hi = std::lower_bound(knots_x_.begin(), knots_x_.end(), x) - knots_x_.begin();
  hi = std::clamp<size_t>(hi, 1, n - 1);
  const size_t lo = hi - 1;
  const double slope = (knots_y_[hi] - knots_y_[lo]) / (knots_x_[hi] - knots_x_[lo]);
  return slope * (x - knots_x_[lo]) + knots_y_[lo];
}

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

PerfModel PerfModel::load_csv(const std::string& path) {
  const CsvTable table = read_csv(path);
  const size_t model_col = table.column("model");
  const size_t hardware_col = table.column("hardware");
  const size_t tp_col = table.column("tensor_parallel");
  const size_t prompt_size_col = table.column("prompt_size");
  const size_t batch_size_col = table.column("batch_size");
  const size_t prompt_time_col = table.column("prompt_time");
  const size_t token_time_col = table.column("token_time");

  struct Samples {
    std::vector<double> prompt_time_s;
    std::vector<double> token_time_s;
  };
  std::map<PerfKey, std::map<int64_t, Samples>> groups;
  for (size_t r = 0; r < table.rows.size(); ++r) {
    const PerfKey key{table.text(r, model_col), table.text(r, hardware_col),
                      static_cast<int>(table.integer(r, tp_col))};
    SF_CHECK(key.tensor_parallel > 0, "{}: data row {}: tensor_parallel must be positive", path, r + 1);
    const int64_t prompt_size = table.integer(r, prompt_size_col);
    const int64_t batch_size = table.integer(r, batch_size_col);
    SF_CHECK(prompt_size > 0 && batch_size > 0,
             "{}: data row {}: prompt_size and batch_size must be positive, got {} and {}", path, r + 1,
             prompt_size, batch_size);
    const double prompt_time_ms = table.number(r, prompt_time_col);
    const double token_time_ms = table.number(r, token_time_col);
    SF_CHECK(prompt_time_ms > 0 && token_time_ms > 0,
             "{}: data row {}: prompt_time and token_time must be positive ms, got {} and {}", path, r + 1,
             prompt_time_ms, token_time_ms);
    Samples& samples = groups[key][prompt_size * batch_size];
    samples.prompt_time_s.push_back(prompt_time_ms / 1000.0);
    samples.token_time_s.push_back(token_time_ms / 1000.0);
  }
  SF_CHECK(!groups.empty(), "{}: no profile rows", path);

  PerfModel model;
  for (auto& [key, by_tokens] : groups) {
    SF_CHECK(by_tokens.size() >= 2,
             "{}: ({}, {}, TP{}) has only one batch_tokens value; need at least two to interpolate",
             path, key.model, key.hardware, key.tensor_parallel);
    std::vector<double> xs, prompt_ys, token_ys;
    for (auto& [batch_tokens, samples] : by_tokens) {
      xs.push_back(static_cast<double>(batch_tokens));
      prompt_ys.push_back(median(samples.prompt_time_s));
      token_ys.push_back(median(samples.token_time_s));
    }
    model.curves_[key] = PerfCurves{PiecewiseLinear(xs, prompt_ys), PiecewiseLinear(xs, token_ys)};
  }
  return model;
}

const PerfCurves& PerfModel::curves(const PerfKey& key) const {
  auto it = curves_.find(key);
  SF_CHECK(it != curves_.end(), "perf model: no profile for model '{}' on hardware '{}' at TP{}",
           key.model, key.hardware, key.tensor_parallel);
  return it->second;
}

std::vector<PerfKey> PerfModel::keys() const {
  std::vector<PerfKey> result;
  for (const auto& [key, curves] : curves_) result.push_back(key);
  return result;
}

double PerfCurves::iteration_time_s(BatchKind kind, double batch_tokens, double mixed_batch_factor) const {
  switch (kind) {
    case BatchKind::PromptOnly: return prompt_time_s(batch_tokens);
    case BatchKind::DecodeOnly: return token_time_s(batch_tokens);
    case BatchKind::Mixed: return mixed_batch_factor * prompt_time_s(batch_tokens);
  }
  fail("perf model: unknown batch kind");
}

double PerfModel::iteration_time_s(const PerfKey& key, BatchKind kind, double batch_tokens,
                                   double mixed_batch_factor) const {
  return curves(key).iteration_time_s(kind, batch_tokens, mixed_batch_factor);
}

}  // namespace splitflow::sim
