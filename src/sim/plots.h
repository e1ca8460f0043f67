// sim/plots.h — gnuplot scripts for the simulator's CSV outputs (slowdown vs request rate per
// design, as the paper's Fig. 16; the design-space heatmap of Fig. 12), drawn as SVG when gnuplot
// is on PATH. The CSV files are the primary output: without gnuplot the drawing is skipped with a
// message and the script is still written, to run later.
#pragma once

#include <string>
#include <vector>

#include "sim/config.h"
#include "sim/search.h"

namespace splitflow::sim {

// The program's full path from $PATH; "" when it is not there.
std::string find_program(const std::string& name);

struct PlotOutcome {
  std::string script;  // path of the .gp file
  std::string image;   // path of the .svg it draws
  bool drawn = false;
  std::string message;  // what happened, for the user
};

// 3×3 panels (TTFT, TBT, E2E × p50, p90, p99 slowdown) vs rate, one line per design, with the
// SLO limit; reads `csv_name` in `dir` as write_sweep_csv writes it.
PlotOutcome plot_latency_vs_rate(const std::string& dir, const std::string& csv_name,
                                 const std::vector<std::string>& designs, const SloConfig& slo);

// Prompt × token machine counts of one Splitwise design, coloured by cost where all SLOs are met,
// grey where not, the optimum starred; reads `csv_name` in `dir` as write_search_csv writes it.
PlotOutcome plot_design_space(const std::string& dir, const std::string& csv_name, const Design& design,
                              double rate_per_s, const SearchPoint* optimum, const std::string& image_stem);

}  // namespace splitflow::sim
