#include "backend/cpu/interleaved_rows.h"

#include "backend/cpu/q8_block_codes.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_team.h"
#include "core/error.h"
#include "core/mapped_file.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace splitflow::cpu {

namespace {

constexpr int64_t kGroupRows = 16;

// A type's block as stored and as repacked: a group's block holds the 16 f16 scales, then (Q4_1,
// Q5_1) the 16 f16 minima, then (Q5_0, Q5_1) the rows' fifth bits as 4 bytes each (byte i: the
// bits of elements 4i .. 4i + 3 in its low nibble, of 4i + 16 .. 4i + 19 in its high one, for the
// code load i that holds those elements), then `loads` runs of 64 code bytes (4 bytes of each row).
struct RepackLayout {
  int64_t stored_bytes;  // one row's block as stored
  int codes_at;          // where its code bytes start
  bool min;              // an f16 minimum after the scale
  int loads;             // 64-byte code loads per group block (nibbles: 4, bytes: 8)
  uint32_t bias;         // XORed into every code byte (Q8_0: signed to unsigned)
  int correction;        // the codes' zero point, times -1
  int high_at = -1;      // where the stored 32-bit mask of fifth bits starts (Q5_0, Q5_1)
  constexpr int high_group_at() const { return min ? 64 : 32; }
  constexpr int codes_group_at() const { return high_group_at() + (high_at >= 0 ? 64 : 0); }
  constexpr int64_t group_bytes() const { return codes_group_at() + 64 * loads; }
};

constexpr RepackLayout repack_layout(DType type) {
  switch (type) {
    case DType::Q4_0: return {18, 2, false, 4, 0, -8};
    case DType::Q4_1: return {20, 4, true, 4, 0, 0};
    case DType::Q5_0: return {22, 6, false, 4, 0, -16, 2};
    case DType::Q5_1: return {24, 8, true, 4, 0, 0, 4};
    default: return {34, 2, false, 8, 0x80808080u, -128};  // Q8_0
  }
}

// The stored fifth bits (bit e: element e) as the repacked layout's 4 bytes.
uint32_t rearranged_high_bits(uint32_t bits) {
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i)
    out |= (((bits >> (4 * i)) & 0xF) | (((bits >> (4 * i + 16)) & 0xF) << 4)) << (8 * i);
  return out;
}

bool repackable(DType type) {
  return type == DType::Q4_0 || type == DType::Q4_1 || type == DType::Q5_0 || type == DType::Q5_1 ||
         type == DType::Q8_0 || type == DType::Q2_K ||
         type == DType::Q3_K || type == DType::Q4_K || type == DType::Q5_K || type == DType::Q6_K;
}

// Q4_K's group block (16 rows, one 256-element super-block): the 16 f16 d, the 16 f16 dmin, then
// per sub-block s the 16 rows' 6-bit scales (bytes 64 + 16 s + r) and minima (192 + 16 s + r), then
// the codes: for each pair g of sub-blocks, 8 runs of 64 bytes, run i holding bytes 4i .. 4i + 3 of
// each row's qs[32g .. 32g + 32) (low nibbles: sub-block 2g's elements 4i ..; high: sub-block
// 2g + 1's). 2368 bytes for the 16 x 144 stored.
constexpr int64_t kQ4kStored = 144, kQ4kGroupBytes = 64 + 256 + 2048;
constexpr int kQ4kScalesAt = 64, kQ4kMinsAt = 192, kQ4kCodesAt = 320;
// Q5_K (stored d, dmin, scales[12], qh[32], qs[128]): Q4_K's group block, then the rows' qh four
// bytes at a time (run i at 2368 + 64 i: bytes 4i .. 4i + 3, whose bits 2g and 2g + 1 are the fifth
// bits of sub-blocks 2g and 2g + 1). 2880 bytes for the 16 x 176 stored.
constexpr int64_t kQ5kStored = 176, kQ5kGroupBytes = kQ4kGroupBytes + 512;
constexpr int kQ5kHighAt = 2368;

// Q6_K's group block (16 rows, one super-block; stored ql[128], qh[64], int8 scales[16], d): the
// 16 f16 d, then per sub-block s the rows' int8 scales (bytes 32 + 16 s + r), then ql four bytes of
// each row at a time (run c: bytes 4c .. 4c + 3, at 288 + 64 c), then qh likewise (at 2336 + 64 c).
// 3360 bytes, as stored.
constexpr int64_t kQ6kStored = 210, kQ6kGroupBytes = 32 + 256 + 2048 + 1024;
constexpr int kQ6kScalesAt = 32, kQ6kLowAt = 288, kQ6kHighAt = 2336;

// Q2_K's group block (stored scales[16] (scale | min << 4), qs[64], d, dmin): the 16 f16 d, the 16
// f16 dmin, per sub-block s the rows' scale bytes as stored (at 64 + 16 s + r), then qs four bytes
// of each row at a time (run c at 320 + 64 c). 1344 bytes, as stored.
// Q3_K's (stored hmask[32], qs[64], scales[12], d): the 16 f16 d, per sub-block the rows' scales
// unpacked to int8 (minus their bias of 32, at 32 + 16 s + r), qs as Q2_K's (at 288), then hmask
// four bytes at a time (run c at 1312 + 64 c). 1824 bytes for the 16 x 110 stored.
constexpr int64_t kQ2kStored = 84, kQ2kGroupBytes = 64 + 256 + 1024;
constexpr int64_t kQ3kStored = 110, kQ3kGroupBytes = 32 + 256 + 1024 + 512;
constexpr int kQ2kScalesAt = 64, kQ2kLowAt = 320, kQ3kScalesAt = 32, kQ3kLowAt = 288, kQ3kHighAt = 1312;

void repack_q2k_block(const uint8_t* const rows[16], uint8_t* dst) {
  for (int r = 0; r < 16; ++r) {
    const uint8_t* src = rows[r];
    std::memcpy(dst + 2 * r, src + 80, 2);
    std::memcpy(dst + 32 + 2 * r, src + 82, 2);
    for (int sub = 0; sub < 16; ++sub) dst[kQ2kScalesAt + 16 * sub + r] = src[sub];
    for (int c = 0; c < 16; ++c) std::memcpy(dst + kQ2kLowAt + 64 * c + 4 * r, src + 16 + 4 * c, 4);
  }
}

void repack_q3k_block(const uint8_t* const rows[16], uint8_t* dst) {
  for (int r = 0; r < 16; ++r) {
    const uint8_t* src = rows[r];
    std::memcpy(dst + 2 * r, src + 108, 2);
    int8_t biased[16];
    quant_blocks::Codec<DType::Q3_K>::unpack_scales(src, biased);
    for (int sub = 0; sub < 16; ++sub) dst[kQ3kScalesAt + 16 * sub + r] = static_cast<uint8_t>(biased[sub] - 32);
    for (int c = 0; c < 16; ++c) std::memcpy(dst + kQ3kLowAt + 64 * c + 4 * r, src + 32 + 4 * c, 4);
    for (int c = 0; c < 8; ++c) std::memcpy(dst + kQ3kHighAt + 64 * c + 4 * r, src + 4 * c, 4);
  }
}

void repack_q6k_block(const uint8_t* const rows[16], uint8_t* dst) {
  for (int r = 0; r < 16; ++r) {
    const uint8_t* src = rows[r];
    std::memcpy(dst + 2 * r, src + 208, 2);
    for (int sub = 0; sub < 16; ++sub) dst[kQ6kScalesAt + 16 * sub + r] = src[192 + sub];
    for (int c = 0; c < 32; ++c) std::memcpy(dst + kQ6kLowAt + 64 * c + 4 * r, src + 4 * c, 4);
    for (int c = 0; c < 16; ++c) std::memcpy(dst + kQ6kHighAt + 64 * c + 4 * r, src + 128 + 4 * c, 4);
  }
}

// Q4_K's layout from Q4_K rows (codes at 16) or Q5_K rows (codes at 48, and qh at 16 repacked after).
void repack_q4k_block(const uint8_t* const rows[16], uint8_t* dst, bool q5k = false) {
  for (int r = 0; r < 16; ++r) {
    const uint8_t* src = rows[r];
    const int codes_at = q5k ? 48 : 16;
    if (q5k)
      for (int i = 0; i < 8; ++i) std::memcpy(dst + kQ5kHighAt + 64 * i + 4 * r, src + 16 + 4 * i, 4);
    std::memcpy(dst + 2 * r, src, 2);            // d
    std::memcpy(dst + 32 + 2 * r, src + 2, 2);   // dmin
    for (int sub = 0; sub < 8; ++sub) {
      uint8_t sc, m;
      quant_blocks::scale_min_k4(sub, src + 4, sc, m);
      dst[kQ4kScalesAt + 16 * sub + r] = sc;
      dst[kQ4kMinsAt + 16 * sub + r] = m;
    }
    for (int g = 0; g < 4; ++g)
      for (int i = 0; i < 8; ++i)
        std::memcpy(dst + kQ4kCodesAt + (8 * g + i) * 64 + 4 * r, src + codes_at + 32 * g + 4 * i, 4);
  }
}

// A K-quant's stored and repacked super-block bytes (16 rows) and its repacking; null repack: not
// a K-quant.
struct KRepack {
  int64_t stored = 0, group = 0;
  void (*repack)(const uint8_t* const rows[16], uint8_t* dst) = nullptr;
};
KRepack k_repack_for(DType type) {
  switch (type) {
    case DType::Q2_K: return {kQ2kStored, kQ2kGroupBytes, repack_q2k_block};
    case DType::Q3_K: return {kQ3kStored, kQ3kGroupBytes, repack_q3k_block};
    case DType::Q4_K: return {kQ4kStored, kQ4kGroupBytes, [](const uint8_t* const rows[16], uint8_t* dst) { repack_q4k_block(rows, dst); }};
    case DType::Q5_K: return {kQ5kStored, kQ5kGroupBytes, [](const uint8_t* const rows[16], uint8_t* dst) { repack_q4k_block(rows, dst, true); }};
    case DType::Q6_K: return {kQ6kStored, kQ6kGroupBytes, repack_q6k_block};
    default: return {};
  }
}

}  // namespace

bool interleaved_rows_supported(DType type) {
#ifdef SPLITFLOW_CPU_AVX512_VNNI
  return repackable(type);
#else
  (void)type;
  return false;
#endif
}

size_t interleaved_bytes(DType type, int64_t n, int64_t k) {
  const KRepack k_repack = k_repack_for(type);
  const bool k_quant = k_repack.repack != nullptr;
  const int64_t block_bytes = k_quant ? k_repack.group : repack_layout(type).group_bytes();
  return static_cast<size_t>(n / kGroupRows * (k / (k_quant ? 256 : 32)) * block_bytes);
}

InterleavedRows interleave_rows(const void* w, DType type, int64_t n, int64_t k, int num_threads,
                                const std::function<void(int64_t first_row, int64_t rows)>& rows_done) {
  SF_CHECK(repackable(type), "interleave_rows: {} has no interleaved layout", dtype_name(type));
  const KRepack k_repack = k_repack_for(type);
  const bool k_quant = k_repack.repack != nullptr;
  const int64_t block_elems = k_quant ? 256 : 32;
  SF_CHECK(k % block_elems == 0, "interleave_rows: rows of {} elements (not whole {}-element blocks)", k, block_elems);
  const RepackLayout layout = repack_layout(type);
  InterleavedRows out;
  out.type = type;
  out.groups = n / kGroupRows;
  out.k = k;
  const int64_t stored_bytes = k_quant ? k_repack.stored : layout.stored_bytes;
  const int64_t blocks = k / block_elems, block_bytes = k_quant ? k_repack.group : layout.group_bytes();
  out.nbytes = interleaved_bytes(type, n, k);
  if (out.nbytes == 0) return out;
  auto* memory = static_cast<uint8_t*>(std::aligned_alloc(64, (out.nbytes + 63) / 64 * 64));
  SF_CHECK(memory != nullptr, "interleave_rows: out of memory for {} bytes", out.nbytes);
  out.bytes = std::shared_ptr<uint8_t>(memory, [](uint8_t* p) { std::free(p); });
  const auto* rows = static_cast<const uint8_t*>(w);
  const int64_t row_bytes = blocks * stored_bytes;
  const int codes_at = layout.codes_group_at();
  parallel_ranges(num_threads, out.groups, out.groups > 1, [&](int64_t g_begin, int64_t g_end) {
    for (int64_t g = g_begin; g < g_end; ++g)
      for (int64_t b = 0; b < blocks; ++b) {
        uint8_t* dst = memory + (g * blocks + b) * block_bytes;
        if (k_quant) {
          const uint8_t* sources[kGroupRows];
          for (int64_t r = 0; r < kGroupRows; ++r) sources[r] = rows + (g * kGroupRows + r) * row_bytes + b * stored_bytes;
          k_repack.repack(sources, dst);
          continue;
        }
        for (int64_t r = 0; r < kGroupRows; ++r) {
          const uint8_t* src = rows + (g * kGroupRows + r) * row_bytes + b * layout.stored_bytes;
          std::memcpy(dst + 2 * r, src, 2);                      // the f16 scale
          if (layout.min) std::memcpy(dst + 32 + 2 * r, src + 2, 2);  // the f16 minimum
          if (layout.high_at >= 0) {
            uint32_t bits;
            std::memcpy(&bits, src + layout.high_at, 4);
            bits = rearranged_high_bits(bits);
            std::memcpy(dst + layout.high_group_at() + 4 * r, &bits, 4);
          }
          for (int u = 0; u < layout.loads; ++u) {  // four code bytes at a time
            uint32_t codes;
            std::memcpy(&codes, src + layout.codes_at + 4 * u, 4);
            codes ^= layout.bias;
            std::memcpy(dst + codes_at + 64 * u + 4 * r, &codes, 4);
          }
        }
      }
    if (rows_done) rows_done(g_begin * kGroupRows, (g_end - g_begin) * kGroupRows);
  });
  return out;
}

namespace {

// The whole pages inside [data, data + bytes) returned to the system (MADV_DONTNEED: private
// anonymous pages read as zeros afterwards). Only for bytes nothing will read again.
void discard_pages(const void* data, size_t bytes) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uintptr_t>(data);
  const uintptr_t begin = (start + page - 1) / page * page, end = (start + bytes) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

// The stored fifth bits from the repacked layout's 4 bytes (rearranged_high_bits inverted).
uint32_t stored_high_bits(uint32_t rearranged) {
  uint32_t bits = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t byte = (rearranged >> (8 * i)) & 0xFF;
    bits |= (byte & 0xF) << (4 * i) | (byte >> 4) << (4 * i + 16);
  }
  return bits;
}

// Q4_K / Q5_K's 12 bytes of 6-bit scales and minima (quant_blocks::scale_min_k4 inverted).
void pack_scale_min_k4(const uint8_t scale[8], const uint8_t min[8], uint8_t* q) {
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<uint8_t>((scale[j] & 63) | (scale[j + 4] >> 4) << 6);
    q[j + 4] = static_cast<uint8_t>((min[j] & 63) | (min[j + 4] >> 4) << 6);
    q[j + 8] = static_cast<uint8_t>((scale[j + 4] & 0xF) | (min[j + 4] & 0xF) << 4);
  }
}

// Q3_K's 12 bytes of 16 6-bit scales, biased by 32 (Codec<Q3_K>::unpack_scales inverted): low
// nibbles of scales 0-7 in bytes 0-7, of 8-15 in their high nibbles, the top two bits of scale
// 4w + p at bits 2w of byte 8 + p.
void pack_q3k_scales(const uint8_t biased[16], uint8_t* q) {
  for (int i = 0; i < 12; ++i) q[i] = 0;
  for (int i = 0; i < 16; ++i) {
    q[i % 8] |= static_cast<uint8_t>((biased[i] & 0xF) << (i < 8 ? 0 : 4));
    q[8 + i % 4] |= static_cast<uint8_t>((biased[i] >> 4 & 3) << (2 * (i / 4)));
  }
}

}  // namespace

void restore_row(const InterleavedRows& rows, int64_t row, uint8_t* stored) {
  SF_CHECK(row >= 0 && row < rows.groups * kGroupRows, "restore_row: row {} outside the {} repacked rows", row,
           rows.groups * kGroupRows);
  const KRepack k_repack = k_repack_for(rows.type);
  const bool k_quant = k_repack.repack != nullptr;
  const RepackLayout layout = repack_layout(rows.type);
  const int64_t blocks = rows.k / (k_quant ? 256 : 32), block_bytes = k_quant ? k_repack.group : layout.group_bytes();
  const int64_t stored_bytes = k_quant ? k_repack.stored : layout.stored_bytes;
  const int r = static_cast<int>(row % kGroupRows);
  const auto copy4 = [&](uint8_t* dst, const uint8_t* blk, int64_t at) { std::memcpy(dst, blk + at + 4 * r, 4); };
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = rows.bytes.get() + (row / kGroupRows * blocks + b) * block_bytes;
    uint8_t* dst = stored + b * stored_bytes;
    switch (rows.type) {
      case DType::Q2_K:
        std::memcpy(dst + 80, blk + 2 * r, 2);
        std::memcpy(dst + 82, blk + 32 + 2 * r, 2);
        for (int sub = 0; sub < 16; ++sub) dst[sub] = blk[kQ2kScalesAt + 16 * sub + r];
        for (int c = 0; c < 16; ++c) copy4(dst + 16 + 4 * c, blk, kQ2kLowAt + 64 * c);
        break;
      case DType::Q3_K: {
        std::memcpy(dst + 108, blk + 2 * r, 2);
        uint8_t biased[16];
        for (int sub = 0; sub < 16; ++sub) biased[sub] = static_cast<uint8_t>(blk[kQ3kScalesAt + 16 * sub + r] + 32);
        pack_q3k_scales(biased, dst + 96);
        for (int c = 0; c < 16; ++c) copy4(dst + 32 + 4 * c, blk, kQ3kLowAt + 64 * c);
        for (int c = 0; c < 8; ++c) copy4(dst + 4 * c, blk, kQ3kHighAt + 64 * c);
        break;
      }
      case DType::Q4_K:
      case DType::Q5_K: {
        const bool q5k = rows.type == DType::Q5_K;
        std::memcpy(dst, blk + 2 * r, 2);
        std::memcpy(dst + 2, blk + 32 + 2 * r, 2);
        uint8_t scale[8], min[8];
        for (int sub = 0; sub < 8; ++sub) {
          scale[sub] = blk[kQ4kScalesAt + 16 * sub + r];
          min[sub] = blk[kQ4kMinsAt + 16 * sub + r];
        }
        pack_scale_min_k4(scale, min, dst + 4);
        const int codes_at = q5k ? 48 : 16;
        for (int g = 0; g < 4; ++g)
          for (int i = 0; i < 8; ++i) copy4(dst + codes_at + 32 * g + 4 * i, blk, kQ4kCodesAt + (8 * g + i) * 64);
        if (q5k)
          for (int i = 0; i < 8; ++i) copy4(dst + 16 + 4 * i, blk, kQ5kHighAt + 64 * i);
        break;
      }
      case DType::Q6_K:
        std::memcpy(dst + 208, blk + 2 * r, 2);
        for (int sub = 0; sub < 16; ++sub) dst[192 + sub] = blk[kQ6kScalesAt + 16 * sub + r];
        for (int c = 0; c < 32; ++c) copy4(dst + 4 * c, blk, kQ6kLowAt + 64 * c);
        for (int c = 0; c < 16; ++c) copy4(dst + 128 + 4 * c, blk, kQ6kHighAt + 64 * c);
        break;
      default: {  // the 32-element types
        std::memcpy(dst, blk + 2 * r, 2);
        if (layout.min) std::memcpy(dst + 2, blk + 32 + 2 * r, 2);
        if (layout.high_at >= 0) {
          uint32_t bits;
          std::memcpy(&bits, blk + layout.high_group_at() + 4 * r, 4);
          bits = stored_high_bits(bits);
          std::memcpy(dst + layout.high_at, &bits, 4);
        }
        for (int u = 0; u < layout.loads; ++u) {
          uint32_t codes;
          std::memcpy(&codes, blk + layout.codes_group_at() + 64 * u + 4 * r, 4);
          codes ^= layout.bias;
          std::memcpy(dst + layout.codes_at + 4 * u, &codes, 4);
        }
      }
    }
  }
}

void InterleavedCopies::add(const void* data, DType type, int64_t n, int64_t k, std::weak_ptr<void> storage) {
  auto entry = std::make_shared<Entry>();
  entry->storage = std::move(storage);
  entry->type = type;
  entry->n = n;
  entry->k = k;
  entry->bytes = static_cast<int64_t>(interleaved_bytes(type, n, k));
  std::lock_guard lock(mutex_);
  pending_bytes_ += entry->bytes;
  if (const auto it = entries_.find(data); it != entries_.end() && !it->second->rows) pending_bytes_ -= it->second->bytes;
  entries_[data] = std::move(entry);
}

std::shared_ptr<const InterleavedRows> InterleavedCopies::find(const void* data) const {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(data);
  return it == entries_.end() ? nullptr : it->second->rows;
}

InterleavedCopies::Released InterleavedCopies::released() const {
  std::lock_guard lock(mutex_);
  return released_;
}

int64_t InterleavedCopies::pending_bytes() const {
  std::lock_guard lock(mutex_);
  return pending_bytes_;
}

std::shared_ptr<const InterleavedRows> InterleavedCopies::get(const void* data, int num_threads) {
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard lock(mutex_);
    const auto it = entries_.find(data);
    if (it == entries_.end()) return nullptr;
    entry = it->second;
  }
  std::call_once(entry->repacked, [&] {
    // Held by nothing but the upload (our lock and the upload's reference): heap memory only we
    // can reach, so its pages may go for good; otherwise (a mapped file's, or bytes a caller still
    // holds) they only leave the resident set.
    const std::shared_ptr<void> storage = entry->storage.lock();
    const bool exclusive = discard_exclusive_ && storage != nullptr && storage.use_count() == 2;
    const auto release = [exclusive](const uint8_t* bytes, size_t count) {
      if (exclusive) discard_pages(bytes, count);
      else release_resident_pages(bytes, count);
    };
    // The original's pages go as each range of rows is repacked (the copy's pages are written one
    // range at a time too), so the resident peak is not the original plus the whole copy; then the
    // pages the ranges' ragged ends left.
    const size_t row_bytes = dtype_row_bytes(entry->type, entry->k);
    const auto* original = static_cast<const uint8_t*>(data);
    auto rows = std::make_shared<const InterleavedRows>(
        interleave_rows(data, entry->type, entry->n, entry->k, num_threads, [&](int64_t first_row, int64_t count) {
          release(original + first_row * row_bytes, static_cast<size_t>(count) * row_bytes);
        }));
    const size_t original_bytes = static_cast<size_t>(rows->groups * kGroupRows) * row_bytes;
    release(original, original_bytes);
    std::lock_guard lock(mutex_);
    (exclusive ? released_.discarded : released_.paged_out) += static_cast<int64_t>(original_bytes);
    entry->rows = std::move(rows);
    pending_bytes_ -= entry->bytes;
  });
  return entry->rows;
}

void InterleavedCopies::remove(const void* data) {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(data);
  if (it == entries_.end()) return;
  if (!it->second->rows) pending_bytes_ -= it->second->bytes;
  entries_.erase(it);
}

#ifdef SPLITFLOW_CPU_AVX512_VNNI
namespace {

using namespace q8_blocks;

// acc + the dot products of a's unsigned and b's signed bytes, four per int32 lane (see q8_gemm.cpp
// for why this is asm).
inline __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

inline __m512i broadcast4(const int8_t* p) {
  int32_t value;
  std::memcpy(&value, p, sizeof value);
  return _mm512_set1_epi32(value);
}

// x quantized per row and 32-element block: codes, the block's scale, the weights' correction
// (-8 for Q4_0's nibbles, -128 for Q8_0's biased bytes, 0 for Q4_1) times the block's code sum, and
// the scale times that sum (for Q4_1's minimum).
struct XBlocks {
  std::vector<int8_t> q;
  std::vector<float> d, sx;
  std::vector<int32_t> corr;
  std::vector<int32_t> corr16;  // the correction per 16 elements (Q3_K's and Q6_K's sub-blocks)
  std::vector<float> sx16;      // d * sum(q) per 16 elements (Q2_K's minima)
  // Rows in parallel on the team once there are many (a prompt's).
  void quantize(const float* x, int64_t m, int64_t k, int correction, int num_threads) {
    q.resize(static_cast<size_t>(m * k));
    d.resize(static_cast<size_t>(m * k / 32));
    corr.resize(d.size());
    corr16.resize(2 * d.size());
    sx16.resize(2 * d.size());
    sx.resize(d.size());
    parallel_ranges(num_threads, m, m * k >= 16 * kMinParallelWork, [&](int64_t row_begin, int64_t row_end) {
      for (int64_t e = row_begin * k, b = e / 32; e < row_end * k; e += 32, ++b) {
        const Q8Block block = quantize_block32(x + e);
        const float scale = block.d;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q.data() + e), block.codes);
        alignas(32) int32_t sums[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(sums), quad_sums(block.codes));
        int32_t sum = 0;
        for (int32_t s : sums) sum += s;
        d[b] = scale;
        corr[b] = correction * sum;
        corr16[2 * b] = correction * (sums[0] + sums[1] + sums[2] + sums[3]);
        corr16[2 * b + 1] = correction * (sums[4] + sums[5] + sums[6] + sums[7]);
        sx16[2 * b] = scale * static_cast<float>(sums[0] + sums[1] + sums[2] + sums[3]);
        sx16[2 * b + 1] = scale * static_cast<float>(sums[4] + sums[5] + sums[6] + sums[7]);
        sx[b] = scale * static_cast<float>(sum);
      }
    });
  }
};

// y[(x_row0 + r) * ldy + l] (+)= acc[r][l]: a group's 16 results for each of MX rows of x.
template <int MX>
inline void store_rows(const __m512 acc[MX], float* y, int64_t x_row0, int64_t ldy, bool accumulate) {
  for (int r = 0; r < MX; ++r) {
    float* out = y + (x_row0 + r) * ldy;
    _mm512_storeu_ps(out, accumulate ? _mm512_add_ps(_mm512_loadu_ps(out), acc[r]) : acc[r]);
  }
}

// The kernels, one family per layout. A family cuts a group's k elements into units of kElems
// (32-element types: a block; Q4_K / Q5_K: a pair of sub-blocks; Q6_K, Q2_K, Q3_K: a 16-element
// sub-block), kUnits of them in a block as stored: super() reads what a block's units share (its
// scales), decode() turns one unit of the 16 rows into VNNI operands (unsigned codes, their
// scales), dot<MX>() adds their products with MX rows of x into one accumulator per row (16
// lanes: the group's rows). Decode runs once per unit and MX rows of x (the GEMV), or once per
// unit for every row (the GEMM, group_many_rows).

// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: eight VNNI instructions per block and x row.
template <DType T>
struct Block32Family {
  static constexpr int kElems = 32, kUnits = 1;
  static constexpr bool kMin = T == DType::Q4_1 || T == DType::Q5_1, kHigh = T == DType::Q5_0 || T == DType::Q5_1;
  struct Super {
    const uint8_t* blk;
  };
  struct Dec {
    __m512i codes[8];  // quad u: elements 4u .. 4u + 3 of the 16 rows
    __m512 dw, mw;     // the scales (and minima)
  };
  [[gnu::always_inline]] static Super super(const uint8_t* group, int64_t b) { return {group + b * repack_layout(T).group_bytes()}; }
  [[gnu::always_inline]] static Dec decode(const Super& super, int) {
    constexpr RepackLayout layout = repack_layout(T);
    const uint8_t* blk = super.blk;
    const int codes_at = layout.codes_group_at();
    Dec dec;
    dec.dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    if constexpr (kMin) dec.mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    if constexpr (T == DType::Q8_0) {
      for (int q = 0; q < 8; ++q) dec.codes[q] = _mm512_loadu_si512(blk + codes_at + 64 * q);
    } else {  // nibbles: low ones are elements 4i .., high ones 4i + 16 ..
      const __m512i low4 = _mm512_set1_epi8(0x0F);
      [[maybe_unused]] __m512i high;
      if constexpr (kHigh) high = _mm512_loadu_si512(blk + layout.high_group_at());
      for (int i = 0; i < 4; ++i) {
        const __m512i packed = _mm512_loadu_si512(blk + codes_at + 64 * i);
        dec.codes[i] = _mm512_and_si512(packed, low4);
        dec.codes[i + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4);
        if constexpr (kHigh) {  // byte i of each row's bits, copied to its 4 bytes, one bit each
          const __m512i bits = _mm512_mullo_epi32(_mm512_and_si512(_mm512_srli_epi32(high, 8 * i), _mm512_set1_epi32(0xFF)),
                                                  _mm512_set1_epi32(0x01010101));
          const __m512i fifth = _mm512_set1_epi8(0x10);
          dec.codes[i] = _mm512_or_si512(dec.codes[i], _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(bits, _mm512_set1_epi32(0x08040201)), fifth));
          dec.codes[i + 4] = _mm512_or_si512(
              dec.codes[i + 4], _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(bits, _mm512_set1_epi32(0x80402010)), fifth));
        }
      }
    }
    return dec;
  }
  template <int MX>
  [[gnu::always_inline]] static void dot(const Dec& dec, const XBlocks& xq, int64_t x_row0, int64_t k, int64_t u, __m512 acc[MX]) {
    for (int r = 0; r < MX; ++r) {
      const int64_t xb = (x_row0 + r) * (k / 32) + u;
      const int8_t* xcodes = xq.q.data() + xb * 32;
      // Two chains, so consecutive VNNI instructions do not wait on each other.
      __m512i s0 = _mm512_set1_epi32(xq.corr[xb]), s1 = _mm512_setzero_si512();
      for (int q = 0; q < 8; q += 2) {
        s0 = dpbusd(s0, dec.codes[q], broadcast4(xcodes + 4 * q));
        s1 = dpbusd(s1, dec.codes[q + 1], broadcast4(xcodes + 4 * q + 4));
      }
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_mul_ps(dec.dw, _mm512_set1_ps(xq.d[xb])),
                               acc[r]);
      if constexpr (kMin) acc[r] = _mm512_fmadd_ps(dec.mw, _mm512_set1_ps(xq.sx[xb]), acc[r]);
    }
  }
};

// Q4_K (Q5_K): per pair of sub-blocks (two blocks of x), eight VNNI instructions each per x row
// into one int32 sum per weight row, scaled by d * sc and x's d, and the minimum -dmin * m times
// x's scaled sum: about 35 instructions per 512 weights and x row, against about 110 with the rows
// as stored.
template <bool kQ5>
struct Q4kFamily {
  static constexpr int kElems = 64, kUnits = 4;
  static constexpr int64_t kGroupBytes = kQ5 ? kQ5kGroupBytes : kQ4kGroupBytes;
  struct Super {
    const uint8_t* blk;
    __m512 d, dmin;
  };
  struct Dec {
    __m512i low[8], high[8];  // the pair's two sub-blocks, quad i of each
    __m512 scale0, scale1, min0, min1;
  };
  [[gnu::always_inline]] static Super super(const uint8_t* group, int64_t b) {
    const uint8_t* blk = group + b * kGroupBytes;
    return {blk, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk))),
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)))};
  }
  [[gnu::always_inline]] static Dec decode(const Super& super, int g) {
    const uint8_t* blk = super.blk;
    // The next super-block's lines, a quarter per pair: a group's blocks are one stream, but the
    // hardware prefetchers alone left the first code line of each block a stall.
    constexpr int kLines = static_cast<int>(kGroupBytes / 64), kPerPair = (kLines + 3) / 4;
    for (int line = kPerPair * g; line < std::min(kPerPair * (g + 1), kLines); ++line)
      _mm_prefetch(reinterpret_cast<const char*>(blk + kGroupBytes + 64 * line), _MM_HINT_T0);
    const auto lanes = [&](int at) {  // 16 bytes (one per row) as floats
      return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + at))));
    };
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    Dec dec;
    for (int i = 0; i < 8; ++i) {
      const __m512i packed = _mm512_loadu_si512(blk + kQ4kCodesAt + (8 * g + i) * 64);
      dec.low[i] = _mm512_and_si512(packed, low4);
      dec.high[i] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4);
      if constexpr (kQ5) {  // the fifth bits: bit 2g (low sub-block) and 2g + 1 (high) of qh
        const __m512i qh = _mm512_loadu_si512(blk + kQ5kHighAt + 64 * i), one = _mm512_set1_epi8(1);
        dec.low[i] = _mm512_or_si512(dec.low[i], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 2 * g), one), 4));
        dec.high[i] = _mm512_or_si512(dec.high[i], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 2 * g + 1), one), 4));
      }
    }
    dec.scale0 = _mm512_mul_ps(super.d, lanes(kQ4kScalesAt + 16 * (2 * g)));
    dec.scale1 = _mm512_mul_ps(super.d, lanes(kQ4kScalesAt + 16 * (2 * g + 1)));
    dec.min0 = _mm512_mul_ps(super.dmin, lanes(kQ4kMinsAt + 16 * (2 * g)));
    dec.min1 = _mm512_mul_ps(super.dmin, lanes(kQ4kMinsAt + 16 * (2 * g + 1)));
    return dec;
  }
  template <int MX>
  [[gnu::always_inline]] static void dot(const Dec& dec, const XBlocks& xq, int64_t x_row0, int64_t k, int64_t u, __m512 acc[MX]) {
    for (int r = 0; r < MX; ++r) {
      const int64_t xb0 = (x_row0 + r) * (k / 32) + 2 * u, xb1 = xb0 + 1;
      const int8_t* x0 = xq.q.data() + xb0 * 32;
      const int8_t* x1 = xq.q.data() + xb1 * 32;
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      for (int i = 0; i < 8; ++i) {
        s0 = dpbusd(s0, dec.low[i], broadcast4(x0 + 4 * i));
        s1 = dpbusd(s1, dec.high[i], broadcast4(x1 + 4 * i));
      }
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(dec.scale0, _mm512_set1_ps(xq.d[xb0])), acc[r]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(dec.scale1, _mm512_set1_ps(xq.d[xb1])), acc[r]);
      acc[r] = _mm512_fnmadd_ps(dec.min0, _mm512_set1_ps(xq.sx[xb0]), acc[r]);
      acc[r] = _mm512_fnmadd_ps(dec.min1, _mm512_set1_ps(xq.sx[xb1]), acc[r]);
    }
  }
};

// Q6_K, Q2_K, Q3_K: per 16-element sub-block s of a super-block (half h = s / 8, sub = s % 8), quad
// u = 4 sub + q's codes: Q6_K's ql nibble (high from u = 16) with bits 2 (u / 8) of qh as bits 4-5,
// biased by 32; Q2_K's bits 2 (u / 8) of qs run u % 8 (Q3_K: with bit 4h + u / 8 of hmask as bit
// 2, biased by 4). Four VNNI instructions per sub-block and x row; the biases' corrections per 16
// elements start each sum; Q2_K's minima against x's per-16 sums.
template <DType T>
struct Sub16Family {
  static constexpr int kElems = 16, kUnits = 16;
  static constexpr bool kQ6 = T == DType::Q6_K, kQ3 = T == DType::Q3_K, kMin = T == DType::Q2_K;
  static constexpr int64_t kGroupBytes = kQ6 ? kQ6kGroupBytes : kQ3 ? kQ3kGroupBytes : kQ2kGroupBytes;
  static constexpr int kScalesAt = kQ6 ? kQ6kScalesAt : kQ3 ? kQ3kScalesAt : kQ2kScalesAt;
  static constexpr int kLowAt = kQ6 ? kQ6kLowAt : kQ3 ? kQ3kLowAt : kQ2kLowAt;
  struct Super {
    const uint8_t* blk;
    __m512 d, dmin;
  };
  struct Dec {
    __m512i codes[4];
    __m512 scale, minimum;
  };
  [[gnu::always_inline]] static Super super(const uint8_t* group, int64_t b) {
    const uint8_t* blk = group + b * kGroupBytes;
    constexpr int kLines = static_cast<int>((kGroupBytes + 63) / 64);
    for (int line = 0; line < kLines; ++line)  // the next super-block (Q4kFamily says why)
      _mm_prefetch(reinterpret_cast<const char*>(blk + kGroupBytes + 64 * line), _MM_HINT_T0);
    Super super{blk, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk))), _mm512_setzero_ps()};
    if constexpr (kMin) super.dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    return super;
  }
  [[gnu::always_inline]] static Dec decode(const Super& super, int s) {
    const uint8_t* blk = super.blk;
    const int h = s / 8, sub = s % 8;
    const __m512i low4 = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(0x03), one = _mm512_set1_epi8(0x01);
    Dec dec;
    for (int q = 0; q < 4; ++q) {
      const int quad = 4 * sub + q;
      if constexpr (kQ6) {
        const __m512i ql = _mm512_loadu_si512(blk + kLowAt + 64 * (16 * h + quad % 16));
        const __m512i nibble = quad < 16 ? _mm512_and_si512(ql, low4) : _mm512_and_si512(_mm512_srli_epi16(ql, 4), low4);
        const __m512i qh = _mm512_loadu_si512(blk + kQ6kHighAt + 64 * (8 * h + quad % 8));
        dec.codes[q] = _mm512_or_si512(nibble, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 2 * (quad / 8)), two), 4));
      } else {
        const __m512i qs = _mm512_loadu_si512(blk + kLowAt + 64 * (8 * h + quad % 8));
        dec.codes[q] = _mm512_and_si512(_mm512_srli_epi16(qs, 2 * (quad / 8)), two);
        if constexpr (kQ3) {
          const __m512i hmask = _mm512_loadu_si512(blk + kQ3kHighAt + 64 * (quad % 8));
          dec.codes[q] = _mm512_or_si512(
              dec.codes[q], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hmask, 4 * h + quad / 8), one), 2));
        }
      }
    }
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kScalesAt + 16 * s));
    if constexpr (kMin) {
      const __m512i wide = _mm512_cvtepu8_epi32(bytes);
      dec.scale = _mm512_mul_ps(super.d, _mm512_cvtepi32_ps(_mm512_and_si512(wide, _mm512_set1_epi32(0xF))));
      dec.minimum = _mm512_mul_ps(super.dmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(wide, 4)));
    } else {
      dec.scale = _mm512_mul_ps(super.d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)));
    }
    return dec;
  }
  template <int MX>
  [[gnu::always_inline]] static void dot(const Dec& dec, const XBlocks& xq, int64_t x_row0, int64_t k, int64_t u, __m512 acc[MX]) {
    for (int r = 0; r < MX; ++r) {
      const int64_t e = (x_row0 + r) * k + 16 * u;  // the sub-block's first x element
      const int8_t* xcodes = xq.q.data() + e;
      __m512i sum = kMin ? _mm512_setzero_si512() : _mm512_set1_epi32(xq.corr16[e / 16]);
      for (int q = 0; q < 4; ++q) sum = dpbusd(sum, dec.codes[q], broadcast4(xcodes + 4 * q));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dec.scale, _mm512_set1_ps(xq.d[e / 32])), acc[r]);
      if constexpr (kMin) acc[r] = _mm512_fnmadd_ps(dec.minimum, _mm512_set1_ps(xq.sx16[e / 16]), acc[r]);
    }
  }
};

template <DType T>
using FamilyOf = std::conditional_t<
    T == DType::Q4_K || T == DType::Q5_K, Q4kFamily<T == DType::Q5_K>,
    std::conditional_t<T == DType::Q6_K || T == DType::Q2_K || T == DType::Q3_K, Sub16Family<T>, Block32Family<T>>>;

// Calls body.template operator()<MX>(i) for rows i .. i + MX - 1 of [0, m), MX in {8, 4, 3, 2, 1}.
template <class Body>
inline void for_row_runs(int64_t m, const Body& body) {
  for (int64_t i = 0; i < m;) {
    const int64_t rows = m - i >= 8 ? 8 : std::min<int64_t>(4, m - i);
    switch (rows) {
      case 1: body.template operator()<1>(i); break;
      case 2: body.template operator()<2>(i); break;
      case 3: body.template operator()<3>(i); break;
      case 4: body.template operator()<4>(i); break;
      default: body.template operator()<8>(i); break;
    }
    i += rows;
  }
}

// A group's 16 outputs for every row of x, a few rows at a time: each unit decoded once per MX rows.
template <class F>
void group_few_rows(const XBlocks& xq, int64_t m, int64_t k, const uint8_t* group, float* y, int64_t ldy,
                    bool accumulate) {
  for_row_runs(m, [&]<int MX>(int64_t i) {
    __m512 acc[MX];
    for (int r = 0; r < MX; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / (F::kElems * F::kUnits); ++b) {
      const typename F::Super super = F::super(group, b);
      const auto unit = [&](int s) { F::template dot<MX>(F::decode(super, s), xq, i, k, b * F::kUnits + s, acc); };
      if constexpr (F::kElems == 16) {
        // Unrolled: sub-blocks share loads (Q6_K's ql, Q2_K's qs), which the compiler then reads once.
#pragma GCC unroll 16
        for (int s = 0; s < F::kUnits; ++s) unit(s);
      } else {
        for (int s = 0; s < F::kUnits; ++s) unit(s);
      }
    }
    store_rows<MX>(acc, y, i, ldy, accumulate);
  });
}

// The same for many rows (a prompt): 256 elements' units decoded once into L1, then met by every
// row of x, each row's 16 partial sums kept in `partial` between them.
template <class F>
void group_many_rows(const XBlocks& xq, int64_t m, int64_t k, const uint8_t* group, float* y, int64_t ldy,
                     bool accumulate, std::vector<float>& partial) {
  constexpr int kChunk = 256 / F::kElems;
  const int64_t units = k / F::kElems;
  partial.resize(static_cast<size_t>(m * kGroupRows));
  for (int64_t u0 = 0; u0 < units; u0 += kChunk) {
    const int count = static_cast<int>(std::min<int64_t>(kChunk, units - u0));
    typename F::Dec decoded[kChunk];
    typename F::Super super;
    for (int j = 0; j < count; ++j) {
      const int64_t u = u0 + j;
      if (j == 0 || u % F::kUnits == 0) super = F::super(group, u / F::kUnits);
      decoded[j] = F::decode(super, static_cast<int>(u % F::kUnits));
    }
    for_row_runs(m, [&]<int MX>(int64_t i) {
      __m512 acc[MX];
      for (int r = 0; r < MX; ++r)
        acc[r] = u0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(partial.data() + (i + r) * kGroupRows);
      for (int j = 0; j < count; ++j) F::template dot<MX>(decoded[j], xq, i, k, u0 + j, acc);
      for (int r = 0; r < MX; ++r) _mm512_storeu_ps(partial.data() + (i + r) * kGroupRows, acc[r]);
    });
  }
  for (int64_t r = 0; r < m; ++r) {
    float* out = y + r * ldy;
    const __m512 sum = _mm512_loadu_ps(partial.data() + r * kGroupRows);
    _mm512_storeu_ps(out, accumulate ? _mm512_add_ps(_mm512_loadu_ps(out), sum) : sum);
  }
}

// From this many rows of x, a group's units are decoded once for all of them.
constexpr int64_t kManyRows = 16;

template <DType T>
void gemv(const float* x, int64_t m, const InterleavedRows& w, float* y, int64_t ldy, bool accumulate, int num_threads) {
  using F = FamilyOf<T>;
  thread_local XBlocks xq;  // on the calling thread, before the team starts
  constexpr bool kK = T == DType::Q2_K || T == DType::Q3_K || T == DType::Q4_K || T == DType::Q5_K || T == DType::Q6_K;
  xq.quantize(x, m, w.k, T == DType::Q6_K ? -32 : T == DType::Q3_K ? -4 : kK ? 0 : repack_layout(T).correction,
              num_threads);
  const XBlocks& rows_q = xq;
  const int64_t group_bytes = kK ? w.k / 256 * k_repack_for(T).group : w.k / 32 * repack_layout(T).group_bytes();
  // Runs of contiguous groups, about four per thread: long sequential streams for the prefetchers
  // (runs of 2 groups taken in turn ran at 0.6x on 2 threads), still balanced when a thread is late.
  parallel_ranges(num_threads, w.groups, m * w.groups * kGroupRows * w.k >= 8 * kMinParallelWork,
                  [&](int64_t g_begin, int64_t g_end) {
    thread_local std::vector<float> partial;
    for (int64_t g = g_begin; g < g_end; ++g) {
      const uint8_t* group = w.bytes.get() + g * group_bytes;
      if (m >= kManyRows) group_many_rows<F>(rows_q, m, w.k, group, y + g * kGroupRows, ldy, accumulate, partial);
      else group_few_rows<F>(rows_q, m, w.k, group, y + g * kGroupRows, ldy, accumulate);
    }
  });
}

}  // namespace

void interleaved_gemv(const float* x, int64_t m, const InterleavedRows& w, float* y, int64_t ldy, bool accumulate,
                      int num_threads) {
  if (m <= 0 || w.groups == 0) return;
  if (w.type == DType::Q4_0) return gemv<DType::Q4_0>(x, m, w, y, ldy, accumulate, num_threads);
  if (w.type == DType::Q4_1) return gemv<DType::Q4_1>(x, m, w, y, ldy, accumulate, num_threads);
  if (w.type == DType::Q5_0) return gemv<DType::Q5_0>(x, m, w, y, ldy, accumulate, num_threads);
  if (w.type == DType::Q5_1) return gemv<DType::Q5_1>(x, m, w, y, ldy, accumulate, num_threads);
  if (w.type == DType::Q2_K) return gemv<DType::Q2_K>(x, m, w, y, ldy, accumulate, num_threads);
  if (w.type == DType::Q3_K) return gemv<DType::Q3_K>(x, m, w, y, ldy, accumulate, num_threads);
  if (w.type == DType::Q4_K) return gemv<DType::Q4_K>(x, m, w, y, ldy, accumulate, num_threads);
  if (w.type == DType::Q5_K) return gemv<DType::Q5_K>(x, m, w, y, ldy, accumulate, num_threads);
  if (w.type == DType::Q6_K) return gemv<DType::Q6_K>(x, m, w, y, ldy, accumulate, num_threads);
  return gemv<DType::Q8_0>(x, m, w, y, ldy, accumulate, num_threads);
}

#else

void interleaved_gemv(const float*, int64_t, const InterleavedRows& w, float*, int64_t, bool, int) {
  SF_CHECK(false, "cpu interleaved gemv: {} needs AVX-512 VNNI, which this build does not target", dtype_name(w.type));
}

#endif

}  // namespace splitflow::cpu
