#include "backend/cpu/thread_team.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SPLITFLOW_PAUSE() _mm_pause()
#else
#define SPLITFLOW_PAUSE() std::this_thread::yield()
#endif

namespace splitflow::cpu {
namespace {

std::atomic<bool> pinning{[] {
  const char* pin = std::getenv("SPLITFLOW_CPU_PIN");
  return pin == nullptr || std::string_view(pin) != "0";
}()};

// How long an idle worker spins before it sleeps: longer than the serial work between two kernels
// of a decode step (norms, sampling), far shorter than a scheduler tick.
constexpr auto kSpin = std::chrono::microseconds(500);

// The CPUs the process may run on, read once before main() (so before any thread is pinned): a
// team created after its calling thread was pinned (by an earlier team of another size) would
// otherwise see one CPU and leave its workers unpinned beside the caller.
const std::vector<int> process_cpus = [] {
  std::vector<int> cpus;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  return cpus;
}();

void pin_to(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  pthread_setaffinity_np(pthread_self(), sizeof one, &one);
}

class Team {
 public:
  explicit Team(int num_threads) {
    const bool pin = pinning.load() && static_cast<int>(process_cpus.size()) >= num_threads;
    const std::vector<int> cpus = pin ? process_cpus : std::vector<int>{};
    if (!cpus.empty()) pin_to(cpus[0]);
    for (int t = 1; t < num_threads; ++t)
      workers_.emplace_back([this, cpu = cpus.empty() ? -1 : cpus[static_cast<size_t>(t)]] {
        if (cpu >= 0) pin_to(cpu);
        work();
      });
  }
  ~Team() {
    stop_.store(true);
    state_.fetch_add(uint64_t{1} << 32);  // a new generation wakes every worker
    state_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

  void run(int64_t chunks, const std::function<void(int64_t)>& body) {
    body_.store(&body, std::memory_order_relaxed);
    chunks_.store(chunks, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    // state_: generation (high 32 bits) and the next unclaimed chunk (low 32 bits).
    const uint64_t generation = (state_.load(std::memory_order_relaxed) >> 32) + 1;
    // seq_cst on both sides (here and the worker's sleepers_ increment before it waits): a worker
    // going to sleep either sees the new state or is seen as a sleeper and woken.
    state_.store(generation << 32, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) state_.notify_all();
    take_chunks(generation, body, chunks);
    while (done_.load(std::memory_order_acquire) < chunks) SPLITFLOW_PAUSE();
  }

 private:
  // Claims chunks of `generation` until none is left; a claim fails once the caller started a
  // later job (the generation in state_ moved on), so a late worker never runs a stale job.
  void take_chunks(uint64_t generation, const std::function<void(int64_t)>& body, int64_t chunks) {
    uint64_t state = state_.load(std::memory_order_acquire);
    while ((state >> 32) == generation && static_cast<int64_t>(state & 0xFFFFFFFFu) < chunks) {
      if (!state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      body(static_cast<int64_t>(state & 0xFFFFFFFFu));
      done_.fetch_add(1, std::memory_order_acq_rel);
      state = state_.load(std::memory_order_acquire);
    }
  }

  void work() {
    uint64_t seen = 0;  // the last generation this worker looked at
    while (true) {
      uint64_t state = state_.load(std::memory_order_acquire);
      const auto spin_until = std::chrono::steady_clock::now() + kSpin;
      for (int spins = 0; (state >> 32) == seen; state = state_.load(std::memory_order_acquire)) {
        SPLITFLOW_PAUSE();
        if (++spins % 256 == 0 && std::chrono::steady_clock::now() > spin_until) {
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          state_.wait(state, std::memory_order_seq_cst);  // until the state changes
          sleepers_.fetch_sub(1, std::memory_order_acq_rel);
        }
      }
      if (stop_.load()) return;
      seen = state >> 32;
      // The job of generation `seen` is valid while any of its chunks is unclaimed; if it is
      // already over, take_chunks claims nothing.
      const auto* body = body_.load(std::memory_order_relaxed);
      const int64_t chunks = chunks_.load(std::memory_order_relaxed);
      take_chunks(seen, *body, chunks);
    }
  }

  std::atomic<uint64_t> state_{0};
  std::atomic<const std::function<void(int64_t)>*> body_{nullptr};
  std::atomic<int64_t> chunks_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::vector<std::thread> workers_;
};

}  // namespace

void set_team_pinning(bool on) { pinning.store(on); }

void parallel_chunks(int num_threads, int64_t chunks, const std::function<void(int64_t)>& body) {
  if (chunks <= 0) return;
  if (num_threads <= 1 || chunks == 1) {
    for (int64_t chunk = 0; chunk < chunks; ++chunk) body(chunk);
    return;
  }
  thread_local std::unique_ptr<Team> team;
  thread_local int team_size = 0;
  if (team_size != num_threads) {
    team.reset();
    team = std::make_unique<Team>(num_threads);
    team_size = num_threads;
  }
  team->run(chunks, body);
}

void parallel_ranges(int num_threads, int64_t count, bool parallel,
                     const std::function<void(int64_t begin, int64_t end)>& body) {
  if (count <= 0) return;
  if (!parallel || num_threads <= 1) return body(0, count);
  const int64_t ranges = std::min<int64_t>(count, int64_t{num_threads} * 4);
  parallel_chunks(num_threads, ranges, [&](int64_t r) { body(count * r / ranges, count * (r + 1) / ranges); });
}

}  // namespace splitflow::cpu
