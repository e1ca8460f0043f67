// comm/topology.h — how the GPUs of a job are linked, detected at start-up: NVLink when NVML
// reports an NVLink peer-to-peer path between every pair, PCIe when every pair only has CUDA peer
// access, None when some pair has none (or a peer's GPU is not visible to this process). Every
// rank reaches the same answer: each rank reports its own pairs and the worst link wins.
#pragma once

#include "comm/allreduce_selection.h"
#include "comm/file_store.h"

#include <string>

namespace splitflow::comm {

struct Topology {
  LinkType link = LinkType::None;
  // Every rank's view, e.g. "rank 0 (0000:18:00.0) -> rank 1 (0000:2A:00.0): nvlink (18 active links, NVML)".
  std::string description;
};

// Collective over `store`; `device` is this rank's CUDA device.
Topology detect_topology(FileStore& store, int device);

}  // namespace splitflow::comm
