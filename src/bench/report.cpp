#include "bench/report.h"

#include "backend/cpu/stream_read.h"
#include "core/error.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#ifndef SPLITFLOW_CONFIGURED_COMMIT
#define SPLITFLOW_CONFIGURED_COMMIT "unknown"
#endif

namespace splitflow::bench {

std::string cpu_description(int threads) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return model + " (" + std::to_string(threads) + " threads)";
}

double measure_cpu_read_bandwidth_gbps(int threads) {
  const size_t bytes = size_t{1} << 30;  // far beyond any cache
  std::unique_ptr<uint8_t[]> buffer(new uint8_t[bytes]);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t i = 0; i < bytes; ++i) buffer[i] = static_cast<uint8_t>(i);
  double best_seconds = 1e30;
  uint64_t checksum = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    checksum ^= cpu::stream_read(buffer.get(), bytes, threads);
    best_seconds = std::min(best_seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  if (checksum == 1) std::fputs("", stderr);  // keeps the reads observable
  return static_cast<double>(bytes) / best_seconds / 1e9;
}

std::string source_commit() {
  // A snapshot of the tree built elsewhere says which commit it is (scripts/gpu_snapshot.sh).
  if (const char* given = std::getenv("SPLITFLOW_COMMIT"); given != nullptr && *given != '\0') return given;
  std::array<char, 64> buffer{};
  std::string commit;
  if (FILE* pipe = ::popen("git describe --always --dirty --abbrev=7 2>/dev/null", "r")) {
    while (std::fgets(buffer.data(), buffer.size(), pipe)) commit += buffer.data();
    ::pclose(pipe);
  }
  while (!commit.empty() && (commit.back() == '\n' || commit.back() == ' ')) commit.pop_back();
  if (!commit.empty()) return commit;
  // A copy of the tree without .git (the GPU machine) configures with an empty commit.
  const std::string configured = SPLITFLOW_CONFIGURED_COMMIT;
  return configured.empty() ? "unknown" : configured;
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

nlohmann::json kernel_switches() {
  // Only these names: the environment may hold secrets (SPLITFLOW_API_KEY).
  static constexpr const char* kNames[] = {"SPLITFLOW_ALLREDUCE",          "SPLITFLOW_CPU_PIN",
                                           "SPLITFLOW_CPU_Q8_ACTIVATIONS", "SPLITFLOW_CUDA_F16_ACTIVATIONS",
                                           "SPLITFLOW_CUDA_Q8_ACTIVATIONS", "SPLITFLOW_GEMV_MAX_ROWS",
                                           "SPLITFLOW_QUANT_GEMM",         "SPLITFLOW_QUANT_MMA",
                                           "SPLITFLOW_QUANTIZE_ON_DEVICE"};
  nlohmann::json switches = nlohmann::json::object();
  for (const char* name : kNames)
    if (const char* value = std::getenv(name); value != nullptr) switches[name] = value;
  return switches;
}

std::string write_result(const nlohmann::json& result, const std::string& dir, const std::string& name) {
  std::filesystem::create_directories(dir);
  nlohmann::json written = result;
  if (written.is_object() && !written.contains("kernel_switches")) written["kernel_switches"] = kernel_switches();
  std::string stamp = utc_timestamp();
  std::replace(stamp.begin(), stamp.end(), ':', '-');
  const std::string path = dir + "/" + name + "-" + stamp + ".json";
  std::ofstream out(path);
  SF_CHECK(out.good(), "cannot write benchmark result '{}'", path);
  out << written.dump(2) << "\n";
  return path;
}

}  // namespace splitflow::bench
