#include "sim/perf_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "sim/csv.h"

#include <fmt/format.h>

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

double PiecewiseLinear::sum_unit_steps(double start, int64_t count) const {
  // Segment s (knots s, s+1) serves x in (x_s, x_{s+1}], the first and last also beyond the ends,
  // as operator() picks them; over the k with start + k in it the sum is an arithmetic series.
  if (count <= 0) return 0.0;
  const size_t n = knots_x_.size();
  double total = 0;
  for (size_t s = 0; s + 1 < n; ++s) {
    int64_t first = s == 0 ? 0 : static_cast<int64_t>(std::floor(knots_x_[s] - start)) + 1;
    int64_t last = s + 2 == n ? count - 1 : static_cast<int64_t>(std::floor(knots_x_[s + 1] - start));
    first = std::max<int64_t>(first, 0);
    last = std::min<int64_t>(last, count - 1);
    if (first > last) continue;
    const double slope = (knots_y_[s + 1] - knots_y_[s]) / (knots_x_[s + 1] - knots_x_[s]);
    const double steps = static_cast<double>(last - first + 1);
    total += steps * (knots_y_[s] + slope * (start - knots_x_[s])) +
             slope * static_cast<double>(first + last) * steps / 2.0;
  }
  return total;
}

BilinearGrid::BilinearGrid(std::vector<double> xs, std::vector<double> ys, std::vector<double> values)
    : xs_(std::move(xs)), ys_(std::move(ys)), values_(std::move(values)) {
  SF_CHECK(xs_.size() >= 2 && ys_.size() >= 2, "bilinear grid: needs at least 2 knots on each axis, got {} x {}",
           xs_.size(), ys_.size());
  SF_CHECK(values_.size() == xs_.size() * ys_.size(), "bilinear grid: {} values for a {} x {} grid", values_.size(),
           xs_.size(), ys_.size());
  for (const std::vector<double>* axis : {&xs_, &ys_})
    for (size_t i = 1; i < axis->size(); ++i)
      SF_CHECK((*axis)[i] > (*axis)[i - 1], "bilinear grid: knots must be strictly ascending, {} after {}",
               (*axis)[i], (*axis)[i - 1]);
}

PiecewiseLinear BilinearGrid::at_x(double x) const {
  const size_t n = xs_.size(), m = ys_.size();
  size_t hi = std::lower_bound(xs_.begin(), xs_.end(), x) - xs_.begin();
  hi = std::clamp<size_t>(hi, 1, n - 1);
  const size_t lo = hi - 1;
  const double t = (x - xs_[lo]) / (xs_[hi] - xs_[lo]);
  std::vector<double> column(m);
  for (size_t j = 0; j < m; ++j) column[j] = values_[lo * m + j] + t * (values_[hi * m + j] - values_[lo * m + j]);
  return PiecewiseLinear(ys_, std::move(column));
}

double BilinearGrid::operator()(double x, double y) const { return at_x(x)(y); }

std::string decode_model_name(DecodeModel model) {
  return model == DecodeModel::SplitwiseSim ? "splitwise" : "context";
}

DecodeModelChoice parse_decode_model_choice(const std::string& name) {
  if (name == "auto") return DecodeModelChoice::Auto;
  if (name == "splitwise") return DecodeModelChoice::SplitwiseSim;
  if (name == "context") return DecodeModelChoice::ContextAware;
  fail("unknown decode model '{}' (choices: auto, splitwise, context)", name);
}

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// The curve through each size's median time, sizes ascending.
PiecewiseLinear median_curve(const std::map<int64_t, std::vector<double>>& samples) {
  std::vector<double> xs, ys;
  for (const auto& [size, times] : samples) {
    xs.push_back(static_cast<double>(size));
    ys.push_back(median(times));
  }
  return PiecewiseLinear(std::move(xs), std::move(ys));
}

}  // namespace

PerfModel PerfModel::load_csv(const std::string& path, DecodeModelChoice choice) {
  const CsvTable table = read_csv(path);
  if (std::find(table.header.begin(), table.header.end(), "phase") != table.header.end())
    return load_extended(table, choice);
  SF_CHECK(choice != DecodeModelChoice::ContextAware,
           "{}: the context-aware decode model needs a profile with a context grid (the extended schema's 'phase' "
           "and 'context_tokens' columns, written by splitflow profile); this file has SplitwiseSim's columns only",
           path);
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

PerfModel PerfModel::load_extended(const CsvTable& table, DecodeModelChoice choice) {
  const std::string& path = table.path;
  const size_t model_col = table.column("model");
  const size_t hardware_col = table.column("hardware");
  const size_t tp_col = table.column("tensor_parallel");
  const size_t phase_col = table.column("phase");
  const size_t prompt_size_col = table.column("prompt_size");
  const size_t batch_size_col = table.column("batch_size");
  const size_t context_col = table.column("context_tokens");
  const size_t prompt_time_col = table.column("prompt_time");
  const size_t token_time_col = table.column("token_time");
  const size_t transfer_time_col = table.column("transfer_time");

  struct Samples {
    std::map<int64_t, std::vector<double>> prompt_s;                    // by batch tokens
    std::map<std::pair<int64_t, int64_t>, std::vector<double>> step_s;  // by (batch size, context)
    std::map<int64_t, std::vector<double>> transfer_s;                  // by tokens
  };
  std::map<PerfKey, Samples> groups;
  auto positive_ms = [&](size_t r, size_t col) {
    const double ms = table.number(r, col);
    SF_CHECK(ms > 0 && std::isfinite(ms), "{}: data row {}: {} must be positive ms, got {}", path, r + 1,
             table.header[col], ms);
    return ms / 1000.0;
  };
  auto positive_int = [&](size_t r, size_t col) {
    const int64_t value = table.integer(r, col);
    SF_CHECK(value > 0, "{}: data row {}: {} must be positive, got {}", path, r + 1, table.header[col], value);
    return value;
  };
  for (size_t r = 0; r < table.rows.size(); ++r) {
    const PerfKey key{table.text(r, model_col), table.text(r, hardware_col), static_cast<int>(table.integer(r, tp_col))};
    SF_CHECK(key.tensor_parallel > 0, "{}: data row {}: tensor_parallel must be positive", path, r + 1);
    Samples& samples = groups[key];
    const std::string& phase = table.text(r, phase_col);
    if (phase == "prompt") {
      const int64_t batch_tokens = positive_int(r, prompt_size_col) * positive_int(r, batch_size_col);
      samples.prompt_s[batch_tokens].push_back(positive_ms(r, prompt_time_col));
    } else if (phase == "token") {
      const int64_t batch_size = positive_int(r, batch_size_col);
      const int64_t context = table.integer(r, context_col);
      SF_CHECK(context >= 0, "{}: data row {}: context_tokens must be non-negative, got {}", path, r + 1, context);
      samples.step_s[{batch_size, context}].push_back(positive_ms(r, token_time_col));
    } else if (phase == "kv_transfer") {
      samples.transfer_s[positive_int(r, prompt_size_col)].push_back(positive_ms(r, transfer_time_col));
    } else {
      fail("{}: data row {}: unknown phase '{}' (prompt, token or kv_transfer)", path, r + 1, phase);
    }
  }
  SF_CHECK(!groups.empty(), "{}: no profile rows", path);

  PerfModel model;
  for (auto& [key, samples] : groups) {
    const std::string where = fmt::format("{}: ({}, {}, TP{})", path, key.model, key.hardware, key.tensor_parallel);
    SF_CHECK(samples.prompt_s.size() >= 2, "{} has {} prompt sizes; need at least two to interpolate", where,
             samples.prompt_s.size());
    SF_CHECK(!samples.step_s.empty(), "{} has no token rows", where);
    PerfCurves curves;
    curves.prompt_time_s = median_curve(samples.prompt_s);

    // The context grid: every (batch size, context) pair measured.
    std::vector<int64_t> batch_sizes, contexts;
    std::map<int64_t, std::vector<double>> by_batch_size;  // every context's samples: SplitwiseSim's T
    for (auto& [cell, times] : samples.step_s) {
      if (batch_sizes.empty() || batch_sizes.back() != cell.first) batch_sizes.push_back(cell.first);
      if (std::find(contexts.begin(), contexts.end(), cell.second) == contexts.end()) contexts.push_back(cell.second);
      by_batch_size[cell.first].insert(by_batch_size[cell.first].end(), times.begin(), times.end());
    }
    std::sort(contexts.begin(), contexts.end());
    SF_CHECK(batch_sizes.size() >= 2 && contexts.size() >= 2,
             "{}: the decode grid has {} batch sizes and {} context lengths; need at least two of each", where,
             batch_sizes.size(), contexts.size());
    std::vector<double> grid;
    for (int64_t b : batch_sizes)
      for (int64_t c : contexts) {
        auto it = samples.step_s.find({b, c});
        SF_CHECK(it != samples.step_s.end(), "{}: the decode grid lacks batch_size {} at context_tokens {}", where, b, c);
        grid.push_back(median(it->second));
      }
    curves.decode_step_time_s =
        BilinearGrid(std::vector<double>(batch_sizes.begin(), batch_sizes.end()),
                     std::vector<double>(contexts.begin(), contexts.end()), std::move(grid));
    // SplitwiseSim's mode on the same profile: context ignored, the median over every context.
    curves.token_time_s = median_curve(by_batch_size);
    curves.decode_model =
        choice == DecodeModelChoice::SplitwiseSim ? DecodeModel::SplitwiseSim : DecodeModel::ContextAware;

    if (!samples.transfer_s.empty()) {
      SF_CHECK(samples.transfer_s.size() >= 2, "{}: kv_transfer rows need at least two sizes to interpolate", where);
      curves.kv_transfer_time_s = median_curve(samples.transfer_s);
    }
    model.curves_[key] = std::move(curves);
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

double PerfCurves::batch_time_s(int64_t prompt_tokens, int64_t decodes, double mean_context,
                                double mixed_batch_factor) const {
  const BatchKind kind = prompt_tokens == 0 ? BatchKind::DecodeOnly
                         : decodes == 0     ? BatchKind::PromptOnly
                                            : BatchKind::Mixed;
  const double batch_tokens = static_cast<double>(prompt_tokens + decodes);
  if (decode_model == DecodeModel::SplitwiseSim) return iteration_time_s(kind, batch_tokens, mixed_batch_factor);
  if (kind == BatchKind::PromptOnly) return prompt_time_s(batch_tokens);
  const PiecewiseLinear by_context = decode_step_time_s->at_x(static_cast<double>(decodes));
  if (kind == BatchKind::DecodeOnly) return by_context(mean_context);
  return prompt_time_s(batch_tokens) + std::max(0.0, by_context(mean_context) - by_context(0.0));
}

double PerfCurves::decode_block_time_s(int64_t decodes, double mean_context, int64_t iterations) const {
  SF_CHECK(decode_model == DecodeModel::ContextAware && decode_step_time_s,
           "perf model: decode blocks are timed step by step only in the context-aware model");
  return decode_step_time_s->at_x(static_cast<double>(decodes)).sum_unit_steps(mean_context, iterations);
}

double PerfCurves::reference_tbt_s(int64_t prompt_tokens, int64_t output_tokens) const {
  if (decode_model == DecodeModel::SplitwiseSim) return token_time_s(static_cast<double>(prompt_tokens));
  // Decode step k (k = 0 .. output - 2) runs with prompt + k tokens cached.
  const int64_t steps = std::max<int64_t>(output_tokens - 1, 1);
  return decode_block_time_s(1, static_cast<double>(prompt_tokens), steps) / static_cast<double>(steps);
}

double PerfModel::iteration_time_s(const PerfKey& key, BatchKind kind, double batch_tokens,
                                   double mixed_batch_factor) const {
  return curves(key).iteration_time_s(kind, batch_tokens, mixed_batch_factor);
}

}  // namespace splitflow::sim
