// bench/probes/step_channel_latency.cpp — how long a step message takes from the leader to a
// follower process through parallel/shm_step_channel.h: rank 0 publishes a decode-sized message
// (64 one-token spans with 8-block tables and sampling rows, as runtime/step_command.h encodes
// them: ~1,350 words) to a follower process spinning in receive() (as a follower does between
// steps), which answers with a one-word message on a second channel it leads: half the round trip
// is the one-way latency of a step message. A design probe for issue 26 (parallel/launch.h's choice of shared memory over an NCCL
// broadcast, which pays a host-to-device copy, the broadcast and a device-to-host copy), not part
// of the build:
//   g++ -O2 -std=c++20 -Isrc -Ibuild-cpu/generated bench/probes/step_channel_latency.cpp \
//     build-cpu/libsplitflow_lib.a -lfmt -lspdlog -lpcre2-8 -lxxhash -fopenmp -o /tmp/step_channel_latency
//   /tmp/step_channel_latency
// Results: docs/parallel.md (The step channel).
#include "comm/file_store.h"
#include "parallel/shm_step_channel.h"
#include "runtime/step_command.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

using namespace splitflow;

int main() {
  const std::string dir = fmt::format("/tmp/step-channel-probe-{}", getpid());
  std::filesystem::create_directories(dir);
  StepCall call{StepCallKind::ForwardSample};
  for (int s = 0; s < 64; ++s) {
    call.batch.token_ids.push_back(s);
    call.batch.spans.push_back({1, 100 + s, std::vector<int32_t>(8, s), true});
  }
  call.rows.resize(64);
  const std::vector<int32_t> message = encode_step_call(call);
  constexpr int kRounds = 20000;
  const pid_t child = fork();
  const int rank = child == 0 ? 1 : 0;
  comm::FileStore store(dir, rank, 2);
  comm::FileStore reverse(dir + "-up", 1 - rank, 2);  // the follower leads the answers
  SharedMemoryStepChannel down(store, "down");
  SharedMemoryStepChannel up(reverse, "up");
  const std::vector<int32_t> answer = {1};
  if (rank == 1) {  // the follower
    for (int i = 0; i < kRounds; ++i) {
      const std::vector<int32_t> got = down.receive();
      if (got.size() != message.size()) return 1;
      up.publish(answer);
    }
    return 0;
  }
  std::vector<double> us;
  us.reserve(kRounds);
  for (int i = 0; i < kRounds; ++i) {
    const auto start = std::chrono::steady_clock::now();
    down.publish(message);
    up.receive();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  waitpid(child, nullptr, 0);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir + "-up");
  std::sort(us.begin(), us.end());
  std::printf("message %zu words, %d round trips (message there, one word back): p50 %.2f us, p90 %.2f us, "
              "p99 %.2f us; one way ~ half\n",
              message.size(), kRounds, us[us.size() / 2], us[us.size() * 9 / 10], us[us.size() * 99 / 100]);
}
