#include "backend/host_mailboxes.h"

#include "core/error.h"

#include <cstring>

namespace splitflow {

namespace {

[[noreturn]] void fail_message(int from, int to, const std::string& reason) {
  ::splitflow::fail("recv: rank {} waits on rank {}, which stopped: {}", to, from, reason);
}

}  // namespace

void HostMailboxes::fail(int rank, const std::string& reason) {
  {
    const std::lock_guard lock(mutex_);
    failed_.emplace(rank, reason);
  }
  arrived_.notify_all();
}

void HostMailboxes::send(int from, int to, const void* data, size_t bytes) {
  const auto* begin = static_cast<const unsigned char*>(data);
  {
    const std::lock_guard lock(mutex_);
    boxes_[{from, to}].emplace_back(begin, begin + bytes);
  }
  arrived_.notify_all();
}

void HostMailboxes::recv(int from, int to, void* data, size_t bytes) {
  std::unique_lock lock(mutex_);
  std::deque<std::vector<unsigned char>>& box = boxes_[{from, to}];
  arrived_.wait(lock, [&] { return !box.empty() || failed_.count(from) > 0; });
  if (box.empty()) fail_message(from, to, failed_.at(from));
  std::vector<unsigned char> message = std::move(box.front());
  box.pop_front();
  lock.unlock();
  SF_CHECK(message.size() == bytes, "recv: rank {} sent {} bytes to rank {}, which expects {}", from,
           message.size(), to, bytes);
  std::memcpy(data, message.data(), bytes);
}

}  // namespace splitflow
