#include "comm/topology.h"

#include "comm/cuda_check.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace splitflow::comm {

namespace {

// The few NVML entry points used, loaded from the driver's libnvidia-ml at run time so nothing
// links against it (the CI machine has no driver).
struct Nvml {
  using Device = struct nvmlDevice_st*;
  using Status = int;
  static constexpr Status kSuccess = 0;
  static constexpr int kP2PCapsNvlink = 2;  // NVML_P2P_CAPS_INDEX_NVLINK
  static constexpr int kP2PStatusOk = 0;    // NVML_P2P_STATUS_OK
  static constexpr unsigned kMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS

  void* library = nullptr;
  Status (*init)() = nullptr;
  Status (*shutdown)() = nullptr;
  Status (*handle_by_bus_id)(const char*, Device*) = nullptr;
  Status (*p2p_status)(Device, Device, int, int*) = nullptr;
  Status (*nvlink_state)(Device, unsigned, int*) = nullptr;

  Nvml() {
    library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!library) return;
    init = reinterpret_cast<decltype(init)>(dlsym(library, "nvmlInit_v2"));
    shutdown = reinterpret_cast<decltype(shutdown)>(dlsym(library, "nvmlShutdown"));
    handle_by_bus_id = reinterpret_cast<decltype(handle_by_bus_id)>(dlsym(library, "nvmlDeviceGetHandleByPciBusId_v2"));
    p2p_status = reinterpret_cast<decltype(p2p_status)>(dlsym(library, "nvmlDeviceGetP2PStatus"));
    nvlink_state = reinterpret_cast<decltype(nvlink_state)>(dlsym(library, "nvmlDeviceGetNvLinkState"));
    if (!init || !shutdown || !handle_by_bus_id || !p2p_status || !nvlink_state || init() != kSuccess) {
      dlclose(library);
      library = nullptr;
    }
  }
  ~Nvml() {
    if (library) {
      shutdown();
      dlclose(library);
    }
  }
  bool ok() const { return library != nullptr; }

  Device device(const std::string& bus_id) const {
    Device handle = nullptr;
    return handle_by_bus_id(bus_id.c_str(), &handle) == kSuccess ? handle : nullptr;
  }
  int active_links(Device device) const {
    int active = 0;
    for (unsigned link = 0; link < kMaxLinks; ++link) {
      int state = 0;
      if (nvlink_state(device, link, &state) == kSuccess && state == 1) ++active;
    }
    return active;
  }
};

std::string bus_id_of(int device) {
  char text[64] = {};
  SF_CUDA_CHECK(cudaDeviceGetPCIBusId(text, sizeof text, device));
  return text;
}

int severity(LinkType link) { return link == LinkType::NVLink ? 0 : link == LinkType::PCIe ? 1 : 2; }

}  // namespace

Topology detect_topology(FileStore& store, int device) {
  const std::string my_bus = bus_id_of(device);
  const std::vector<std::string> buses = store.allgather("topology_bus_ids", my_bus);
  const Nvml nvml;
  const Nvml::Device my_nvml = nvml.ok() ? nvml.device(my_bus) : nullptr;

  LinkType mine = LinkType::NVLink;
  std::string text;
  for (int r = 0; r < store.world_size(); ++r) {
    if (r == store.rank()) continue;
    LinkType link = LinkType::None;
    std::string why;
    int peer = -1;
    if (cudaDeviceGetByPCIBusId(&peer, buses[r].c_str()) != cudaSuccess) {
      cudaGetLastError();
      why = "peer GPU not visible to this process";
    } else if (peer == device) {
      why = "same GPU as this rank";
    } else {
      int can_access = 0;
      SF_CUDA_CHECK(cudaDeviceCanAccessPeer(&can_access, device, peer));
      if (!can_access) {
        why = "no CUDA peer access";
      } else if (my_nvml) {
        const Nvml::Device peer_nvml = nvml.device(buses[r]);
        int status = -1;
        const bool nvlink = peer_nvml && nvml.p2p_status(my_nvml, peer_nvml, Nvml::kP2PCapsNvlink, &status) ==
                                             Nvml::kSuccess && status == Nvml::kP2PStatusOk;
        link = nvlink ? LinkType::NVLink : LinkType::PCIe;
        why = nvlink ? fmt::format("{} active links on this GPU, NVML", nvml.active_links(my_nvml)) : "NVML: no NVLink path";
      } else {
        // Without NVML: native peer atomics come with NVLink, not (usually) with PCIe.
        int atomics = 0;
        SF_CUDA_CHECK(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, device, peer));
        link = atomics ? LinkType::NVLink : LinkType::PCIe;
        why = "no NVML; guessed from CUDA peer atomics";
      }
    }
    if (severity(link) > severity(mine)) mine = link;
    if (!text.empty()) text += "; ";
    text += fmt::format("rank {} ({}) -> rank {} ({}): {} ({})", store.rank(), my_bus, r, buses[r], link_name(link), why);
  }

  const std::vector<std::string> views =
      store.allgather("topology_views", std::string(1, static_cast<char>('0' + severity(mine))) + text);
  Topology topology;
  topology.link = LinkType::NVLink;
  for (const std::string& view : views) {
    SF_CHECK(!view.empty(), "topology: a rank published an empty view");
    const int level = view[0] - '0';
    const LinkType link = level == 0 ? LinkType::NVLink : level == 1 ? LinkType::PCIe : LinkType::None;
    if (severity(link) > severity(topology.link)) topology.link = link;
    if (!topology.description.empty() && view.size() > 1) topology.description += "; ";
    topology.description += view.substr(1);
  }
  return topology;
}

}  // namespace splitflow::comm
