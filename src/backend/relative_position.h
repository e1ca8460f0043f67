// backend/relative_position.h — T5's relative position bucket, the one definition both backends'
// attention kernels use (the CPU's per-batch bucket table, the CUDA kernel per score): host and
// device code alike, nothing but arithmetic.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define SPLITFLOW_HOST_DEVICE __host__ __device__
#else
#define SPLITFLOW_HOST_DEVICE
#endif

namespace splitflow {

// transformers' T5Attention._relative_position_bucket for relative = key - query position, in its
// f32 arithmetic (torch.log of an f32 tensor, divided by a Python float, scaled, truncated).
SPLITFLOW_HOST_DEVICE inline int32_t relative_position_bucket(int64_t relative, int num_buckets, int max_distance,
                                                              bool bidirectional) {
  int32_t bucket = 0;
  int64_t distance;
  if (bidirectional) {
    num_buckets /= 2;
    if (relative > 0) bucket += num_buckets;
    distance = relative < 0 ? -relative : relative;
  } else {
    distance = relative < 0 ? -relative : 0;
  }
  const int max_exact = num_buckets / 2;
  if (distance < max_exact) return bucket + static_cast<int32_t>(distance);
  const float ratio = logf(static_cast<float>(distance) / static_cast<float>(max_exact));
  const float scaled = ratio / static_cast<float>(log(static_cast<double>(max_distance) / max_exact)) *
                       static_cast<float>(num_buckets - max_exact);
  const int64_t large = max_exact + static_cast<int64_t>(scaled);
  return bucket + static_cast<int32_t>(large < num_buckets - 1 ? large : num_buckets - 1);
}

}  // namespace splitflow
