// sim/perf_model.h — the simulator's performance model: iteration times of prompt, decode and mixed
// batches, and KV-transfer times, per (model, hardware, tensor parallelism), built from a profile
// CSV (schema in docs/simulator.md). Two decode models:
//  * SplitwiseSim's: T(x), piecewise linear in batch tokens, context length ignored (the default
//    for SplitwiseSim-format files, which the validation tests reproduce operation for operation);
//  * context-aware: T(b, c), bilinear over (decode sequences, mean context tokens) from the grid
//    `splitflow profile` measures, so a block of decode steps slows down as its caches grow.
// Owns no simulation state and never touches the engine or GPU code.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace splitflow::sim {

struct CsvTable;

// Linear interpolation through knots (x ascending), with linear extrapolation of the end segments,
// computed as scipy's interp1d(kind="linear", fill_value="extrapolate") does.
class PiecewiseLinear {
 public:
  PiecewiseLinear() = default;
  PiecewiseLinear(std::vector<double> knots_x, std::vector<double> knots_y);
  double operator()(double x) const;
  // f(start) + f(start + 1) + ... + f(start + count - 1), in O(knots): a decode block's steps.
  double sum_unit_steps(double start, int64_t count) const;
  const std::vector<double>& knots_x() const { return knots_x_; }
  const std::vector<double>& knots_y() const { return knots_y_; }

 private:
  std::vector<double> knots_x_;
  std::vector<double> knots_y_;
};

// Bilinear interpolation over a full rectangular grid; outside it the edge cells extend linearly
// (each axis as PiecewiseLinear does), so along either axis it is piecewise linear.
class BilinearGrid {
 public:
  BilinearGrid() = default;
  // values[i * ys.size() + j] at (xs[i], ys[j]); both axes strictly ascending, at least 2 knots each.
  BilinearGrid(std::vector<double> xs, std::vector<double> ys, std::vector<double> values);
  double operator()(double x, double y) const;
  // The grid at fixed x as a function of y (exactly the bilinear interpolant along that line).
  PiecewiseLinear at_x(double x) const;
  const std::vector<double>& xs() const { return xs_; }
  const std::vector<double>& ys() const { return ys_; }

 private:
  std::vector<double> xs_, ys_, values_;
};

struct PerfKey {
  std::string model;
  std::string hardware;
  int tensor_parallel = 0;
  auto operator<=>(const PerfKey&) const = default;
};

enum class BatchKind { PromptOnly, DecodeOnly, Mixed };

enum class DecodeModel {
  SplitwiseSim,  // T(batch tokens), context ignored
  ContextAware,  // T(decode sequences, mean context tokens)
};
std::string decode_model_name(DecodeModel model);  // "splitwise", "context"

// What load_csv builds: `Auto` is context-aware when the file has a context grid (the extended
// schema's `phase` column), SplitwiseSim's otherwise.
enum class DecodeModelChoice { Auto, SplitwiseSim, ContextAware };
DecodeModelChoice parse_decode_model_choice(const std::string& name);  // auto | splitwise | context

// Iteration-time curves of one (model, hardware, TP), in seconds.
struct PerfCurves {
  PiecewiseLinear prompt_time_s;  // P(x): batch of prompts totalling x tokens
  PiecewiseLinear token_time_s;   // T(x): SplitwiseSim's decode curve (context length ignored)
  DecodeModel decode_model = DecodeModel::SplitwiseSim;
  // Context-aware decode step time: (decode sequences, mean context tokens per sequence) -> s.
  // Present when the profile has a context grid, used when decode_model is ContextAware.
  std::optional<BilinearGrid> decode_step_time_s;
  // Profiled KV transfer (whole cache of a prompt, over the transport the profile measured):
  // tokens -> s. Present when the profile has kv_transfer rows.
  std::optional<PiecewiseLinear> kv_transfer_time_s;

  // SplitwiseSim's iteration of a batch of `batch_tokens` (prompt tokens + one per decode
  // sequence). Mixed prompt+decode batches pay mixed_batch_factor × P(x).
  double iteration_time_s(BatchKind kind, double batch_tokens, double mixed_batch_factor = 1.1) const;

  // One iteration of a batch under decode_model: `prompt_tokens` prompt tokens plus `decodes`
  // decode sequences whose caches hold `mean_context` tokens on average. SplitwiseSim mode is
  // iteration_time_s(). Context-aware: P(prompt) alone, T(decodes, mean_context) alone, and a
  // mixed batch P(prompt_tokens + decodes) plus its decodes' attention over their caches,
  // T(decodes, mean_context) − T(decodes, 0) (mixed_batch_factor is SplitwiseSim's and unused).
  double batch_time_s(int64_t prompt_tokens, int64_t decodes, double mean_context, double mixed_batch_factor) const;

  // `iterations` decode steps back to back of `decodes` sequences starting at `mean_context`
  // (each step adds one token to every cache). Context-aware only.
  double decode_block_time_s(int64_t decodes, double mean_context, int64_t iterations) const;

  // Unloaded time between tokens of a request alone on the instance (the SLO reference):
  // SplitwiseSim's T(prompt) in its mode; context-aware, the mean of its decode steps at batch 1.
  double reference_tbt_s(int64_t prompt_tokens, int64_t output_tokens) const;
};

class PerfModel {
 public:
  // Loads a profile CSV. SplitwiseSim's schema: one row per measured run; rows with the same
  // prompt_size × batch_size are pooled into one knot holding the median prompt and token time
  // (ms in the file, s here). The extended schema (a `phase` column: prompt, token, kv_transfer
  // rows; docs/simulator.md) adds the decode context grid and KV-transfer times.
  static PerfModel load_csv(const std::string& path, DecodeModelChoice choice = DecodeModelChoice::Auto);

  const PerfCurves& curves(const PerfKey& key) const;
  bool contains(const PerfKey& key) const { return curves_.count(key) != 0; }
  std::vector<PerfKey> keys() const;

  double iteration_time_s(const PerfKey& key, BatchKind kind, double batch_tokens,
                          double mixed_batch_factor = 1.1) const;

 private:
  static PerfModel load_extended(const CsvTable& table, DecodeModelChoice choice);
  std::map<PerfKey, PerfCurves> curves_;
};

}  // namespace splitflow::sim
