// core/counter_hash.h — counter-based random numbers: a value is a pure function of (key, index),
// so any thread order, and the CPU and the GPU, produce the same numbers. Used by the seeded
// dummy weights (core/tensor.h GeneratedNormal, filled on the host or the GPU) and by the sampling rule's Gumbel noise
// (sampling/sampling_rule.h, on the CPU and the GPU). Compiles as C++17 under nvcc (host and device).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define SF_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SF_HOST_DEVICE inline
#endif

namespace splitflow {

// splitmix64's finalizer.
SF_HOST_DEVICE uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Wellons' lowbias32 (vectorizes with AVX2 on the CPU).
SF_HOST_DEVICE uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}

// Approximately N(0, 1): four 16-bit uniforms from two hashes, summed (Irwin-Hall): mean 131070,
// stddev sqrt(4 * (65536^2 - 1) / 12) = 37837.23. Exact integer sum, one float rounding: the
// CPU and the GPU agree bit for bit.
SF_HOST_DEVICE float unit_normal(uint32_t key, uint32_t index) {
  const uint32_t a = hash32(key ^ (2 * index)), b = hash32(key ^ (2 * index + 1));
  const uint32_t sum = (a & 0xffffu) + (a >> 16) + (b & 0xffffu) + (b >> 16);
  return (static_cast<float>(sum) - 131070.0f) * (1.0f / 37837.23f);
}

// Element `index` of a tensor of seeded normal values (the dummy weights, core/tensor.h
// GeneratedNormal): stddev * unit_normal, each block of 2^31 elements under its own 32-bit key so
// the index fits the 32-bit hash. The host fill and the CUDA fill both call this.
SF_HOST_DEVICE float generated_normal_value(uint64_t key, float stddev, int64_t index) {
  constexpr int64_t kBlock = int64_t{1} << 31;
  const int64_t block_start = index & ~(kBlock - 1);
  const auto block_key = static_cast<uint32_t>(mix64(key + static_cast<uint64_t>(block_start)));
  return stddev * unit_normal(block_key, static_cast<uint32_t>(index - block_start));
}

// Uniform in (0, 1): the centres (k + 0.5) / 2^23 of 2^23 cells, exact in a float, so never 0 or 1.
// (With 24 bits, k + 0.5 rounds up to 2^24 for the top k and gives 1.0, whose Gumbel noise is +inf.)
SF_HOST_DEVICE float unit_uniform(uint32_t key, uint32_t index) {
  return (static_cast<float>(hash32(key ^ hash32(index)) >> 9) + 0.5f) * (1.0f / 8388608.0f);
}

}  // namespace splitflow
