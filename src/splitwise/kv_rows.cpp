#include "splitwise/kv_rows.h"

#include "core/error.h"

#include <algorithm>
#include <vector>

namespace splitflow::splitwise {

namespace {

// Each position's row index in one layer of the cache viewed as [num_blocks * block_size, row]:
// block * block_size + slot. Throws when the table does not cover a position or names a block
// outside the cache.
std::vector<int32_t> cache_rows(const KvCache& cache, int32_t layer, int32_t first, int32_t count,
                                std::span<const int32_t> block_table) {
  const KvLayout& layout = cache.layout;
  SF_CHECK(layer >= 0 && layer < layout.num_layers, "kv rows: layer {} outside [0, {})", layer, layout.num_layers);
  SF_CHECK(first >= 0 && count >= 0, "kv rows: positions [{}, {}) are invalid", first, first + count);
  const int64_t end = static_cast<int64_t>(first) + count;
  SF_CHECK(end <= static_cast<int64_t>(block_table.size()) * cache.block_size,
           "kv rows: positions [{}, {}) past the {} blocks of {} tokens the block table holds", first, end,
           block_table.size(), cache.block_size);
  std::vector<int32_t> rows(static_cast<size_t>(count));
  for (int64_t p = first; p < end; ++p) {
    const int32_t block = block_table[static_cast<size_t>(p / cache.block_size)];
    SF_CHECK(block >= 0 && block < cache.num_blocks, "kv rows: block {} outside the cache's {} blocks", block,
             cache.num_blocks);
    rows[static_cast<size_t>(p - first)] = static_cast<int32_t>(int64_t{block} * cache.block_size + p % cache.block_size);
  }
  return rows;
}

// One layer of K or V as [num_blocks * block_size, num_kv_heads * head_dim].
DeviceTensor layer_rows(const KvCache& cache, const DeviceTensor& pool, int32_t layer) {
  const KvLayout& layout = cache.layout;
  const int64_t rows = int64_t{cache.num_blocks} * cache.block_size;
  return {static_cast<char*>(pool.data) + layer * rows * layout.row_bytes(), layout.dtype,
          {rows, int64_t{layout.num_kv_heads} * layout.head_dim}};
}

// Device staging for one call's rows (the calling thread's, grown as needed): the row indices and
// the K and V rows packed, so that a transfer's layer crosses between host and device in one copy
// each way instead of one per block (each a synchronization on CUDA).
struct Staging {
  Backend* backend = nullptr;
  DType dtype = DType::F32;
  int64_t width = 0, capacity = 0;
  DeviceBuffer rows, k, v;

  void reserve(Backend& owner, DType type, int64_t row_width, int64_t count) {
    if (backend == &owner && dtype == type && width == row_width && capacity >= count) return;
    backend = &owner;
    dtype = type;
    width = row_width;
    capacity = std::max<int64_t>({count, 2 * capacity, 256});
    rows = owner.allocate(DType::I32, {capacity});
    k = owner.allocate(type, {capacity, row_width});
    v = owner.allocate(type, {capacity, row_width});
  }
};

Staging& staging_for(const KvCache& cache, int64_t count) {
  thread_local Staging staging;
  staging.reserve(*cache.backend, cache.layout.dtype, int64_t{cache.layout.num_kv_heads} * cache.layout.head_dim, count);
  return staging;
}

// The staging area for `count` rows with their cache row indices already on the device.
struct StagedRows {
  Staging& staging;
  DeviceTensor index, k, v;
};
StagedRows stage_rows(const KvCache& cache, int32_t layer, int32_t first, int32_t count,
                      std::span<const int32_t> block_table) {
  const std::vector<int32_t> rows = cache_rows(cache, layer, first, count, block_table);
  Staging& staging = staging_for(cache, count);
  const DeviceTensor index = staging.rows.view().rows(0, count);
  cache.backend->copy_to_device(rows.data(), index);
  return {staging, index, staging.k.view().rows(0, count), staging.v.view().rows(0, count)};
}

}  // namespace

void read_rows(const KvCache& cache, int32_t layer, int32_t first, int32_t count, std::span<const int32_t> block_table,
               char* k_out, char* v_out) {
  const StagedRows staged = stage_rows(cache, layer, first, count, block_table);
  Backend& backend = *cache.backend;
  backend.gather_rows(layer_rows(cache, cache.k, layer), staged.index, staged.k);
  backend.gather_rows(layer_rows(cache, cache.v, layer), staged.index, staged.v);
  backend.copy_to_host(staged.k, k_out);
  backend.copy_to_host(staged.v, v_out);
}

void write_rows(const KvCache& cache, int32_t layer, int32_t first, int32_t count, std::span<const int32_t> block_table,
                const char* k_in, const char* v_in) {
  const StagedRows staged = stage_rows(cache, layer, first, count, block_table);
  Backend& backend = *cache.backend;
  backend.copy_to_device(k_in, staged.k);
  backend.copy_to_device(v_in, staged.v);
  backend.scatter_rows(staged.k, staged.index, layer_rows(cache, cache.k, layer));
  backend.scatter_rows(staged.v, staged.index, layer_rows(cache, cache.v, layer));
  // The caller may reuse k_in / v_in and expects the rows in place: finish before returning.
  backend.synchronize();
}

}  // namespace splitflow::splitwise
