#include "backend/host_mailboxes.h"

#include "core/error.h"

#include <cstring>

namespace splitflow {

namespace {

bool is_float_activation(DType dtype) { return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16; }

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

void HostMailboxes::send(int from, int to, const void* data, DType dtype, int64_t count) {
  const auto* begin = static_cast<const unsigned char*>(data);
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  {
    const std::lock_guard lock(mutex_);
    boxes_[{from, to}].push_back(Message{dtype, count, std::vector<unsigned char>(begin, begin + bytes)});
    bytes_sent_[{from, to}] += static_cast<int64_t>(bytes);
  }
  arrived_.notify_all();
}

int64_t HostMailboxes::bytes_sent(int from, int to) const {
  const std::lock_guard lock(mutex_);
  const auto it = bytes_sent_.find({from, to});
  return it == bytes_sent_.end() ? 0 : it->second;
}

void HostMailboxes::recv(int from, int to, void* data, DType dtype, int64_t count) {
  std::unique_lock lock(mutex_);
  std::deque<Message>& box = boxes_[{from, to}];
  arrived_.wait(lock, [&] { return !box.empty() || failed_.count(from) > 0; });
  if (box.empty()) fail_message(from, to, failed_.at(from));
  Message message = std::move(box.front());
  box.pop_front();
  lock.unlock();
  SF_CHECK(message.count == count, "recv: rank {} sent {} {} elements to rank {}, which expects {}", from,
           message.count, dtype_name(message.dtype), to, count);
  if (message.dtype == dtype) {
    std::memcpy(data, message.bytes.data(), message.bytes.size());
    return;
  }
  SF_CHECK(is_float_activation(message.dtype) && is_float_activation(dtype),
           "recv: rank {} sent {} to rank {}, which expects {}", from, dtype_name(message.dtype), to,
           dtype_name(dtype));
  // A CPU stage's f32 residual stream into a GPU stage's bf16 one, or back.
  std::vector<float> values(static_cast<size_t>(count));
  convert_to_f32(message.dtype, message.bytes.data(), values.data(), values.size());
  convert_from_f32(values.data(), dtype, data, values.size());
}

}  // namespace splitflow
