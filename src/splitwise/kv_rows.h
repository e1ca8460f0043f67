// splitwise/kv_rows.h — rows of one layer of a paged KV cache, by position, copied to and from host
// memory: the re-blocking of a transfer between pools of different block sizes. A position p of a
// sequence lives in block block_table[p / block_size], slot p % block_size. The rows are gathered
// on the device into a staging area (Backend::gather_rows / scatter_rows) so that a layer crosses
// in one copy each for K and V, whatever the block size (one copy per block synchronized the CUDA
// stream once per block).
#pragma once

#include "splitwise/kv_transfer.h"

#include <cstdint>
#include <span>

namespace splitflow::splitwise {

// Rows [first, first + count) of `layer`, K to k_out and V to v_out ([count, row_bytes] each).
// Throws Error when the block table does not cover them or names a block outside the cache.
void read_rows(const KvCache& cache, int32_t layer, int32_t first, int32_t count, std::span<const int32_t> block_table,
               char* k_out, char* v_out);
// The reverse: k_in and v_in ([count, row_bytes] each) into rows [first, first + count) of `layer`.
void write_rows(const KvCache& cache, int32_t layer, int32_t first, int32_t count, std::span<const int32_t> block_table,
                const char* k_in, const char* v_in);

}  // namespace splitflow::splitwise
