#include "sim/plots.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "sim/report.h"

namespace splitflow::sim {

namespace {

// A gnuplot double-quoted string literal.
std::string gnuplot_string(const std::string& text) {
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

PlotOutcome write_and_draw(const std::string& dir, const std::string& stem, const std::string& script_text) {
  PlotOutcome outcome;
  outcome.script = (std::filesystem::path(dir) / (stem + ".gp")).string();
  outcome.image = (std::filesystem::path(dir) / (stem + ".svg")).string();
  {
    std::ofstream out(outcome.script);
    SF_CHECK(out, "cannot write '{}'", outcome.script);
    out << script_text;
    SF_CHECK(out.good(), "error writing '{}'", outcome.script);
  }
  const std::string gnuplot = find_program("gnuplot");
  if (gnuplot.empty()) {
    outcome.message = fmt::format("gnuplot not found on PATH: skipped {} (CSV and {} written)", outcome.image,
                                  outcome.script);
    return outcome;
  }
  const std::string command =
      fmt::format("cd {} && {} {}.gp", shell_quote(dir), shell_quote(gnuplot), shell_quote(stem));
  const int status = std::system(command.c_str());
  outcome.drawn = status == 0 && std::filesystem::exists(outcome.image);
  outcome.message = outcome.drawn ? fmt::format("wrote {}", outcome.image)
                                  : fmt::format("gnuplot failed on {} (status {})", outcome.script, status);
  return outcome;
}

}  // namespace

std::string find_program(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  const std::string entries = path;
  size_t begin = 0;
  while (begin <= entries.size()) {
    const size_t end = std::min(entries.find(':', begin), entries.size());
    const std::string dir = entries.substr(begin, end - begin);
    if (!dir.empty()) {
      const std::string candidate = (std::filesystem::path(dir) / name).string();
      if (::access(candidate.c_str(), X_OK) == 0 && std::filesystem::is_regular_file(candidate)) return candidate;
    }
    begin = end + 1;
  }
  return "";
}

PlotOutcome plot_latency_vs_rate(const std::string& dir, const std::string& csv_name,
                                 const std::vector<std::string>& designs, const SloConfig& slo) {
  // write_sweep_csv columns: 1 design, 2 rate, ..., 16-18 TTFT, 19-21 TBT, 22-24 E2E slowdown p50/p90/p99.
  std::string script = "set terminal svg size 1500,1100 dynamic font \"sans,11\"\n"
                       "set output \"latency_vs_rate.svg\"\n"
                       "set datafile separator \",\"\n"
                       "set logscale y\n"
                       "set grid\n"
                       "set key top left font \",8\" opaque\n"
                       "set multiplot layout 3,3 title \"Slowdown vs request rate (dashed: SLO)\"\n";
  const std::array<std::pair<const char*, Percentiles>, 3> metrics = {
      std::pair{"TTFT", slo.ttft}, std::pair{"TBT", slo.tbt}, std::pair{"E2E", slo.e2e}};
  for (size_t m = 0; m < 3; ++m) {
    const std::array<double, 3> limits = {metrics[m].second.p50, metrics[m].second.p90, metrics[m].second.p99};
    for (size_t q = 0; q < 3; ++q) {
      const size_t column = 16 + 3 * m + q;
      script += fmt::format("set title \"{} p{}\"\nset xlabel \"request rate (req/s)\"\nset ylabel \"slowdown\"\n",
                            metrics[m].first, std::array{50, 90, 99}[q]);
      script += "plot ";
      for (size_t d = 0; d < designs.size(); ++d)
        script += fmt::format("{} skip 1 using 2:(strcol(1) eq {} ? ${} : NaN) with linespoints pt 7 ps 0.5 title {}, ",
                              d == 0 ? gnuplot_string(csv_name) : "\"\"", gnuplot_string(csv_text(designs[d])), column,
                              gnuplot_string(designs[d]));
      script += fmt::format("{} with lines dt 2 lc rgb \"red\" notitle\n", limits[q]);
      script += "unset key\n";  // the first panel's key names the designs for all nine
    }
  }
  script += "unset multiplot\n";
  return write_and_draw(dir, "latency_vs_rate", script);
}

PlotOutcome plot_design_space(const std::string& dir, const std::string& csv_name, const Design& design,
                              double rate_per_s, const SearchPoint* optimum, const std::string& image_stem) {
  // write_search_csv columns: 1 design, 2 prompt, 3 token, 4 cost, 5 power, 6 rate, 7 slos_met.
  const std::string name = gnuplot_string(csv_text(design.name()));
  std::string script = fmt::format(
      "set terminal svg size 900,750 dynamic font \"sans,11\"\n"
      "set output \"{}.svg\"\n"
      "set datafile separator \",\"\n"
      "set title {}\n"
      "set xlabel \"prompt machines ({})\"\nset ylabel \"token machines ({})\"\nset cblabel \"cluster cost\"\n"
      "set palette defined (0 \"#1a9850\", 1 \"#fee08b\", 2 \"#d73027\")\n"
      "set key outside bottom center horizontal\n"
      "set style fill solid 1.0 noborder\n",
      image_stem, gnuplot_string(fmt::format("{} at {:g} req/s: shapes meeting all nine SLOs, by cost", design.name(),
                                             rate_per_s)),
      design.prompt_type, design.token_type);
  if (optimum != nullptr)
    script += fmt::format("set label 1 \"\" at {},{} point pt 3 ps 3 lc rgb \"black\" front\n",
                          optimum->shape.prompt_machines, optimum->shape.token_machines);
  script += fmt::format(
      "plot {0} skip 1 using 2:3:(0.5):(0.5):((strcol(1) eq {1} && $7 == 1) ? $4 : NaN) with boxxyerror lc palette "
      "title \"meets SLOs (colour: cost)\", \\\n"
      "     {0} skip 1 using 2:((strcol(1) eq {1} && $7 == 0) ? $3 : NaN):(0.5):(0.5) with boxxyerror "
      "lc rgb \"#d9d9d9\" title \"misses an SLO\"{2}\n",
      gnuplot_string(csv_name), name,
      optimum != nullptr ? ", \\\n     NaN with points pt 3 ps 2 lc rgb \"black\" title \"cheapest\"" : "");
  return write_and_draw(dir, image_stem, script);
}

}  // namespace splitflow::sim
