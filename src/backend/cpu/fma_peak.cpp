#include "backend/cpu/fma_peak.h"

#include "backend/cpu/simd.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace splitflow::cpu {
namespace {

// 12 independent accumulators (more than FMA latency x FMA pipes on current cores); returns their
// sum so the chains are kept. FLOPs: iterations x 12 x 2 x lanes.
#if defined(SPLITFLOW_CPU_AVX512)
constexpr int kLanes = 16;
float fma_chains(long iterations, float seed) {
  __m512 acc[12];
  for (int c = 0; c < 12; ++c) acc[c] = _mm512_set1_ps(seed + static_cast<float>(c));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < iterations; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < 12; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  __m512 sum = acc[0];
  for (int c = 1; c < 12; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return _mm512_reduce_add_ps(sum);
}
#elif defined(SPLITFLOW_CPU_AVX2)
constexpr int kLanes = 8;
float fma_chains(long iterations, float seed) {
  __m256 acc[12];
  for (int c = 0; c < 12; ++c) acc[c] = _mm256_set1_ps(seed + static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iterations; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < 12; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  __m256 sum = acc[0];
  for (int c = 1; c < 12; ++c) sum = _mm256_add_ps(sum, acc[c]);
  return hsum(sum);
}
#else
constexpr int kLanes = 1;
float fma_chains(long iterations, float seed) {
  float acc[12];
  for (int c = 0; c < 12; ++c) acc[c] = seed + static_cast<float>(c);
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < 12; ++c) acc[c] = std::fma(acc[c], 0.999999f, 1e-7f);
  float sum = 0.0f;
  for (float value : acc) sum += value;
  return sum;
}
#endif

}  // namespace

double measure_fma_peak_gflops(int num_threads) {
  const long iterations = 20'000'000;
  double best_seconds = 1e30;
  float sink = 0.0f;
  for (int pass = 0; pass < 3; ++pass) {
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(num_threads) reduction(+ : sink)
    sink += fma_chains(iterations, static_cast<float>(omp_get_thread_num()));
    best_seconds = std::min(best_seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  static volatile float observed;  // keeps the chains' results, so they are computed
  observed = sink;
  return static_cast<double>(num_threads) * iterations * 12 * 2 * kLanes / best_seconds / 1e9;
}

}  // namespace splitflow::cpu
