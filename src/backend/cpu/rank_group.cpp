#include "backend/cpu/rank_group.h"

#include "core/error.h"

#include <algorithm>
#include <cstring>

namespace splitflow {

CpuRankGroup::CpuRankGroup(int size)
    : size_(size), partials_(static_cast<size_t>(std::max(size, 1))), parts_(static_cast<size_t>(std::max(size, 1))),
      arrive_(size), summed_(size), copied_(size) {
  SF_CHECK(size >= 1, "cpu rank group: size must be >= 1, got {}", size);
}

void CpuRankGroup::allreduce(int rank, float* partial, float* residual, int64_t count) {
  SF_CHECK(rank >= 0 && rank < size_, "cpu rank group: rank {} outside a group of {}", rank, size_);
  partials_[static_cast<size_t>(rank)] = partial;
  arrive_.arrive_and_wait();
  if (rank == 0) {
    sum_.assign(partials_[0], partials_[0] + count);
    for (int r = 1; r < size_; ++r) {
      const float* other = partials_[static_cast<size_t>(r)];
      for (int64_t i = 0; i < count; ++i) sum_[static_cast<size_t>(i)] += other[i];
    }
  }
  summed_.arrive_and_wait();
  if (residual != nullptr) {
    for (int64_t i = 0; i < count; ++i) residual[i] += sum_[static_cast<size_t>(i)];
  } else {
    std::copy(sum_.begin(), sum_.begin() + count, partial);
  }
  copied_.arrive_and_wait();  // sum_ is rewritten by the next call only after every rank copied it
}

void CpuRankGroup::gather_columns(int rank, const float* part, float* full, int64_t rows, int64_t shard) {
  SF_CHECK(rank >= 0 && rank < size_, "cpu rank group: rank {} outside a group of {}", rank, size_);
  parts_[static_cast<size_t>(rank)] = part;
  arrive_.arrive_and_wait();
  const int64_t width = shard * size_;
  for (int r = 0; r < size_; ++r) {
    const float* from = parts_[static_cast<size_t>(r)];
    for (int64_t i = 0; i < rows; ++i) std::memcpy(full + i * width + r * shard, from + i * shard, shard * sizeof(float));
  }
  copied_.arrive_and_wait();  // a part is rewritten only after every rank copied it
}

void CpuRankGroup::allgather(int rank, float* data, int64_t count) {
  SF_CHECK(rank >= 0 && rank < size_, "cpu rank group: rank {} outside a group of {}", rank, size_);
  parts_[static_cast<size_t>(rank)] = data;
  arrive_.arrive_and_wait();
  for (int r = 0; r < size_; ++r)
    if (r != rank) std::memcpy(data + r * count, parts_[static_cast<size_t>(r)] + r * count, count * sizeof(float));
  copied_.arrive_and_wait();  // a rank's block is read by the others before it writes its data again
}

}  // namespace splitflow
