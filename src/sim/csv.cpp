#include "sim/csv.h"

#include <charconv>
#include <fstream>

#include "core/error.h"

namespace splitflow::sim {

namespace {

std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> fields;
  size_t start = 0;
  while (true) {
    const size_t comma = line.find(',', start);
    fields.push_back(line.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return fields;
}

}  // namespace

CsvTable read_csv(const std::string& path) {
  std::ifstream in(path);
  SF_CHECK(in, "cannot open CSV file '{}'", path);
  CsvTable table;
  table.path = path;
  std::string line;
  size_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::vector<std::string> fields = split_fields(line);
    if (table.header.empty()) {
      table.header = std::move(fields);
      continue;
    }
    SF_CHECK(fields.size() == table.header.size(), "{}: line {} has {} fields, the header has {}",
             path, line_number, fields.size(), table.header.size());
    table.rows.push_back(std::move(fields));
  }
  SF_CHECK(!table.header.empty(), "{}: empty CSV file (no header)", path);
  return table;
}

size_t CsvTable::column(const std::string& name) const {
  for (size_t i = 0; i < header.size(); ++i)
    if (header[i] == name) return i;
  fail("{}: missing column '{}'", path, name);
}

double CsvTable::number(size_t row, size_t col) const {
  const std::string& field = rows[row][col];
  double value = 0;
  auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
  SF_CHECK(ec == std::errc() && end == field.data() + field.size() && !field.empty(),
           "{}: data row {}, column '{}': '{}' is not a number", path, row + 1, header[col], field);
  return value;
}

int64_t CsvTable::integer(size_t row, size_t col) const {
  const std::string& field = rows[row][col];
  int64_t value = 0;
  auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
  SF_CHECK(ec == std::errc() && end == field.data() + field.size() && !field.empty(),
           "{}: data row {}, column '{}': '{}' is not an integer", path, row + 1, header[col], field);
  return value;
}

}  // namespace splitflow::sim
