// backend/cuda/device_info.h — the GPUs this process can see (empty without a GPU or driver).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace splitflow::cuda {

struct DeviceInfo {
  int index;
  std::string name;
  size_t memory_bytes;
  int compute_major, compute_minor;
  int multiprocessors;
};

std::vector<DeviceInfo> list_devices();

}  // namespace splitflow::cuda
