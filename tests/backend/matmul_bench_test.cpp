// Throughput of the CPU matmul paths on TinyLlama-1.1B projection shapes: GEMV in GB/s of weights
// (decode is bound by weight traffic), GEMM in GFLOP/s (prefill is bound by FMA throughput), and
// OpenBLAS sgemm on the same shapes for comparison. Runs only with SPLITFLOW_BENCH=1.
#include "backend/cpu/matmul.h"
#include "backend/backend_test_util.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#ifdef SPLITFLOW_HAS_BLAS
#include <cblas.h>
#endif

using namespace splitflow;

namespace {

bool bench_enabled() {
  const char* flag = std::getenv("SPLITFLOW_BENCH");
  return flag != nullptr && std::string(flag) == "1";
}

template <typename Fn>
double seconds_per_call(Fn&& fn, double min_seconds = 0.5) {
  fn();  // warm-up (page faults, caches)
  int calls = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0.0;
  do {
    fn();
    ++calls;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < min_seconds);
  return elapsed / calls;
}

struct ProjectionShape {
  const char* name;
  int64_t n, k;
};
const ProjectionShape kTinyLlama[] = {{"qkv", 2560, 2048}, {"o", 2048, 2048}, {"gate_up", 11264, 2048},
                                      {"down", 2048, 5632}, {"lm_head", 32000, 2048}};

TEST(MatmulBench, TinyLlamaShapes) {
  if (!bench_enabled()) GTEST_SKIP() << "set SPLITFLOW_BENCH=1";
  std::mt19937_64 rng(1);
  const int threads = 2;
  for (DType dtype : {DType::F16, DType::BF16, DType::F32})
    for (const ProjectionShape& shape : kTinyLlama) {
      Tensor w = Tensor::zeros(dtype, {shape.n, shape.k});
      const std::vector<float> values = test::random_floats(rng, shape.n * shape.k);
      convert_from_f32(values.data(), dtype, w.data, values.size());
      for (int64_t m : {1, 4, 64}) {
        const std::vector<float> x = test::random_floats(rng, m * shape.k);
        std::vector<float> y(m * shape.n);
        const double s = seconds_per_call(
            [&] { cpu::matmul(x.data(), m, shape.k, w.data, dtype, shape.n, nullptr, y.data(), threads); }, 0.3);
        const double gbs = w.nbytes() / s / 1e9, gflops = 2.0 * m * shape.n * shape.k / s / 1e9;
        std::printf("%-5s %-8s m=%-3lld %8.3f ms  %6.1f GB/s  %6.1f GFLOP/s\n", std::string(dtype_name(dtype)).c_str(),
                    shape.name, static_cast<long long>(m), s * 1e3, gbs, gflops);
#ifdef SPLITFLOW_HAS_BLAS
        if (dtype == DType::F32 && m == 64) {
          const double sb = seconds_per_call(
              [&] {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, shape.n, shape.k, 1.0f, x.data(), shape.k,
                            w.as<float>(), shape.k, 0.0f, y.data(), shape.n);
              },
              0.3);
          std::printf("      openblas m=%-3lld %8.3f ms  %6.1f GFLOP/s\n", static_cast<long long>(m), sb * 1e3,
                      2.0 * m * shape.n * shape.k / sb / 1e9);
        }
#endif
      }
    }
}

}  // namespace
