// sim/csv.h — a minimal reader for the simulator's comma-separated inputs (profiles, traces):
// a header row, then rows of plain fields (no quoting). Typed accessors name file, row and column
// on a bad value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace splitflow::sim {

struct CsvTable {
  std::string path;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;

  size_t column(const std::string& name) const;  // fails when the header lacks `name`
  const std::string& text(size_t row, size_t col) const { return rows[row][col]; }
  double number(size_t row, size_t col) const;
  int64_t integer(size_t row, size_t col) const;
};

CsvTable read_csv(const std::string& path);

}  // namespace splitflow::sim
