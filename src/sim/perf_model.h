// sim/perf_model.h — the simulator's performance model: prompt-phase and token-phase iteration
// time as piecewise-linear functions of batch tokens, one pair per (model, hardware, tensor
// parallelism), built from a profile CSV (schema in docs/simulator.md). Owns no simulation state
// and never touches the engine or GPU code.
#pragma once

#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace splitflow::sim {

// Linear interpolation through knots (x ascending), with linear extrapolation of the end segments,
// computed as scipy's interp1d(kind="linear", fill_value="extrapolate") does.
class PiecewiseLinear {
 public:
  PiecewiseLinear() = default;
  PiecewiseLinear(std::vector<double> knots_x, std::vector<double> knots_y);
  double operator()(double x) const;
  const std::vector<double>& knots_x() const { return knots_x_; }
  const std::vector<double>& knots_y() const { return knots_y_; }

 private:
  std::vector<double> knots_x_;
  std::vector<double> knots_y_;
};

struct PerfKey {
  std::string model;
  std::string hardware;
  int tensor_parallel = 0;
  auto operator<=>(const PerfKey&) const = default;
};

enum class BatchKind { PromptOnly, DecodeOnly, Mixed };

// Iteration-time curves of one (model, hardware, TP), in seconds vs batch tokens.
struct PerfCurves {
  PiecewiseLinear prompt_time_s;  // P(x): batch of prompts totalling x tokens
  PiecewiseLinear token_time_s;   // T(x): batch of x decode sequences (context length ignored)

  // One iteration of a batch of `batch_tokens` (prompt tokens + one per decode sequence).
  // Mixed prompt+decode batches pay mixed_batch_factor × P(x), as SplitwiseSim does.
  double iteration_time_s(BatchKind kind, double batch_tokens, double mixed_batch_factor = 1.1) const;
};

class PerfModel {
 public:
  // Loads a profile CSV: one row per measured run; rows with the same prompt_size × batch_size
  // are pooled into one knot holding the median prompt and token time (ms in the file, s here).
  static PerfModel load_csv(const std::string& path);

  const PerfCurves& curves(const PerfKey& key) const;
  bool contains(const PerfKey& key) const { return curves_.count(key) != 0; }
  std::vector<PerfKey> keys() const;

  double iteration_time_s(const PerfKey& key, BatchKind kind, double batch_tokens,
                          double mixed_batch_factor = 1.1) const;

 private:
  std::map<PerfKey, PerfCurves> curves_;
};

}  // namespace splitflow::sim
