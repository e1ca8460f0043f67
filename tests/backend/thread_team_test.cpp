// backend/cpu/thread_team.h: every chunk of every job runs exactly once, the caller sees every
// chunk's writes when parallel_chunks returns, and a job after the workers went to sleep still
// runs, for team sizes up to more threads than CPUs (pinning then skipped).
#include "backend/cpu/thread_team.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
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

}  // namespace
