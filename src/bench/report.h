// bench/report.h — what every `splitflow bench` result carries: the device, the date, the commit
// and the roofline measured in the same run, written as JSON under bench/results/.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace splitflow::bench {

// "AMD EPYC (2 threads)" from /proc/cpuinfo and the OpenMP thread count.
std::string cpu_description(int threads);
// Best of several passes summing a buffer far larger than the caches, all threads: the rate at
// which this machine can stream weights from memory, in GB/s (1e9 bytes).
double measure_cpu_read_bandwidth_gbps(int threads);
// The source commit: $SPLITFLOW_COMMIT when set (a snapshot built outside the checkout), else `git describe --always --dirty` when run inside the checkout (a "-dirty" suffix marks uncommitted changes), else the commit
// the binary was configured at.
std::string source_commit();
// UTC, ISO 8601.
std::string utc_timestamp();
// The kernel-path switches set in the environment (SPLITFLOW_CUDA_Q8_ACTIVATIONS,
// SPLITFLOW_CPU_PIN, ...; docs/quantization.md, docs/cpu.md), by name: {} when every path is the
// default. So the two sides of an A/B run say which they were.
nlohmann::json kernel_switches();
// Writes `result` to `dir`/<name>-<timestamp>.json (with "kernel_switches" added) and returns the path.
std::string write_result(const nlohmann::json& result, const std::string& dir, const std::string& name);

}  // namespace splitflow::bench
