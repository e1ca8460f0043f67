// backend/cpu/interleaved_rows.h — GGUF's block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K)
// repacked for the decode GEMV, as llama.cpp repacks them at load for the same reason: rows in
// groups of 16, each group's blocks contiguous, a block holding the 16 rows' f16 scales and then
// their codes four bytes at a time (Q4_0: bytes 4i .. 4i + 3 of each row's 16 code bytes, whose low
// nibbles are elements 4i .. 4i + 3 and high nibbles 4i + 16 ..; Q8_0: codes 4u .. 4u + 3, biased
// by 128; Q4_1: its 16 minima after the scales; Q5_0 / Q5_1: then the rows' fifth bits, a byte per
// code load; Q4_K per 256-element super-block: the 16 rows' d and dmin, their 6-bit scales and
// minima one byte each, then the codes as Q4_0's, 32 bytes of a row per pair of sub-blocks; Q5_K:
// then qh four bytes at a time; Q6_K: d, the int8 scales one byte each, then ql and qh four bytes
// of each row at a time; Q2_K / Q3_K: d (dmin), a scale byte per sub-block, qs (and hmask) four
// bytes of each row at a time). One 64-byte load then
// holds four codes of 16 rows and one vector their scales, and the GEMV broadcasts four codes of x
// (Q8 activations, q8_activations.h) against them: about 30 instructions per 512 weights, where
// the rows as stored take about 17 per 64, and each group is one sequential stream.
// The CPU backend runs every product over a matrix of these types of at least 16 rows on its
// repacked copy (InterleavedCopies below), decode and prefill alike: its whole 16-row groups
// here (interleaved_gemv: each unit decoded once per 8 rows of x, or once for all of a prompt's
// rows) or, from 256 rows of x, through the stored-rows GEMM on rows restored from the copy
// (restore_row); the rows past the last group as stored. The original is then released; only
// those last rows, and the fp32 path (no copy is made there), read it.
// Must never: be used without AVX-512 VNNI (interleaved_rows_supported() is false there), or
// allocate per product beyond its thread-local buffers (x's codes, a prompt's partial sums) once
// the copy exists.
#pragma once

#include "core/dtype.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace splitflow::cpu {

// The rows of whole groups of a matrix, repacked.
struct InterleavedRows {
  DType type = DType::Q4_0;
  int64_t groups = 0;  // rows 0 .. 16 * groups - 1 of the matrix
  int64_t k = 0;
  std::shared_ptr<uint8_t> bytes;
  size_t nbytes = 0;
};

// Whether `type` has the layout here (one of these ten, and the target has AVX-512 VNNI).
bool interleaved_rows_supported(DType type);

// The bytes interleave_rows() writes for a [n, k] matrix of `type`.
size_t interleaved_bytes(DType type, int64_t n, int64_t k);

// The first n / 16 * 16 rows of w [n, k] (packed rows of `type`, k a multiple of its block) repacked, on
// the calling thread's team of num_threads; rows_done(first_row, rows) after each range of rows is
// written (on the thread that wrote it).
InterleavedRows interleave_rows(const void* w, DType type, int64_t n, int64_t k, int num_threads,
                                const std::function<void(int64_t first_row, int64_t rows)>& rows_done = nullptr);

// Row `row` (< 16 * rows.groups) of the matrix as stored, written to `stored` (its row bytes): the
// repacking inverted, byte for byte.
void restore_row(const InterleavedRows& rows, int64_t row, uint8_t* stored);

// y[i * ldy + j] (+)= x'[i] . w[j] for i < m and j < 16 * w.groups, x' being x quantized per
// 32-element block as q8_gemv does.
void interleaved_gemv(const float* x, int64_t m, const InterleavedRows& w, float* y, int64_t ldy, bool accumulate,
                      int num_threads);

// One backend's repacked copies, by the address of the matrix they copy. A matrix is registered at
// upload and repacked at its first product (warm-up's, usually): a matrix only ever gathered from
// (a token embedding table that is not the head too) costs no copy. Once repacked, the whole pages
// of its repacked rows are released from the resident set (release_resident_pages: a mapped
// GGUF's pages are read again from the file only if touched, by the GPU/CPU split's offload copy),
// and where the original is heap memory nothing but the upload holds (a fused q/k/v or gate/up
// matrix made at load, once the runner has dropped the host weights) its pages are discarded
// (reads would give zeros: nothing reads them, as the products use the copy, the embedding gather
// restores rows from it (restore_row) and rows past the last group are not discarded). So a
// model costs about one copy of its weights. An entry lives
// as long as the upload that registered it (its buffer's owner removes it), so an address is never
// matched to a later tensor's. Thread-safe: the ranks of an in-process job may share nothing else.
class InterleavedCopies {
 public:
  // `storage`: what owns the matrix's bytes (the uploaded tensor's storage), watched to tell
  // whether anything beside the upload still holds them.
  void add(const void* data, DType type, int64_t n, int64_t k, std::weak_ptr<void> storage = {});
  // Whether a repacked original held by nothing but its upload may be discarded (on by default;
  // off where something reads the original's bytes after the products began: the GPU/CPU split's
  // offload copies them at its first product).
  void set_discard_exclusive(bool on) { discard_exclusive_ = on; }
  // Bytes of repacked originals this object asked the kernel to take out of the resident set
  // (mapped or shared: read again from the file or kept, if touched) and to discard (exclusive
  // heap bytes): what it decided, whatever the kernel then did.
  struct Released {
    int64_t paged_out = 0, discarded = 0;
  };
  Released released() const;
  // Bytes the registered matrices not repacked yet will take: host memory the backend reports as
  // taken already (memory_info), so that what is planned before warm-up (the KV cache) leaves room.
  int64_t pending_bytes() const;
  // The repacked copy of the matrix at `data` (made now, on the calling thread's team of
  // num_threads, if this is its first product); null when none was registered there.
  std::shared_ptr<const InterleavedRows> get(const void* data, int num_threads);
  void remove(const void* data);
  // The repacked copy of the matrix at `data` if it was made already (no repacking here): the
  // embedding gather reads a tied head's rows from it (restore_row), not from released pages.
  std::shared_ptr<const InterleavedRows> find(const void* data) const;

 private:
  struct Entry {
    DType type;
    int64_t n, k;
    int64_t bytes;  // its repacked size
    std::weak_ptr<void> storage;
    std::once_flag repacked;
    std::shared_ptr<const InterleavedRows> rows;
  };
  mutable std::mutex mutex_;
  int64_t pending_bytes_ = 0;
  Released released_;
  std::atomic<bool> discard_exclusive_{true};
  std::unordered_map<const void*, std::shared_ptr<Entry>> entries_;
};

}  // namespace splitflow::cpu
