#include "backend/cpu/fma_peak.h"

#include "backend/cpu/simd.h"
#include "backend/cpu/thread_team.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>

namespace splitflow::cpu {
namespace {

// 12 independent accumulators in named registers (an array gets spilled to the stack by GCC, and
// the chains then wait on store forwarding): more than FMA latency x FMA pipes on current cores.
// FLOPs: iterations x 12 x 2 x lanes.
#define SPLITFLOW_FMA_CHAINS(VEC, SET1, FMA, ADD, REDUCE)                                       \
  VEC c0 = SET1(seed), c1 = SET1(seed + 1), c2 = SET1(seed + 2), c3 = SET1(seed + 3);          \
  VEC c4 = SET1(seed + 4), c5 = SET1(seed + 5), c6 = SET1(seed + 6), c7 = SET1(seed + 7);      \
  VEC c8 = SET1(seed + 8), c9 = SET1(seed + 9), c10 = SET1(seed + 10), c11 = SET1(seed + 11);  \
  const VEC a = SET1(0.999999f), b = SET1(1e-7f);                                              \
  for (long i = 0; i < iterations; ++i) {                                                      \
    c0 = FMA(c0, a, b), c1 = FMA(c1, a, b), c2 = FMA(c2, a, b), c3 = FMA(c3, a, b);            \
    c4 = FMA(c4, a, b), c5 = FMA(c5, a, b), c6 = FMA(c6, a, b), c7 = FMA(c7, a, b);            \
    c8 = FMA(c8, a, b), c9 = FMA(c9, a, b), c10 = FMA(c10, a, b), c11 = FMA(c11, a, b);        \
  }                                                                                            \
  return REDUCE(ADD(ADD(ADD(ADD(c0, c1), ADD(c2, c3)), ADD(ADD(c4, c5), ADD(c6, c7))),         \
                    ADD(ADD(c8, c9), ADD(c10, c11))));
#if defined(SPLITFLOW_CPU_AVX512)
constexpr int kLanes = 16;
float fma_chains(long iterations, float seed) {
  SPLITFLOW_FMA_CHAINS(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_reduce_add_ps)
}
#elif defined(SPLITFLOW_CPU_AVX2)
constexpr int kLanes = 8;
float fma_chains(long iterations, float seed) {
  SPLITFLOW_FMA_CHAINS(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, hsum)
}
#else
constexpr int kLanes = 1;
inline float scalar_fma(float x, float y, float z) { return std::fma(x, y, z); }
inline float scalar_add(float x, float y) { return x + y; }
inline float scalar_set1(float x) { return x; }
inline float scalar_reduce(float x) { return x; }
float fma_chains(long iterations, float seed) {
  SPLITFLOW_FMA_CHAINS(float, scalar_set1, scalar_fma, scalar_add, scalar_reduce)
}
#endif
#undef SPLITFLOW_FMA_CHAINS

}  // namespace

double measure_fma_peak_gflops(int num_threads) {
  // On the kernels' own team (pinned, thread_team.h), in many chunks so the rate is the team's
  // whatever share of it each thread gets.
  const long chunk_iterations = 1'000'000;
  const int64_t chunks = 32 * int64_t{num_threads};
  double best_seconds = 1e30;
  std::atomic<uint32_t> sink{0};
  for (int pass = 0; pass < 3; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    parallel_chunks(num_threads, chunks, [&](int64_t chunk) {
      const float result = fma_chains(chunk_iterations, static_cast<float>(chunk));
      sink.fetch_add(static_cast<uint32_t>(result), std::memory_order_relaxed);  // keeps the chains
    });
    best_seconds = std::min(best_seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return static_cast<double>(chunks) * chunk_iterations * 12 * 2 * kLanes / best_seconds / 1e9;
}

}  // namespace splitflow::cpu
