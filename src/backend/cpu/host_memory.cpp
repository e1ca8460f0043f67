#include "backend/cpu/host_memory.h"

#include "core/error.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace splitflow::cpu {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> read_small_file(const fs::path& path) {
  std::ifstream file(path);
  if (!file) return std::nullopt;
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

std::string_view trimmed(std::string_view text) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

std::optional<int64_t> parse_int(std::string_view text) {
  text = trimmed(text);
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

// One limited cgroup level: its limit and current usage.
struct CgroupLimit {
  int64_t limit = 0, usage = 0;
};

// The limits on the way from the cgroup `path` (as /proc/self/cgroup gives it) up to the
// hierarchy's root under `mount`: a limit file holding "max" (v2) or missing is no limit.
std::vector<CgroupLimit> cgroup_limits(const fs::path& mount, std::string_view path, const char* limit_file,
                                       const char* usage_file) {
  std::vector<fs::path> dirs = {mount};
  for (const fs::path& part : fs::path(std::string(path)).relative_path()) {
    if (!part.empty()) dirs.push_back(dirs.back() / part);
  }
  std::vector<CgroupLimit> limits;
  for (const fs::path& dir : dirs) {
    const std::optional<std::string> limit_text = read_small_file(dir / limit_file);
    const std::optional<int64_t> limit = limit_text ? parse_int(*limit_text) : std::nullopt;
    if (!limit) continue;
    const std::optional<std::string> usage_text = read_small_file(dir / usage_file);
    const std::optional<int64_t> usage = usage_text ? parse_int(*usage_text) : std::nullopt;
    limits.push_back({*limit, usage.value_or(0)});
  }
  return limits;
}

}  // namespace

std::optional<int64_t> meminfo_bytes(std::string_view meminfo, std::string_view key) {
  size_t line_start = 0;
  while (line_start < meminfo.size()) {
    size_t line_end = meminfo.find('\n', line_start);
    if (line_end == std::string_view::npos) line_end = meminfo.size();
    const std::string_view line = meminfo.substr(line_start, line_end - line_start);
    line_start = line_end + 1;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || line.substr(0, colon) != key) continue;
    std::string_view value = trimmed(line.substr(colon + 1));
    int64_t multiplier = 1;
    if (value.size() >= 2 && value.substr(value.size() - 2) == "kB") {
      multiplier = 1024;
      value.remove_suffix(2);
    }
    const std::optional<int64_t> number = parse_int(value);
    if (!number) return std::nullopt;
    return *number * multiplier;
  }
  return std::nullopt;
}

DeviceMemoryInfo read_host_memory(const std::string& root) {
  const fs::path base(root);
  DeviceMemoryInfo memory;
  if (const std::optional<std::string> meminfo = read_small_file(base / "proc/meminfo")) {
    const std::optional<int64_t> total = meminfo_bytes(*meminfo, "MemTotal");
    const std::optional<int64_t> available = meminfo_bytes(*meminfo, "MemAvailable");
    if (total) memory.total_bytes = *total;
    // Kernels before 3.14 have no MemAvailable: free pages alone (an underestimate).
    memory.free_bytes = available ? *available : meminfo_bytes(*meminfo, "MemFree").value_or(0);
  }
  if (memory.total_bytes <= 0) {
    const long page = sysconf(_SC_PAGESIZE), pages = sysconf(_SC_PHYS_PAGES), free_pages = sysconf(_SC_AVPHYS_PAGES);
    SF_CHECK(page > 0 && pages > 0, "host memory: neither {} nor sysconf gives the memory size",
             (base / "proc/meminfo").string());
    memory.total_bytes = int64_t{page} * pages;
    memory.free_bytes = free_pages > 0 ? int64_t{page} * free_pages : 0;
  }

  // Lines of /proc/self/cgroup: "hierarchy-id:controllers:path"; v2 is "0::path".
  std::vector<CgroupLimit> limits;
  if (const std::optional<std::string> cgroups = read_small_file(base / "proc/self/cgroup")) {
    std::istringstream lines(*cgroups);
    std::string line;
    while (std::getline(lines, line)) {
      const size_t first = line.find(':'), second = first == std::string::npos ? first : line.find(':', first + 1);
      if (second == std::string::npos) continue;
      const std::string controllers = line.substr(first + 1, second - first - 1), path = line.substr(second + 1);
      std::vector<CgroupLimit> found;
      if (line.substr(0, first) == "0" && controllers.empty()) {
        // Unified hierarchy at /sys/fs/cgroup, or at /sys/fs/cgroup/unified beside v1 ones.
        for (const char* mount : {"sys/fs/cgroup", "sys/fs/cgroup/unified"}) {
          found = cgroup_limits(base / mount, path, "memory.max", "memory.current");
          limits.insert(limits.end(), found.begin(), found.end());
        }
      } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
        found = cgroup_limits(base / "sys/fs/cgroup/memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes");
        limits.insert(limits.end(), found.begin(), found.end());
      }
    }
  }
  for (const CgroupLimit& cgroup : limits) {
    memory.total_bytes = std::min(memory.total_bytes, cgroup.limit);
    memory.free_bytes = std::min(memory.free_bytes, std::max<int64_t>(cgroup.limit - cgroup.usage, 0));
  }
  memory.free_bytes = std::clamp<int64_t>(memory.free_bytes, 0, memory.total_bytes);
  return memory;
}

}  // namespace splitflow::cpu
