#include "splitwise/kv_rows.h"

#include "core/error.h"

#include <algorithm>

namespace splitflow::splitwise {

namespace {

// Calls copy(row offset in the host arrays, the cache's K run, the cache's V run) per block run.
template <typename Copy>
void for_each_run(const KvCache& cache, int32_t layer, int32_t first, int32_t count,
                  std::span<const int32_t> block_table, Copy copy) {
  const KvLayout& layout = cache.layout;
  SF_CHECK(layer >= 0 && layer < layout.num_layers, "kv rows: layer {} outside [0, {})", layer, layout.num_layers);
  SF_CHECK(first >= 0 && count >= 0, "kv rows: positions [{}, {}) are invalid", first, first + count);
  const int64_t end = static_cast<int64_t>(first) + count;
  SF_CHECK(end <= static_cast<int64_t>(block_table.size()) * cache.block_size,
           "kv rows: positions [{}, {}) past the {} blocks of {} tokens the block table holds", first, end,
           block_table.size(), cache.block_size);
  const int64_t row_bytes = layout.row_bytes();
  for (int64_t p = first; p < end;) {
    const int32_t block = block_table[static_cast<size_t>(p / cache.block_size)];
    SF_CHECK(block >= 0 && block < cache.num_blocks, "kv rows: block {} outside the cache's {} blocks", block,
             cache.num_blocks);
    const int64_t slot = p % cache.block_size;
    const int64_t run = std::min<int64_t>(cache.block_size - slot, end - p);
    const int64_t offset = ((static_cast<int64_t>(layer) * cache.num_blocks + block) * cache.block_size + slot) * row_bytes;
    DeviceTensor k{static_cast<char*>(cache.k.data) + offset, layout.dtype, {run, layout.num_kv_heads, layout.head_dim}};
    DeviceTensor v{static_cast<char*>(cache.v.data) + offset, layout.dtype, {run, layout.num_kv_heads, layout.head_dim}};
    copy((p - first) * row_bytes, k, v);
    p += run;
  }
}

}  // namespace

void read_rows(const KvCache& cache, int32_t layer, int32_t first, int32_t count, std::span<const int32_t> block_table,
               char* k_out, char* v_out) {
  for_each_run(cache, layer, first, count, block_table, [&](int64_t at, const DeviceTensor& k, const DeviceTensor& v) {
    cache.backend->copy_to_host(k, k_out + at);
    cache.backend->copy_to_host(v, v_out + at);
  });
}

void write_rows(const KvCache& cache, int32_t layer, int32_t first, int32_t count, std::span<const int32_t> block_table,
                const char* k_in, const char* v_in) {
  for_each_run(cache, layer, first, count, block_table, [&](int64_t at, const DeviceTensor& k, const DeviceTensor& v) {
    cache.backend->copy_to_device(k_in + at, k);
    cache.backend->copy_to_device(v_in + at, v);
  });
}

}  // namespace splitflow::splitwise
