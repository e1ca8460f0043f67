// bench/probes/cpu_gemv_bandwidth.cpp — how close the CPU backend's decode GEMV (backend/cpu/
// matmul.h, one row of x) comes to the machine's read bandwidth, per weight dtype: the matrices
// of L TinyLlama-shaped layers (qkv 2560x2048, o 2048x2048, gate/up 11264x2048, down 2048x5632,
// far beyond the L3) are multiplied in decode order, as a decode step reads them, against
// stream_read over the same bytes. Q8=0: quantized types with fp32 activations. A design probe for issue 31, not part of the build:
//   g++ -O3 -march=native -fopenmp -std=c++20 -Isrc bench/probes/cpu_gemv_bandwidth.cpp \
//     build/libsplitflow_lib.a -lfmt -o /tmp/gemv_bw && /tmp/gemv_bw f16 q8_0 q4_0
// Results: docs/cpu.md.
#include "backend/cpu/matmul.h"
#include "backend/cpu/stream_read.h"
#include "core/dtype.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace splitflow;

int main(int argc, char** argv) {
  const int threads = std::getenv("THREADS") ? std::atoi(std::getenv("THREADS")) : 2;
  const int layers = std::getenv("LAYERS") ? std::atoi(std::getenv("LAYERS")) : 8;
  const bool q8 = std::getenv("Q8") == nullptr || std::atoi(std::getenv("Q8")) != 0;  // Q8 activations
  if (std::getenv("PIN") && std::atoi(std::getenv("PIN")) != 0) {
#pragma omp parallel num_threads(threads)
    {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(omp_get_thread_num(), &set);
      pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    }
  }
  const int64_t shapes[4][2] = {{2560, 2048}, {2048, 2048}, {11264, 2048}, {2048, 5632}};
  for (int a = 1; a < argc; ++a) {
    const DType type = parse_dtype(argv[a]);
    std::vector<std::vector<uint8_t>> mats;
    size_t total = 0;
    std::mt19937_64 rng(1);
    for (int l = 0; l < layers; ++l)
      for (const auto& s : shapes) {
        std::vector<uint8_t> m(dtype_row_bytes(type, s[1]) * s[0]);
        for (size_t i = 0; i + 8 <= m.size(); i += 8) {
          const uint64_t r = rng() & 0x3bff3bff3bff3bffull;  // finite f16s whatever the layout
          std::memcpy(&m[i], &r, 8);
        }
        total += m.size();
        mats.push_back(std::move(m));
      }
    std::vector<float> x(5632, 0.01f), y(11264);
    double best = 1e30, best_read = 1e30;
    uint64_t sum = 0;
    for (int rep = 0; rep < 5; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      for (int l = 0; l < layers; ++l)
        for (int i = 0; i < 4; ++i)
          cpu::matmul_strided(x.data(), 1, shapes[i][1], mats[l * 4 + i].data(), type, shapes[i][0], y.data(),
                              shapes[i][0], cpu::MatmulMode{false, q8}, threads);
      auto t1 = std::chrono::steady_clock::now();
      for (auto& m : mats) sum ^= cpu::stream_read(m.data(), m.size(), threads);
      auto t2 = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
      best_read = std::min(best_read, std::chrono::duration<double>(t2 - t1).count());
    }
    std::printf("%-6s %7.1f MB  gemv %6.2f GB/s  stream_read %6.2f GB/s  fraction %.3f  (%llu)\n", argv[a], total / 1e6,
                total / best / 1e9, total / best_read / 1e9, best_read / best, (unsigned long long)(sum & 1));
  }
}
