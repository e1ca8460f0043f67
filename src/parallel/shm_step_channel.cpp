#include "parallel/shm_step_channel.h"

#include "core/error.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <random>
#include <thread>

namespace splitflow {

struct SharedMemoryStepChannel::Header {
  struct alignas(64) Ack {
    std::atomic<uint64_t> sequence;
  };
  alignas(64) std::atomic<uint64_t> sequence;  // messages published
  std::atomic<uint64_t> words;                 // length of the last one
  Ack acks[kMaxRanks];                         // per follower: messages taken
};

namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "the shared-memory channel needs lock-free 64-bit atomics");

// Spins, then yields, then sleeps in growing steps (up to 2 ms): a follower that waits through an
// idle server costs no CPU to speak of, one in a busy decode loop wakes within microseconds.
class Backoff {
 public:
  void wait() {
    ++rounds_;
    if (rounds_ < 2000) return;
    if (rounds_ < 4000) {
      std::this_thread::yield();
      return;
    }
    sleep_us_ = std::min(sleep_us_ * 2 + 10, 2000);
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
  }

 private:
  int rounds_ = 0;
  int sleep_us_ = 0;
};

std::string channel_file_name() {
  std::random_device random;
  const std::string dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "";
  return fmt::format("{}splitflow-steps-{}-{:08x}", dir.empty() ? "" : dir + "/", getpid(), random());
}

}  // namespace

SharedMemoryStepChannel::SharedMemoryStepChannel(comm::FileStore& store, const std::string& name,
                                                 size_t capacity_words, std::chrono::milliseconds timeout)
    : rank_(store.rank()), world_size_(store.world_size()), capacity_words_(capacity_words), timeout_(timeout) {
  SF_CHECK(world_size_ <= kMaxRanks, "step channel: {} ranks; at most {}", world_size_, kMaxRanks);
  mapping_bytes_ = sizeof(Header) + capacity_words * sizeof(int32_t);
  std::string path;
  if (rank_ == 0) {
    path = channel_file_name();
    if (path.front() != '/') path = store.dir() + "/" + path;
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    SF_CHECK(fd >= 0, "step channel: cannot create '{}': {}", path, std::strerror(errno));
    const bool sized = ::ftruncate(fd, static_cast<off_t>(mapping_bytes_)) == 0;
    const int size_errno = errno;
    if (sized) mapping_ = ::mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    SF_CHECK(sized, "step channel: cannot size '{}' to {} bytes: {}", path, mapping_bytes_, std::strerror(size_errno));
    SF_CHECK(mapping_ != MAP_FAILED, "step channel: cannot map '{}': {}", path, std::strerror(errno));
    Header* h = new (mapping_) Header;  // the file is zero-filled: every count starts at 0
    h->sequence.store(0, std::memory_order_release);
    store.broadcast(name, path);
  } else {
    path = store.broadcast(name, "");
    const int fd = ::open(path.c_str(), O_RDWR);
    SF_CHECK(fd >= 0, "step channel: cannot open '{}' (rank 0 created it): {}", path, std::strerror(errno));
    mapping_ = ::mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    SF_CHECK(mapping_ != MAP_FAILED, "step channel: cannot map '{}': {}", path, std::strerror(errno));
  }
  store.barrier(name + ".mapped");
  if (rank_ == 0) ::unlink(path.c_str());  // the mappings stay; nothing is left behind on exit
}

SharedMemoryStepChannel::~SharedMemoryStepChannel() {
  if (mapping_ != nullptr && mapping_ != MAP_FAILED) ::munmap(mapping_, mapping_bytes_);
}

SharedMemoryStepChannel::Header* SharedMemoryStepChannel::header() const { return static_cast<Header*>(mapping_); }

int32_t* SharedMemoryStepChannel::payload() const {
  return reinterpret_cast<int32_t*>(static_cast<char*>(mapping_) + sizeof(Header));
}

void SharedMemoryStepChannel::publish(std::span<const int32_t> message) {
  SF_CHECK(rank_ == 0, "step channel: rank {} publishes; only rank 0 leads", rank_);
  SF_CHECK(message.size() <= capacity_words_, "step channel: a message of {} words exceeds the channel's {}",
           message.size(), capacity_words_);
  Header* h = header();
  // Every follower must have taken the previous message before its words are overwritten.
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (int r = 1; r < world_size_; ++r) {
    Backoff backoff;
    while (h->acks[r].sequence.load(std::memory_order_acquire) < sequence_) {
      SF_CHECK(std::chrono::steady_clock::now() < deadline,
               "step channel: rank {} has not taken step message {} in {} s (stopped or stuck)", r, sequence_,
               timeout_.count() / 1000.0);
      backoff.wait();
    }
  }
  std::memcpy(payload(), message.data(), message.size_bytes());
  h->words.store(message.size(), std::memory_order_relaxed);
  h->sequence.store(++sequence_, std::memory_order_release);
}

std::vector<int32_t> SharedMemoryStepChannel::receive() {
  SF_CHECK(rank_ != 0, "step channel: rank 0 leads; it does not receive");
  Header* h = header();
  Backoff backoff;
  while (h->sequence.load(std::memory_order_acquire) == sequence_) backoff.wait();
  ++sequence_;
  const size_t words = h->words.load(std::memory_order_relaxed);
  std::vector<int32_t> message(payload(), payload() + words);
  h->acks[rank_].sequence.store(sequence_, std::memory_order_release);
  return message;
}

void SharedMemoryStepChannel::leave() {
  SF_CHECK(rank_ != 0, "step channel: rank 0 leads; it cannot leave");
  header()->acks[rank_].sequence.store(UINT64_MAX, std::memory_order_release);
}

}  // namespace splitflow
