#include "backend/cpu/stream_read.h"

#include "backend/cpu/simd.h"

#include <omp.h>

#include <algorithm>

namespace splitflow::cpu {

uint64_t stream_read(const void* data, size_t bytes, int num_threads) {
  const auto* base = static_cast<const uint8_t*>(data);
  const int64_t lines = static_cast<int64_t>(bytes / 64);
  uint64_t checksum = 0;
#pragma omp parallel for num_threads(num_threads) schedule(static) reduction(^ : checksum)
  for (int64_t chunk = 0; chunk < (lines + 1023) / 1024; ++chunk) {
    const int64_t end = std::min(lines, (chunk + 1) * 1024);
#ifdef SPLITFLOW_CPU_AVX2
    __m256i a = _mm256_setzero_si256(), b = a;
    for (int64_t line = chunk * 1024; line < end; ++line) {
      a = _mm256_xor_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + line * 64)));
      b = _mm256_xor_si256(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + line * 64 + 32)));
    }
    a = _mm256_xor_si256(a, b);
    checksum ^= static_cast<uint64_t>(_mm256_extract_epi64(a, 0) ^ _mm256_extract_epi64(a, 1) ^
                                      _mm256_extract_epi64(a, 2) ^ _mm256_extract_epi64(a, 3));
#else
    for (int64_t line = chunk * 1024; line < end; ++line)
      for (int word = 0; word < 8; ++word) checksum ^= reinterpret_cast<const uint64_t*>(base + line * 64)[word];
#endif
  }
  for (size_t i = static_cast<size_t>(lines) * 64; i < bytes; ++i) checksum ^= base[i];
  return checksum;
}

}  // namespace splitflow::cpu
