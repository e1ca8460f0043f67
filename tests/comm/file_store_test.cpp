// comm/file_store: set/get, allgather and barrier between ranks (threads here, processes in the
// GPU tests), the timeout message, key validation and the directory removed by finish().
#include "comm/file_store.h"

#include "core/error.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

using namespace splitflow;
using namespace splitflow::comm;
using namespace std::chrono_literals;

namespace {

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/sf-store-" + name + "-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace

TEST(FileStore, SetThenGetAcrossInstances) {
  const std::string dir = fresh_dir("setget");
  FileStore writer(dir, 0, 2);
  FileStore reader(dir, 1, 2);
  const std::string binary("a\0b\xff", 4);
  writer.set("key", binary);
  EXPECT_EQ(reader.get("key"), binary);
  writer.set("key", "second");  // overwrite is atomic too
  EXPECT_EQ(reader.get("key"), "second");
  std::filesystem::remove_all(dir);
}

TEST(FileStore, GetWaitsForALaterSet) {
  const std::string dir = fresh_dir("wait");
  FileStore writer(dir, 0, 2);
  FileStore reader(dir, 1, 2);
  std::thread late([&] {
    std::this_thread::sleep_for(50ms);
    writer.set("late", "value");
  });
  EXPECT_EQ(reader.get("late"), "value");
  late.join();
  std::filesystem::remove_all(dir);
}

TEST(FileStore, AllgatherBroadcastAndBarrierAmongFourRanks) {
  const std::string dir = fresh_dir("allgather");
  constexpr int kRanks = 4;
  std::vector<std::vector<std::string>> gathered(kRanks);
  std::vector<std::string> broadcast(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      FileStore store(dir, r, kRanks);
      gathered[r] = store.allgather("ids", "rank" + std::to_string(r));
      broadcast[r] = store.broadcast("root", r == 0 ? "from-root" : "ignored");
      store.barrier("done-phase");
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(gathered[r].size(), static_cast<size_t>(kRanks));
    for (int s = 0; s < kRanks; ++s) EXPECT_EQ(gathered[r][s], "rank" + std::to_string(s));
    EXPECT_EQ(broadcast[r], "from-root");
  }
  std::filesystem::remove_all(dir);
}

TEST(FileStore, TimeoutNamesKeyAndDirectory) {
  const std::string dir = fresh_dir("timeout");
  FileStore store(dir, 1, 2, 30ms);
  try {
    store.get("never");
    FAIL() << "expected a timeout";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'never'"), std::string::npos) << message;
    EXPECT_NE(message.find(dir), std::string::npos) << message;
    EXPECT_NE(message.find("30 ms"), std::string::npos) << message;
  }
  std::filesystem::remove_all(dir);
}

TEST(FileStore, RejectsUnsafeKeysAndBadRanks) {
  const std::string dir = fresh_dir("keys");
  FileStore store(dir, 0, 1);
  EXPECT_THROW(store.set("../escape", "x"), Error);
  EXPECT_THROW(store.set("a/b", "x"), Error);
  EXPECT_THROW(store.set("", "x"), Error);
  EXPECT_THROW(store.set("..", "x"), Error);
  EXPECT_THROW(FileStore(dir, 2, 2), Error);
  EXPECT_THROW(FileStore(dir, -1, 2), Error);
  EXPECT_THROW(FileStore("", 0, 1), Error);
  std::filesystem::remove_all(dir);
}

TEST(FileStore, UncreatableDirectoryIsAnError) {
  const std::string file = fresh_dir("file");
  { std::ofstream(file) << "not a directory"; }
  EXPECT_THROW(FileStore(file + "/sub", 0, 1), Error);
  std::filesystem::remove(file);
}

TEST(FileStore, FinishRemovesTheDirectoryOnceEveryRankIsDone) {
  const std::string dir = fresh_dir("finish");
  std::thread other([&] {
    FileStore store(dir, 1, 2);
    store.barrier("work");
    std::this_thread::sleep_for(30ms);
    store.finish();
  });
  FileStore store(dir, 0, 2);
  store.barrier("work");
  store.finish();  // waits for rank 1's done mark
  other.join();
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(FileStore, FinishMarksCannotCollideWithTheCallersKeys) {
  // A barrier named "done" (whose keys are done.0, done.1) must not let rank 0's finish() remove
  // the directory while rank 1 still waits in that barrier.
  const std::string dir = fresh_dir("collide");
  std::string other_error;
  std::thread other([&] {
    try {
      FileStore store(dir, 1, 2, 2s);
      store.barrier("done");  // waits (backing off) for rank 0's done.0
      store.finish();
    } catch (const Error& e) {
      other_error = e.what();
    }
  });
  std::this_thread::sleep_for(50ms);  // rank 1 is polling by now
  FileStore store(dir, 0, 2, 2s);
  store.barrier("done");
  store.finish();
  other.join();
  EXPECT_EQ(other_error, "");
  EXPECT_FALSE(std::filesystem::exists(dir));
  // Names starting with '.' are the store's own.
  FileStore lone(fresh_dir("dot"), 0, 1);
  EXPECT_THROW(lone.set(".finished.0", ""), Error);
  EXPECT_THROW(lone.get(".tmp.x"), Error);
  std::filesystem::remove_all(lone.dir());
}

