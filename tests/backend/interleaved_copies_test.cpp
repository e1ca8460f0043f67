// The CPU backend's repacked copies (backend/cpu/interleaved_rows.h): made at a matrix's first
// product, counted as taken memory until then, and the mapped original's pages released afterwards
// unless the matrix is an embedding table too. Residency is read with mincore(2) on a real file
// mapping (core/mapped_file.h), as the GGUF loader maps checkpoints.
#include "backend/cpu/interleaved_rows.h"
#include "core/mapped_file.h"
#include "quant/quant.h"

#include <gtest/gtest.h>

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
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

TEST(InterleavedCopies, MappedOriginalLeavesTheResidentSetUnlessGathered) {
  if (!cpu::interleaved_rows_supported(DType::Q4_K)) GTEST_SKIP() << "no AVX-512 VNNI on this host: nothing is repacked";
  const PinnedToThisCpu pinned;
  {
    MappedMatrix matrix;
    ASSERT_EQ(matrix.resident_pages(), matrix.whole_pages()) << "read once, every page is resident";
    cpu::InterleavedCopies copies;
    copies.add(matrix.file->data(), DType::Q4_K, MappedMatrix::kRows, MappedMatrix::kCols);
    ASSERT_NE(copies.get(matrix.file->data(), 1), nullptr);
#ifdef MADV_PAGEOUT
    if (madvise(nullptr, 0, MADV_PAGEOUT) != 0 && errno == EINVAL) GTEST_SKIP() << "this kernel has no MADV_PAGEOUT";
    EXPECT_EQ(matrix.resident_pages(), 0) << "the repacked rows' pages were released";
#endif
  }
  MappedMatrix tied;
  cpu::InterleavedCopies copies;
  copies.add(tied.file->data(), DType::Q4_K, MappedMatrix::kRows, MappedMatrix::kCols);
  copies.keep_resident(tied.file->data());  // the embedding gather ran first
  ASSERT_NE(copies.get(tied.file->data(), 1), nullptr);
  EXPECT_EQ(tied.resident_pages(), tied.whole_pages()) << "an embedding table's pages stay";
}
