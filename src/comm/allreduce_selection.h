// comm/allreduce_selection.h — which allreduce runs a message: NCCL or one of the custom CUDA-IPC
// algorithms (comm/custom_allreduce.h), chosen from the message size, the world size and the link
// between the GPUs (NVLink or PCIe, detected at start-up), by a crossover table that the
// `splitflow bench allreduce` results justify (docs/comm.md). Pure CPU logic: every rank must
// reach the same choice from the same inputs, so nothing here may depend on a rank's pointers.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

namespace splitflow::comm {

enum class AllreduceAlgorithm : unsigned char {
  Nccl,
  OneShot,        // every rank reads every peer's whole buffer: latency L
  TwoShot,        // reduce-scatter then allgather: 2L, bandwidth-optimal
  HalfButterfly,  // log2(N) pairwise full exchanges: for PCIe without switches (N a power of two)
};

enum class LinkType : unsigned char {
  NVLink,  // every pair of GPUs in the job has an NVLink path
  PCIe,    // every pair can reach the other's memory (P2P), at least one pair only over PCIe
  None,    // some pair has no peer access: custom algorithms cannot run
};

std::string_view algorithm_name(AllreduceAlgorithm algorithm);  // "nccl", "one_shot", ...
// Parses algorithm_name()'s spellings; throws splitflow::Error naming `text` and the choices.
AllreduceAlgorithm parse_algorithm(std::string_view text);
std::string_view link_name(LinkType link);  // "nvlink", "pcie", "none"

// Sizes no message reaches: a crossover that never happens.
inline constexpr size_t kNeverBytes = ~size_t{0};

// One row per (link, world size): OneShot up to one_shot_max_bytes, except TwoShot from
// two_shot_band_min_bytes to two_shot_band_max_bytes, then `then` up to then_max_bytes, NCCL
// above. The fused allreduce + residual + RMSNorm runs its two-shot kernel from
// fused_two_shot_min_bytes to fused_two_shot_max_bytes, its one-shot kernel elsewhere in the
// one-shot range (where the custom path takes the message).
struct CrossoverRow {
  LinkType link;
  int world_size;
  size_t one_shot_max_bytes;
  AllreduceAlgorithm then;
  size_t then_max_bytes;
  const char* source;  // where the numbers come from
  size_t fused_two_shot_min_bytes = kNeverBytes;
  size_t fused_two_shot_max_bytes = kNeverBytes;
  size_t two_shot_band_min_bytes = kNeverBytes;
  size_t two_shot_band_max_bytes = kNeverBytes;
};

// The shipped table (rows not measured here say so in `source`).
const std::vector<CrossoverRow>& default_crossovers();

// What the custom allreduce can do in this job.
struct CustomCapability {
  bool available = false;  // IPC buffers exchanged at start-up
  LinkType link = LinkType::None;
  int world_size = 1;
  size_t max_bytes = 0;  // capacity of the registered buffers
};

// Custom kernels exist for N = 2, 4, 6, 8 (HalfButterfly: 2, 4, 8), messages of 1 byte to
// max_bytes, with peer access between every pair.
bool custom_supports(AllreduceAlgorithm algorithm, const CustomCapability& capability, size_t bytes);

// The algorithm for a message of `bytes`: the table's choice when the custom path supports it,
// NCCL otherwise. `forced` (e.g. from SPLITFLOW_ALLREDUCE) wins when it is supported.
AllreduceAlgorithm select_allreduce(size_t bytes, const CustomCapability& capability,
                                    std::optional<AllreduceAlgorithm> forced = std::nullopt,
                                    const std::vector<CrossoverRow>& table = default_crossovers());

// The fused allreduce + residual + RMSNorm for a message of `bytes`, when the custom path takes
// it: TwoShot (the two-shot kernel) within the row's fused two-shot range, OneShot (the one-shot
// kernel) elsewhere in its one-shot range, else select_allreduce's choice (a custom algorithm: it
// with the residual, then the norm). NCCL where select_allreduce picks NCCL (allreduce, add,
// norm). `forced` wins as in select_allreduce.
AllreduceAlgorithm select_fused_rmsnorm(size_t bytes, const CustomCapability& capability,
                                        std::optional<AllreduceAlgorithm> forced = std::nullopt,
                                        const std::vector<CrossoverRow>& table = default_crossovers());

}  // namespace splitflow::comm
