// The CPU backend's repacked copies (backend/cpu/interleaved_rows.h): made at a matrix's first
// product, counted as taken memory until then, the mapped original's pages released afterwards
// (residency read with mincore(2) on a real file mapping, as the GGUF loader maps checkpoints), and
// every row restorable from the copy byte for byte, which the embedding gather of a tied head reads.
#include "backend/backend.h"
#include "backend/backend_test_util.h"
#include "backend/cpu/interleaved_rows.h"
#include "core/mapped_file.h"
#include "quant/quant.h"

#include <gtest/gtest.h>

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <cstring>
#include <random>

using namespace splitflow;

namespace {

// A Q4_K matrix written to a file and mapped back: [256, 1024], 147 KiB (36 pages).
struct MappedMatrix {
  static constexpr int64_t kRows = 256, kCols = 1024;
  std::filesystem::path path;
  std::shared_ptr<const MappedFile> file;

  MappedMatrix() {
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    Tensor values = Tensor::zeros(DType::F32, {kRows, kCols});
    for (int64_t i = 0; i < kRows * kCols; ++i) values.as<float>()[i] = uniform(rng);
    const Tensor packed = quant::quantize(values, DType::Q4_K);
    path = std::filesystem::temp_directory_path() / ("interleaved_copies_" + std::to_string(getpid()) + ".bin");
    // Written back before it is mapped: the kernel reclaims clean pages only.
    FILE* out = std::fopen(path.c_str(), "wb");
    EXPECT_NE(out, nullptr);
    std::fwrite(packed.data, 1, packed.nbytes(), out);
    std::fflush(out);
    fsync(fileno(out));
    std::fclose(out);
    file = MappedFile::open(path.string());
    // Every page read once, as the loader's checks and a first product would.
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < file->size(); i += 4096) sink = sink + file->data()[i];
  }
  ~MappedMatrix() { std::filesystem::remove(path); }

  // How many of the mapping's whole pages are resident.
  int64_t resident_pages() const {
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const auto start = reinterpret_cast<uintptr_t>(file->data());
    const uintptr_t begin = (start + page - 1) / page * page, end = (start + file->size()) / page * page;
    std::vector<unsigned char> flags((end - begin) / page);
    if (mincore(reinterpret_cast<void*>(begin), end - begin, flags.data()) != 0) return -1;
    int64_t resident = 0;
    for (unsigned char flag : flags) resident += flag & 1;
    return resident;
  }
  int64_t whole_pages() const {
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const auto start = reinterpret_cast<uintptr_t>(file->data());
    return static_cast<int64_t>(((start + file->size()) / page * page - (start + page - 1) / page * page) / page);
  }
};

}  // namespace

TEST(InterleavedCopies, RepackedAtTheFirstProductAndCountedUntilThen) {
  if (!cpu::interleaved_rows_supported(DType::Q4_K)) GTEST_SKIP() << "no AVX-512 VNNI on this host: nothing is repacked";
  MappedMatrix matrix;
  cpu::InterleavedCopies copies;
  const int64_t bytes = static_cast<int64_t>(cpu::interleaved_bytes(DType::Q4_K, MappedMatrix::kRows, MappedMatrix::kCols));
  EXPECT_EQ(bytes, 16 * 4 * 2368);  // 16 groups x 4 super-blocks x the group block
  copies.add(matrix.file->data(), DType::Q4_K, MappedMatrix::kRows, MappedMatrix::kCols);
  EXPECT_EQ(copies.pending_bytes(), bytes);
  EXPECT_EQ(copies.get(matrix.file->data() + 1, 1), nullptr) << "no entry at another address";
  const std::shared_ptr<const cpu::InterleavedRows> rows = copies.get(matrix.file->data(), 1);
  ASSERT_NE(rows, nullptr);
  EXPECT_EQ(rows->groups, 16);
  EXPECT_EQ(static_cast<int64_t>(rows->nbytes), bytes);
  EXPECT_EQ(copies.pending_bytes(), 0);
  EXPECT_EQ(copies.get(matrix.file->data(), 1), rows) << "made once";
  copies.remove(matrix.file->data());
  EXPECT_EQ(copies.get(matrix.file->data(), 1), nullptr);

  // A matrix removed before any product leaves nothing pending.
  copies.add(matrix.file->data(), DType::Q4_K, MappedMatrix::kRows, MappedMatrix::kCols);
  copies.remove(matrix.file->data());
  EXPECT_EQ(copies.pending_bytes(), 0);
}

// The calling thread kept on its CPU for the test: a page just faulted in waits in that CPU's
// batch before it joins the LRU lists, and MADV_PAGEOUT drains only its own CPU's batch (a page
// faulted on another CPU may be skipped, which made the count flaky under a loaded ctest).
class PinnedToThisCpu {
 public:
  PinnedToThisCpu() {
    sched_getaffinity(0, sizeof saved_, &saved_);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    sched_setaffinity(0, sizeof one, &one);
  }
  ~PinnedToThisCpu() { sched_setaffinity(0, sizeof saved_, &saved_); }

 private:
  cpu_set_t saved_;
};

TEST(InterleavedCopies, MappedOriginalLeavesTheResidentSet) {
  if (!cpu::interleaved_rows_supported(DType::Q4_K)) GTEST_SKIP() << "no AVX-512 VNNI on this host: nothing is repacked";
  const PinnedToThisCpu pinned;
  {
    MappedMatrix matrix;
    ASSERT_EQ(matrix.resident_pages(), matrix.whole_pages()) << "read once, every page is resident";
    cpu::InterleavedCopies copies;
    copies.add(matrix.file->data(), DType::Q4_K, MappedMatrix::kRows, MappedMatrix::kCols);
    ASSERT_NE(copies.get(matrix.file->data(), 1), nullptr);
    // Asked: every repacked row's bytes, paged out (a mapped file's pages are never discarded).
    EXPECT_EQ(copies.released().paged_out, static_cast<int64_t>(matrix.file->size()));
    EXPECT_EQ(copies.released().discarded, 0);
    // Done by the kernel: usually every page; a page still waiting in another CPU's LRU batch or in
    // a large folio that crosses the range may stay, so only "fewer than before" is required.
#ifdef MADV_PAGEOUT
    if (madvise(nullptr, 0, MADV_PAGEOUT) != 0 && errno == EINVAL) GTEST_SKIP() << "this kernel has no MADV_PAGEOUT";
    EXPECT_LT(matrix.resident_pages(), matrix.whole_pages()) << "no page of the repacked rows was released";
#endif
  }
}

// Every repacked type: each row restored from the copy equals the row as stored, byte for byte
// (scales, minima, fifth bits, the K-quants' packed 6-bit scales and codes), in both groups.
TEST(InterleavedCopies, RestoreRowInvertsTheRepacking) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  const int64_t n = 40, k = 512;  // two whole groups and 8 rows left as stored
  for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,
                     DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    Tensor values = Tensor::zeros(DType::F32, {n, k});
    for (int64_t i = 0; i < n * k; ++i) values.as<float>()[i] = uniform(rng) * (1.0f + static_cast<float>(i / k % 5));
    const Tensor packed = quant::quantize(values, type);
    const cpu::InterleavedRows rows = cpu::interleave_rows(packed.data, type, n, k, 1);
    ASSERT_EQ(rows.groups, 2);
    const size_t row_bytes = dtype_row_bytes(type, k);
    std::vector<uint8_t> restored(row_bytes);
    for (int64_t r = 0; r < 32; ++r) {
      cpu::restore_row(rows, r, restored.data());
      const auto* original = static_cast<const uint8_t*>(packed.data) + r * row_bytes;
      ASSERT_EQ(std::memcmp(restored.data(), original, row_bytes), 0) << dtype_name(type) << " row " << r;
    }
    EXPECT_THROW(cpu::restore_row(rows, 32, restored.data()), Error) << "row 32 is not in the copy";
  }
}

// A tied head: the embedding gather after the head's first product (the copy made, the original's
// pages released) still gives the table's rows exactly.
TEST(InterleavedCopies, TiedHeadGathersTheSameRowsFromTheCopy) {
  if (!cpu::interleaved_rows_supported(DType::Q4_K)) GTEST_SKIP() << "no AVX-512 VNNI on this host: nothing is repacked";
  std::mt19937_64 rng(12);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::unique_ptr<Backend> backend = make_cpu_backend(2);
  const int64_t vocab = 40, hidden = 256;
  const std::vector<int32_t> ids = {0, 39, 17, 31, 32, 5};  // 32 and 39: rows past the copy's two groups
  for (DType type : {DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    Tensor values = Tensor::zeros(DType::F32, {vocab, hidden});
    for (int64_t i = 0; i < vocab * hidden; ++i) values.as<float>()[i] = uniform(rng);
    const Tensor table = quant::quantize(values, type);
    const Tensor want = quant::dequantize(table);
    DeviceBuffer d_table = backend->upload(table);
    DeviceBuffer d_ids = test::to_device(*backend, ids, {static_cast<int64_t>(ids.size())});
    DeviceBuffer out = backend->allocate(DType::F32, {static_cast<int64_t>(ids.size()), hidden});
    DeviceBuffer x = test::to_device(*backend, std::vector<float>(hidden, 0.5f), {1, hidden});
    DeviceBuffer logits = backend->allocate(DType::F32, {1, vocab});
    backend->matmul(x.view(), d_table.view(), DeviceTensor{}, logits.view(), false);  // the head: repacked now
    backend->embed(d_table.view(), d_ids.view(), 2.0f, DeviceTensor{}, DeviceTensor{}, out.view());
    const std::vector<float> got = test::to_host(*backend, out.view());
    for (size_t t = 0; t < ids.size(); ++t)
      for (int64_t i = 0; i < hidden; ++i)
        ASSERT_EQ(got[t * hidden + i], 2.0f * want.as<float>()[ids[t] * hidden + i])
            << dtype_name(type) << " token " << ids[t] << " element " << i;
  }
}

// Heap bytes only the upload holds (a fused matrix made at load, once the runner dropped the host
// weights) are discarded once repacked; bytes someone else still holds, or any bytes when the
// owner turned discarding off (the GPU/CPU split's offload reads them later), stay as they were.
TEST(InterleavedCopies, ExclusiveHeapOriginalIsDiscardedAndSharedOneKept) {
  if (!cpu::interleaved_rows_supported(DType::Q4_0)) GTEST_SKIP() << "no AVX-512 VNNI on this host: nothing is repacked";
  const PinnedToThisCpu pinned;
  std::mt19937_64 rng(13);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const int64_t n = 256, k = 1024;
  Tensor values = Tensor::zeros(DType::F32, {n, k});
  for (int64_t i = 0; i < n * k; ++i) values.as<float>()[i] = uniform(rng);
  const Tensor packed = quant::quantize(values, DType::Q4_0);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE)), bytes = packed.nbytes();
  const auto heap_copy = [&] {  // page-aligned, as a large allocation is
    void* memory = std::aligned_alloc(page, (bytes + page - 1) / page * page);
    std::memcpy(memory, packed.data, bytes);
    return std::shared_ptr<void>(memory, [](void* p) { std::free(p); });
  };
  const auto resident_pages = [&](const void* data) {
    std::vector<unsigned char> flags(bytes / page);
    EXPECT_EQ(mincore(const_cast<void*>(data), flags.size() * page, flags.data()), 0);
    int64_t resident = 0;
    for (unsigned char flag : flags) resident += flag & 1;
    return resident;
  };
  const auto repack = [&](const std::shared_ptr<void>& storage, bool discard) {
    cpu::InterleavedCopies copies;
    copies.set_discard_exclusive(discard);
    copies.add(storage.get(), DType::Q4_0, n, k, storage);
    const std::shared_ptr<const cpu::InterleavedRows> rows = copies.get(storage.get(), 1);
    const bool exclusive = discard && storage.use_count() == 1;
    EXPECT_EQ(copies.released().discarded, exclusive ? static_cast<int64_t>(bytes) : 0);
    EXPECT_EQ(copies.released().paged_out, exclusive ? 0 : static_cast<int64_t>(bytes));
    // The copy is whole either way: its rows are the stored ones.
    std::vector<uint8_t> row(dtype_row_bytes(DType::Q4_0, k));
    for (int64_t r : {int64_t{0}, n - 1}) {
      cpu::restore_row(*rows, r, row.data());
      EXPECT_EQ(std::memcmp(row.data(), static_cast<const uint8_t*>(packed.data) + r * row.size(), row.size()), 0);
    }
  };
  {
    std::shared_ptr<void> only_the_upload = heap_copy();
    const void* data = only_the_upload.get();
    repack(only_the_upload, true);
    EXPECT_EQ(resident_pages(data), 0) << "discarded";
  }
  {
    std::shared_ptr<void> storage = heap_copy();
    const std::shared_ptr<void> someone_else = storage;
    repack(storage, true);
    EXPECT_EQ(std::memcmp(storage.get(), packed.data, bytes), 0) << "another holder's bytes stay";
  }
  {
    std::shared_ptr<void> storage = heap_copy();
    repack(storage, false);
    EXPECT_EQ(std::memcmp(storage.get(), packed.data, bytes), 0) << "discarding off";
  }
}
