// backend/cpu/stream_read.h — the memory-bandwidth roofline of this machine: a streaming read with
// the widest loads and as few instructions per byte as possible, to compare weight-streaming
// kernels (decode GEMV) against in the same run.
#pragma once

#include <cstddef>
#include <cstdint>

namespace splitflow::cpu {

// Reads every byte of [data, data + bytes) on num_threads threads; returns a checksum (xor of the
// words) so the reads cannot be optimised away.
uint64_t stream_read(const void* data, size_t bytes, int num_threads);

}  // namespace splitflow::cpu
