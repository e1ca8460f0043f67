// backend/cuda/device_info.cu — first piece of the CUDA backend: device discovery. The full
// backend (issue 3) implements backend/backend.h on top of this library.
#include "backend/cuda/device_info.h"

#include <cuda_runtime.h>

namespace splitflow::cuda {

std::vector<DeviceInfo> list_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return {};
  }
  std::vector<DeviceInfo> devices;
  for (int index = 0; index < count; ++index) {
    cudaDeviceProp props{};
    if (cudaGetDeviceProperties(&props, index) != cudaSuccess) continue;
    devices.push_back({index, props.name, props.totalGlobalMem, props.major, props.minor, props.multiProcessorCount});
  }
  return devices;
}

}  // namespace splitflow::cuda
