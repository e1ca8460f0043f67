// The leader/follower step messages (runtime/step_command.h) and the shared-memory channel that
// carries them (parallel/shm_step_channel.h).
#include "comm/file_store.h"
#include "core/error.h"
#include "parallel/shm_step_channel.h"
#include "runtime/step_command.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <thread>

using namespace splitflow;

namespace {

std::string temp_dir() {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           fmt::format("splitflow-channel-{}-{}", getpid(), std::random_device{}())).string();
  std::filesystem::create_directories(dir);
  return dir;
}

StepCall sample_call() {
  StepCall call{StepCallKind::ForwardSampleMasked};
  call.batch.token_ids = {5, 6, 7, 8};
  call.batch.spans = {{3, 0, {4, 2}, false}, {1, 9, {0, 3, 1}, true}};
  call.batch.logits_mode = LogitsMode::All;
  SamplingRow row;
  row.temperature = 0.7f;
  row.top_k = 40;
  row.top_p = 0.9f;
  row.min_p = 0.05f;
  row.seed = 0x123456789abcdefull;
  row.step = 12;
  call.rows = {row, SamplingRow{}};
  return call;
}

}  // namespace

TEST(StepCommand, EveryCallRoundTrips) {
  const StepCall forward = sample_call();
  const StepCall got = decode_step_call(encode_step_call(forward));
  EXPECT_EQ(got.kind, forward.kind);
  EXPECT_EQ(got.batch.token_ids, forward.batch.token_ids);
  ASSERT_EQ(got.batch.spans.size(), 2u);
  EXPECT_EQ(got.batch.spans[1].block_table, (std::vector<int32_t>{0, 3, 1}));
  EXPECT_EQ(got.batch.spans[0].want_logits, false);
  EXPECT_EQ(got.batch.spans[1].start_position, 9);
  EXPECT_EQ(got.batch.logits_mode, LogitsMode::All);
  ASSERT_EQ(got.rows.size(), 2u);
  EXPECT_EQ(got.rows[0].seed, forward.rows[0].seed);
  EXPECT_EQ(got.rows[0].top_k, 40);
  EXPECT_FLOAT_EQ(got.rows[0].min_p, 0.05f);

  StepCall swap{StepCallKind::SwapBlocks};
  swap.copies = {{3, 0}, {7, 1}};
  swap.direction = CopyDirection::HostToDevice;
  const StepCall swap_got = decode_step_call(encode_step_call(swap));
  EXPECT_EQ(swap_got.direction, CopyDirection::HostToDevice);
  ASSERT_EQ(swap_got.copies.size(), 2u);
  EXPECT_EQ(swap_got.copies[1].device_block, 7);

  StepCall warm{StepCallKind::WarmUp};
  warm.device_sampling = false;
  EXPECT_FALSE(decode_step_call(encode_step_call(warm)).device_sampling);
  EXPECT_EQ(decode_step_call(encode_step_call(StepCall{StepCallKind::Stop})).kind, StepCallKind::Stop);
}

// Found by fuzz_step_command (fuzz/crashes/step_command/empty_lists_null_memcpy.bin): an empty list
// was read with memcpy into an empty vector's null data(), undefined behaviour that the sanitizer
// build (SPLITFLOW_SANITIZE=address,undefined) reports.
TEST(StepCommand, EmptyListsRoundTrip) {
  StepCall call{StepCallKind::ForwardSample};
  call.batch.spans.push_back(SequenceSpan{});  // no tokens, an empty block table, no sampling rows
  call.batch.spans[0].num_tokens = 0;
  const StepCall got = decode_step_call(encode_step_call(call));
  EXPECT_TRUE(got.batch.token_ids.empty());
  ASSERT_EQ(got.batch.spans.size(), 1u);
  EXPECT_TRUE(got.batch.spans[0].block_table.empty());
  EXPECT_TRUE(got.rows.empty());
}

TEST(StepCommand, MalformedMessagesAreErrorsNotReads) {
  const std::vector<int32_t> words = encode_step_call(sample_call());
  for (size_t n = 0; n < words.size(); ++n) {
    EXPECT_THROW(decode_step_call(std::span(words).first(n)), Error) << "truncated to " << n;
  }
  std::vector<int32_t> bad = words;
  bad[0] = 0;
  EXPECT_THROW(decode_step_call(bad), Error);
  bad = words;
  bad[1] = 99;
  EXPECT_THROW(decode_step_call(bad), Error);
  bad = words;
  bad[3] = 1 << 30;  // token count past the message
  EXPECT_THROW(decode_step_call(bad), Error);
  bad = words;
  bad.push_back(0);
  EXPECT_THROW(decode_step_call(bad), Error);
}

TEST(SharedMemoryStepChannel, FollowersReceiveEveryMessageInOrder) {
  const std::string dir = temp_dir();
  constexpr int kRanks = 3, kMessages = 2000;
  std::vector<int64_t> sums(kRanks, 0);
  std::vector<int> ordered(kRanks, 1);
  auto rank_main = [&](int rank) {
    comm::FileStore store(dir, rank, kRanks, std::chrono::seconds(30));
    SharedMemoryStepChannel channel(store, "steps", 4096);
    for (int m = 0; m < kMessages; ++m) {
      if (rank == 0) {
        std::vector<int32_t> message(1 + m % 1000, m);
        channel.publish(message);
      } else {
        const std::vector<int32_t> message = channel.receive();
        if (message.size() != static_cast<size_t>(1 + m % 1000) || message.front() != m || message.back() != m)
          ordered[rank] = 0;
        sums[rank] += message.back();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) threads.emplace_back(rank_main, r);
  for (std::thread& t : threads) t.join();
  std::filesystem::remove_all(dir);
  for (int r = 1; r < kRanks; ++r) {
    EXPECT_EQ(ordered[r], 1) << "rank " << r;
    EXPECT_EQ(sums[r], int64_t{kMessages} * (kMessages - 1) / 2) << "rank " << r;
  }
}

TEST(SharedMemoryStepChannel, OversizedMessagesAndAStuckFollowerAreErrors) {
  const std::string dir = temp_dir();
  std::string leader_error;
  std::thread follower([&] {
    comm::FileStore store(dir, 1, 2, std::chrono::seconds(30));
    SharedMemoryStepChannel channel(store, "steps", 16);
    channel.receive();  // takes the first message only, then stops taking
  });
  {
    comm::FileStore store(dir, 0, 2, std::chrono::seconds(30));
    SharedMemoryStepChannel channel(store, "steps", 16, std::chrono::milliseconds(300));
    std::vector<int32_t> big(17, 1);
    try {
      channel.publish(big);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("17 words"), std::string::npos) << e.what();
    }
    channel.publish(std::vector<int32_t>{1});
    follower.join();
    channel.publish(std::vector<int32_t>{2});  // taken by nobody: the next one cannot overwrite it
    try {
      channel.publish(std::vector<int32_t>{3});
      ADD_FAILURE() << "publish over an untaken message";
    } catch (const Error& e) {
      leader_error = e.what();
    }
  }
  std::filesystem::remove_all(dir);
  EXPECT_NE(leader_error.find("rank 1"), std::string::npos) << leader_error;
}

// A follower that fails leaves the channel: the leader's later messages (the Stop at shutdown)
// do not wait for it, while the followers still in the group keep receiving every message.
TEST(SharedMemoryStepChannel, AFollowerThatLeftIsNotWaitedFor) {
  const std::string dir = temp_dir();
  std::vector<int32_t> kept;
  std::thread leaver([&] {
    comm::FileStore store(dir, 1, 3, std::chrono::seconds(30));
    SharedMemoryStepChannel channel(store, "steps", 16);
    channel.receive();
    channel.leave();  // one message taken, then it stops for good
  });
  std::thread stayer([&] {
    comm::FileStore store(dir, 2, 3, std::chrono::seconds(30));
    SharedMemoryStepChannel channel(store, "steps", 16);
    for (int m = 0; m < 4; ++m) kept.push_back(channel.receive().front());
  });
  {
    comm::FileStore store(dir, 0, 3, std::chrono::seconds(30));
    // A 300 ms timeout: were the leaver still waited for, the third publish would throw.
    SharedMemoryStepChannel channel(store, "steps", 16, std::chrono::milliseconds(300));
    for (int32_t m = 0; m < 4; ++m) {
      EXPECT_NO_THROW(channel.publish(std::vector<int32_t>{m})) << "message " << m;
      if (m == 0) leaver.join();
    }
    stayer.join();
    EXPECT_THROW(channel.leave(), Error);  // the leader cannot leave its own group
  }
  std::filesystem::remove_all(dir);
  EXPECT_EQ(kept, (std::vector<int32_t>{0, 1, 2, 3}));
}
