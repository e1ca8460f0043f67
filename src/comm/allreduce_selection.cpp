#include "comm/allreduce_selection.h"

#include "core/error.h"

namespace splitflow::comm {

namespace {

constexpr size_t KiB = 1024;
constexpr size_t MiB = 1024 * KiB;

constexpr const char* kMeasuredH200 = "measured: nvidia-h200-x2, NVLink (bench/results/allreduce)";
constexpr const char* kMeasuredH200x4 = "measured: nvidia-h200-x4, NVLink (bench/results/allreduce)";
constexpr const char* kMeasuredH200x8 = "measured: nvidia-h200-x8, NVLink, before LL128 (bench/results/allreduce)";
constexpr const char* kNoteNvlink = "design note (A100/V100 NVLink); not measured here";
constexpr const char* kNotePcie = "design note (4x A10 PCIe); not measured here";

// The table's row for the capability's link and world size, or null.
const CrossoverRow* find_row(const CustomCapability& capability, const std::vector<CrossoverRow>& table) {
  for (const CrossoverRow& row : table) {
    if (row.link == capability.link && row.world_size == capability.world_size) return &row;
  }
  return nullptr;
}

}  // namespace

std::string_view algorithm_name(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::Nccl: return "nccl";
    case AllreduceAlgorithm::OneShot: return "one_shot";
    case AllreduceAlgorithm::TwoShot: return "two_shot";
    case AllreduceAlgorithm::HalfButterfly: return "half_butterfly";
  }
  return "unknown";
}

AllreduceAlgorithm parse_algorithm(std::string_view text) {
  for (AllreduceAlgorithm algorithm : {AllreduceAlgorithm::Nccl, AllreduceAlgorithm::OneShot,
                                       AllreduceAlgorithm::TwoShot, AllreduceAlgorithm::HalfButterfly}) {
    if (text == algorithm_name(algorithm)) return algorithm;
  }
  fail("unknown allreduce algorithm '{}' (nccl, one_shot, two_shot, half_butterfly)", text);
}

std::string_view link_name(LinkType link) {
  switch (link) {
    case LinkType::NVLink: return "nvlink";
    case LinkType::PCIe: return "pcie";
    case LinkType::None: return "none";
  }
  return "unknown";
}

const std::vector<CrossoverRow>& default_crossovers() {
  using A = AllreduceAlgorithm;
  static const std::vector<CrossoverRow> table = {
      // Two H200s over NVLink: one-shot up to 64 MB, except two-shot (LL128) from 512 KB to 1 MB
      // (4.4 / 6.6 us vs 4.8 / 6.9; one-shot ahead at 256 KB and 2 MB); NCCL only past the
      // registered buffers. The fused RMSNorm: its one-shot kernel throughout (over LL128 up to
      // 32 rows: 4.4-5.9 us against the two-shot kernel's 5.9-6.1 at 8-32 rows of 8192 bf16;
      // reading at 64 rows, 8.2 against 9.7).
      {LinkType::NVLink, 2, 64 * MiB, A::Nccl, 0, kMeasuredH200, kNeverBytes, kNeverBytes, 512 * KiB, 1 * MiB},
      // Four H200s: one-shot (LL128) up to 256 KB, two-shot (LL128 to 2 MB, reads above) to 8 MB;
      // the fused RMSNorm's two-shot kernel from 256 KB (a tie there, ahead above; its own limit
      // is LL128's).
      {LinkType::NVLink, 4, 256 * KiB, A::TwoShot, 8 * MiB, kMeasuredH200x4, 256 * KiB, 8 * MiB},
      {LinkType::NVLink, 6, 256 * KiB, A::TwoShot, 8 * MiB, kNoteNvlink},
      {LinkType::NVLink, 8, 256 * KiB, A::TwoShot, 8 * MiB, kMeasuredH200x8},
      // Two GPUs: one-shot wins at every practical serving size whatever the link (the note).
      {LinkType::PCIe, 2, 8 * MiB, A::Nccl, 0, kNotePcie},
      // Without NVLink one-shot only wins below ~10 KB; half-butterfly up to 512 KB.
      {LinkType::PCIe, 4, 8 * KiB, A::HalfButterfly, 512 * KiB, kNotePcie},
      {LinkType::PCIe, 6, 8 * KiB, A::Nccl, 0, kNotePcie},
      {LinkType::PCIe, 8, 8 * KiB, A::HalfButterfly, 256 * KiB, kNotePcie},
  };
  return table;
}

bool custom_supports(AllreduceAlgorithm algorithm, const CustomCapability& capability, size_t bytes) {
  if (algorithm == AllreduceAlgorithm::Nccl) return true;
  const int n = capability.world_size;
  if (!capability.available || capability.link == LinkType::None) return false;
  if (n != 2 && n != 4 && n != 6 && n != 8) return false;
  if (bytes == 0 || bytes > capability.max_bytes) return false;
  if (algorithm == AllreduceAlgorithm::HalfButterfly) return (n & (n - 1)) == 0;
  return true;
}

AllreduceAlgorithm select_allreduce(size_t bytes, const CustomCapability& capability,
                                    std::optional<AllreduceAlgorithm> forced, const std::vector<CrossoverRow>& table) {
  if (forced) return custom_supports(*forced, capability, bytes) ? *forced : AllreduceAlgorithm::Nccl;
  const CrossoverRow* row = find_row(capability, table);
  if (row == nullptr) return AllreduceAlgorithm::Nccl;
  AllreduceAlgorithm choice = AllreduceAlgorithm::Nccl;
  if (bytes >= row->two_shot_band_min_bytes && bytes <= row->two_shot_band_max_bytes) {
    choice = AllreduceAlgorithm::TwoShot;
  } else if (bytes <= row->one_shot_max_bytes) {
    choice = AllreduceAlgorithm::OneShot;
  } else if (bytes <= row->then_max_bytes) {
    choice = row->then;
  }
  return custom_supports(choice, capability, bytes) ? choice : AllreduceAlgorithm::Nccl;
}

AllreduceAlgorithm select_fused_rmsnorm(size_t bytes, const CustomCapability& capability,
                                        std::optional<AllreduceAlgorithm> forced, const std::vector<CrossoverRow>& table) {
  const AllreduceAlgorithm plain = select_allreduce(bytes, capability, forced, table);
  if (forced || plain == AllreduceAlgorithm::Nccl) return plain;
  const CrossoverRow* row = find_row(capability, table);  // found: plain is custom
  if (bytes >= row->fused_two_shot_min_bytes && bytes <= row->fused_two_shot_max_bytes &&
      custom_supports(AllreduceAlgorithm::TwoShot, capability, bytes))
    return AllreduceAlgorithm::TwoShot;
  if (bytes <= row->one_shot_max_bytes && custom_supports(AllreduceAlgorithm::OneShot, capability, bytes))
    return AllreduceAlgorithm::OneShot;
  return plain;
}

}  // namespace splitflow::comm
