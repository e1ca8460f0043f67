// The CPU backend's memory_info: /proc/meminfo parsing, cgroup v1 and v2 limits read from a fake
// root, and the live system (free less the host areas handed out).
#include "backend/cpu/host_memory.h"

#include "backend/backend.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace splitflow::test {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kMiB = int64_t{1} << 20, kGiB = int64_t{1} << 30;

const char* const kMeminfo =
    "MemTotal:       16384000 kB\n"
    "MemFree:         1024000 kB\n"
    "MemAvailable:    8192000 kB\n"
    "Buffers:          123456 kB\n"
    "HugePages_Total:       0\n";

TEST(HostMemory, MeminfoFieldsInBytes) {
  EXPECT_EQ(cpu::meminfo_bytes(kMeminfo, "MemTotal"), int64_t{16384000} * 1024);
  EXPECT_EQ(cpu::meminfo_bytes(kMeminfo, "MemAvailable"), int64_t{8192000} * 1024);
  EXPECT_EQ(cpu::meminfo_bytes(kMeminfo, "HugePages_Total"), 0);  // a count, no unit
  EXPECT_EQ(cpu::meminfo_bytes(kMeminfo, "Mem"), std::nullopt);    // whole keys only
  EXPECT_EQ(cpu::meminfo_bytes(kMeminfo, "SwapTotal"), std::nullopt);
  EXPECT_EQ(cpu::meminfo_bytes("MemTotal: lots kB\n", "MemTotal"), std::nullopt);
}

// A fake root: proc/meminfo, proc/self/cgroup and files under sys/fs/cgroup.
class FakeRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            ("host_memory_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    write("proc/meminfo", kMeminfo);
  }
  void TearDown() override { fs::remove_all(root_); }
  void write(const std::string& path, const std::string& text) {
    fs::create_directories((root_ / path).parent_path());
    std::ofstream(root_ / path) << text;
  }
  DeviceMemoryInfo read() const { return cpu::read_host_memory(root_.string()); }

  fs::path root_;
  static constexpr int64_t kTotal = int64_t{16384000} * 1024, kAvailable = int64_t{8192000} * 1024;
};

TEST_F(FakeRoot, WithoutCgroupLimitsMemAvailableOfMemTotal) {
  EXPECT_EQ(read().total_bytes, kTotal);
  EXPECT_EQ(read().free_bytes, kAvailable);
  // A v2 cgroup with no limit ("max") changes nothing.
  write("proc/self/cgroup", "0::/user.slice/session-1.scope\n");
  write("sys/fs/cgroup/user.slice/session-1.scope/memory.max", "max\n");
  write("sys/fs/cgroup/user.slice/session-1.scope/memory.current", "123456\n");
  EXPECT_EQ(read().total_bytes, kTotal);
  EXPECT_EQ(read().free_bytes, kAvailable);
}

TEST_F(FakeRoot, OldKernelsWithoutMemAvailableUseMemFree) {
  write("proc/meminfo", "MemTotal: 1000 kB\nMemFree: 300 kB\n");
  EXPECT_EQ(read().total_bytes, 1000 * 1024);
  EXPECT_EQ(read().free_bytes, 300 * 1024);
}

TEST_F(FakeRoot, CgroupV2LimitOfTheTightestAncestor) {
  write("proc/self/cgroup", "0::/app.slice/worker\n");
  // The slice allows 6 GiB with 5 in use; the worker itself 4 GiB with 1 in use: 1 GiB is free.
  write("sys/fs/cgroup/app.slice/memory.max", std::to_string(6 * kGiB));
  write("sys/fs/cgroup/app.slice/memory.current", std::to_string(5 * kGiB));
  write("sys/fs/cgroup/app.slice/worker/memory.max", std::to_string(4 * kGiB));
  write("sys/fs/cgroup/app.slice/worker/memory.current", std::to_string(kGiB));
  EXPECT_EQ(read().total_bytes, 4 * kGiB);
  EXPECT_EQ(read().free_bytes, kGiB);
}

TEST_F(FakeRoot, CgroupV1MemoryControllerOnly) {
  write("proc/self/cgroup", "5:cpu,cpuacct:/other\n4:memory:/box\n0::/\n");
  write("sys/fs/cgroup/memory/box/memory.limit_in_bytes", std::to_string(2 * kGiB));
  write("sys/fs/cgroup/memory/box/memory.usage_in_bytes", std::to_string(512 * kMiB));
  // The cpu hierarchy's files are not memory limits.
  write("sys/fs/cgroup/cpu,cpuacct/other/memory.limit_in_bytes", std::to_string(kMiB));
  EXPECT_EQ(read().total_bytes, 2 * kGiB);
  EXPECT_EQ(read().free_bytes, 2 * kGiB - 512 * kMiB);
}

TEST_F(FakeRoot, FreeNeverExceedsTotalNorGoesNegative) {
  write("proc/self/cgroup", "4:memory:/box\n");
  write("sys/fs/cgroup/memory/box/memory.limit_in_bytes", std::to_string(kGiB));
  write("sys/fs/cgroup/memory/box/memory.usage_in_bytes", std::to_string(2 * kGiB));  // over its limit
  EXPECT_EQ(read().total_bytes, kGiB);
  EXPECT_EQ(read().free_bytes, 0);
}

// The live system: a sensible reading, and a host area handed out (untouched, so not resident)
// counts as taken until it is released. 4 GiB against 1 GiB of slack for whatever else runs.
TEST(HostMemory, CpuBackendCountsHostAreasAsTaken) {
  auto backend = make_cpu_backend(1);
  const DeviceMemoryInfo before = backend->memory_info();
  ASSERT_GT(before.total_bytes, 0);
  ASSERT_GE(before.free_bytes, 0);
  ASSERT_LE(before.free_bytes, before.total_bytes);
  if (before.free_bytes < 6 * kGiB) GTEST_SKIP() << "less than 6 GiB free: the check would drown in noise";
  std::shared_ptr<void> area = backend->allocate_host(4 * kGiB);
  const DeviceMemoryInfo with_area = backend->memory_info();
  EXPECT_LT(with_area.free_bytes, before.free_bytes - 3 * kGiB);
  area.reset();
  EXPECT_GT(backend->memory_info().free_bytes, with_area.free_bytes + 3 * kGiB);
}

}  // namespace
}  // namespace splitflow::test
