// backend/cpu/thread_team.h: every chunk of every job runs exactly once, the caller sees every
// chunk's writes when parallel_chunks returns, and a job after the workers went to sleep still
// runs, for team sizes up to more threads than CPUs (pinning then skipped); a team made on a
// thread already pinned to one CPU still pins its worker to another.
#include "backend/cpu/thread_team.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

using namespace splitflow;

namespace {

TEST(ThreadTeam, EveryChunkOfEveryJobRunsExactlyOnce) {
  std::mt19937 rng(11);
  for (int threads : {1, 2, 3, 4}) {
    std::vector<int> runs(200);  // plain ints: the caller must see the workers' writes
    for (int job = 0; job < 3000; ++job) {
      const int64_t chunks = std::uniform_int_distribution<int64_t>(1, 200)(rng);
      std::fill(runs.begin(), runs.end(), 0);
      cpu::parallel_chunks(threads, chunks, [&](int64_t chunk) { runs[static_cast<size_t>(chunk)] += 1; });
      for (int64_t c = 0; c < 200; ++c)
        ASSERT_EQ(runs[static_cast<size_t>(c)], c < chunks ? 1 : 0)
            << "threads " << threads << " job " << job << " chunk " << c << " of " << chunks;
      // Now and then let the workers go to sleep (they spin about 0.5 ms first).
      if (job % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
  }
}

// Chunks that take long enough for every team thread to join in: all of them do work.
TEST(ThreadTeam, WorkersTakeChunks) {
  std::atomic<int> distinct{0};
  std::vector<std::thread::id> seen(200);
  cpu::parallel_chunks(2, 200, [&](int64_t chunk) {
    seen[static_cast<size_t>(chunk)] = std::this_thread::get_id();
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  });
  for (const std::thread::id& id : seen) distinct += id != seen[0] ? 1 : 0;
  EXPECT_GT(distinct.load(), 0) << "the caller ran every chunk itself";
}

// Before the fix a team read its caller's CPU mask: on a caller already pinned to one CPU (by an
// earlier team of another size, or the OpenMP pinning the CPU backend did at its first matmul) it
// saw one CPU and left its worker unpinned beside the caller, and a 2-thread decode ran at two
// thirds of its speed. Teams now take the process's CPUs.
// The process's CPUs, read before main() as the teams read them (the tests above pin this thread).
const std::vector<int> start_cpus = [] {
  std::vector<int> cpus;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  return cpus;
}();

TEST(ThreadTeam, TeamOfAPinnedCallerPinsItsWorkerToAnotherCpu) {
  const std::vector<int>& cpus = start_cpus;
  if (cpus.size() < 2) GTEST_SKIP() << "needs 2 CPUs, the process may use " << cpus.size();
  std::mutex mutex;
  std::vector<std::vector<int>> worker_masks;  // the CPU masks of the threads other than the caller
  std::thread caller([&] {  // a fresh thread: its team is made by the call below
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[0], &one);
    ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
    const std::thread::id self = std::this_thread::get_id();
    cpu::parallel_chunks(2, 64, [&](int64_t) {
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      if (std::this_thread::get_id() == self) return;
      cpu_set_t mask;
      pthread_getaffinity_np(pthread_self(), sizeof mask, &mask);
      std::vector<int> on;
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &mask)) on.push_back(c);
      const std::lock_guard lock(mutex);
      worker_masks.push_back(on);
    });
  });
  caller.join();
  ASSERT_FALSE(worker_masks.empty()) << "no chunk ran on the worker";
  for (const std::vector<int>& on : worker_masks) EXPECT_EQ(on, std::vector<int>{cpus[1]});
}

}  // namespace
