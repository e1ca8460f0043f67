#include "profile/profile.h"

#include "core/error.h"
#include "engine/generator.h"

#ifdef SPLITFLOW_HAS_HTTP_SERVER
#include "splitwise/tcp_kv_transport.h"
#include "splitwise/transfer_metrics.h"
#endif

#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <set>
#include <thread>

namespace splitflow::profile {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point start) { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); }

std::vector<int32_t> clipped(std::vector<int32_t> values, int64_t limit) {
  std::erase_if(values, [limit](int32_t v) { return v > limit; });
  return values;
}

int32_t largest(const std::vector<int32_t>& values) {
  return values.empty() ? 0 : *std::max_element(values.begin(), values.end());
}

// Consecutive block ids [first, first + count).
std::vector<int32_t> block_range(int32_t first, int32_t count) {
  std::vector<int32_t> table(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) table[static_cast<size_t>(i)] = first + i;
  return table;
}

}  // namespace

ProfileGrid default_grid(int64_t max_position) {
  ProfileGrid grid;
  // A decode step at context c writes position c: the largest context leaves room for it.
  grid.prompt_tokens = clipped({16, 64, 128, 256, 512, 1024, 2048, 4096}, max_position);
  grid.batch_sizes = {1, 2, 4, 8, 16, 32, 64};
  grid.context_tokens = clipped({0, 128, 512, 1024, 2048, 4096}, max_position - 1);
  grid.kv_transfer_tokens = clipped({128, 512, 1024, 2048, 4096}, max_position);
  grid.repetitions = 3;
  grid.decode_steps = 8;
  return grid;
}

ProfileGrid quick_grid(int64_t max_position) {
  ProfileGrid grid;
  grid.prompt_tokens = clipped({8, 32, 64}, max_position);
  grid.batch_sizes = {1, 4};
  grid.context_tokens = clipped({0, 64, 128}, max_position - 1);
  grid.kv_transfer_tokens = clipped({16, 64}, max_position);
  grid.repetitions = 2;
  grid.decode_steps = 2;
  return grid;
}

void check_grid(const ProfileGrid& grid, const ModelSpec& spec) {
  const int64_t context = spec.max_position;
  auto check_axis = [&](const std::vector<int32_t>& values, const char* flag, int32_t min_value, int64_t max_value,
                        const char* max_meaning, bool interpolated) {
    for (int32_t v : values) {
      SF_CHECK(v >= min_value, "{}: {} is not allowed (values must be at least {})", flag, v, min_value);
      SF_CHECK(v <= max_value, "{}: {} exceeds {} ({} for this model, whose context is {} tokens)", flag, v,
               max_meaning, max_value, context);
    }
    const std::set<int32_t> distinct(values.begin(), values.end());
    SF_CHECK(distinct.size() == values.size(), "{}: a value is repeated", flag);
    SF_CHECK(!interpolated || distinct.size() >= 2,
             "{}: needs at least two distinct values (the simulator interpolates between them), got {}", flag,
             distinct.size());
  };
  check_axis(grid.prompt_tokens, "--prompt-sizes", 1, context, "the model's context", true);
  check_axis(grid.batch_sizes, "--batch-sizes", 1, 1 << 16, "the largest batch profiled", true);
  check_axis(grid.context_tokens, "--context-lengths", 0, context - 1, "the model's context less the step's own token",
             true);
  check_axis(grid.kv_transfer_tokens, "--kv-transfer-sizes", 1, context, "the model's context", false);
  SF_CHECK(grid.kv_transfer_tokens.empty() || grid.kv_transfer_tokens.size() >= 2,
           "--kv-transfer-sizes: needs at least two sizes (the simulator interpolates between them), or none");
  SF_CHECK(grid.repetitions >= 1, "--repetitions must be at least 1, got {}", grid.repetitions);
  SF_CHECK(grid.decode_steps >= 1, "--decode-steps must be at least 1, got {}", grid.decode_steps);
}

RunnerShape runner_shape(const ProfileGrid& grid, int32_t block_size, std::optional<DType> kv_cache_dtype) {
  const int32_t prefill_blocks = blocks_for_tokens(largest(grid.prompt_tokens), block_size);
  const int32_t decode_blocks =
      largest(grid.batch_sizes) * blocks_for_tokens(static_cast<int64_t>(largest(grid.context_tokens)) + 1, block_size);
  const int32_t transfer_blocks = 2 * blocks_for_tokens(largest(grid.kv_transfer_tokens), block_size);
  RunnerShape shape;
  shape.kv = KvCacheConfig{std::max({prefill_blocks, decode_blocks, transfer_blocks}), block_size, 0, kv_cache_dtype};
  shape.limits = RunnerLimits{std::max(largest(grid.prompt_tokens), largest(grid.batch_sizes)), largest(grid.batch_sizes)};
  return shape;
}

std::vector<ProfileRow> profile_steps(ModelRunner& runner, Backend& backend, const KvCacheConfig& kv,
                                      const ProfileGrid& grid, const Progress& progress) {
  const int32_t block_size = kv.block_size;
  const int32_t vocab = runner.spec().vocab_size;
  std::mt19937_64 rng(0);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::vector<ProfileRow> rows;

  auto prefill = [&](int32_t n) {
    ForwardBatch batch;
    for (int32_t i = 0; i < n; ++i) batch.token_ids.push_back(token(rng));
    batch.spans.push_back({n, 0, block_range(0, blocks_for_tokens(n, block_size)), true});
    const auto start = Clock::now();
    runner.forward_sample(batch, std::vector<SamplingRow>(1));
    return ms_since(start);
  };
  // `steps` decode steps of `batch` sequences at `context` cached tokens each; mean ms per step.
  auto decode = [&](int32_t batch_size, int32_t context, int32_t steps) {
    const int32_t blocks_per_seq = blocks_for_tokens(static_cast<int64_t>(context) + 1, block_size);
    ForwardBatch batch;
    for (int32_t s = 0; s < batch_size; ++s) {
      batch.token_ids.push_back(token(rng));
      batch.spans.push_back({1, context, block_range(s * blocks_per_seq, blocks_per_seq), true});
    }
    const std::vector<SamplingRow> greedy(static_cast<size_t>(batch_size));
    const auto start = Clock::now();
    for (int32_t step = 0; step < steps; ++step) batch.token_ids = runner.forward_sample(batch, greedy);
    return ms_since(start) / steps;
  };

  // One-time costs (GEMM plans, module loads) before anything is timed.
  prefill(grid.prompt_tokens.front());
  backend.synchronize();
  for (int32_t n : grid.prompt_tokens) {
    prefill(n);  // untimed: this size's first forward
    for (int32_t rep = 0; rep < grid.repetitions; ++rep) {
      const double ms = prefill(n);
      rows.push_back(ProfileRow{"prompt", n, 1, 0, 0, ms, rep});
      if (progress) progress(fmt::format("prompt {:>6} tokens: {:10.3f} ms", n, ms));
    }
  }
  for (int32_t b : grid.batch_sizes) {
    for (int32_t c : grid.context_tokens) {
      decode(b, c, 1);  // untimed: records this batch size's step where the backend records
      for (int32_t rep = 0; rep < grid.repetitions; ++rep) {
        const double ms = decode(b, c, grid.decode_steps);
        rows.push_back(ProfileRow{"token", 0, b, c, 0, ms, rep});
        if (progress) progress(fmt::format("decode batch {:>4} context {:>6}: {:10.3f} ms/step", b, c, ms));
      }
    }
  }
  return rows;
}

#ifdef SPLITFLOW_HAS_HTTP_SERVER

namespace {

// What the loopback carries with nothing but a socket on each end: `bytes` written by one thread
// and read by this one, in GB/s (1e9) — the link the transfers are a fraction of.
double loopback_tcp_gbps(int64_t bytes) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  SF_CHECK(listener >= 0, "loopback bandwidth: socket: {}", std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  const bool listening = ::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                         ::listen(listener, 1) == 0 &&
                         ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  if (!listening) {
    const int error = errno;
    ::close(listener);
    fail("loopback bandwidth: cannot listen on 127.0.0.1: {}", std::strerror(error));
  }
  std::thread writer([address, bytes] {
    const int out = ::socket(AF_INET, SOCK_STREAM, 0);
    if (out < 0) return;
    if (::connect(out, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0) {
      std::vector<char> chunk(size_t{1} << 20, 1);
      for (int64_t left = bytes; left > 0;) {
        const ssize_t sent = ::send(out, chunk.data(), static_cast<size_t>(std::min<int64_t>(left, chunk.size())),
                                    MSG_NOSIGNAL);
        if (sent <= 0) break;
        left -= sent;
      }
    }
    ::close(out);
  });
  const int in = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  int64_t received = 0;
  const auto start = Clock::now();
  if (in >= 0) {
    std::vector<char> chunk(size_t{1} << 20);
    for (ssize_t got; received < bytes && (got = ::recv(in, chunk.data(), chunk.size(), 0)) > 0;) received += got;
    ::close(in);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  writer.join();
  SF_CHECK(received == bytes, "loopback bandwidth: {} of {} bytes arrived", received, bytes);
  return static_cast<double>(bytes) / seconds / 1e9;
}

}  // namespace

bool kv_transfer_available() { return true; }

std::vector<ProfileRow> profile_kv_transfer(ModelRunner& runner, Backend& backend, const KvCacheConfig& kv,
                                            const ProfileGrid& grid, nlohmann::json& link, const Progress& progress) {
  std::vector<ProfileRow> rows;
  if (grid.kv_transfer_tokens.empty()) return rows;
  using namespace splitwise;
  const ModelSpec& spec = runner.spec();
  const int32_t block_size = kv.block_size;
  const int32_t largest_blocks = blocks_for_tokens(largest(grid.kv_transfer_tokens), block_size);
  const KvCache cache{&backend, runner.k_cache_view(), runner.v_cache_view(),
                      KvLayout{spec.num_layers, spec.attention.num_kv_heads, spec.attention.head_dim,
                               runner.kv_cache_dtype()},
                      kv.num_blocks, block_size};
  // The prompt side's rows come from blocks [0, B), the token side's reservation is [B, 2B).
  const std::vector<int32_t> source = block_range(0, largest_blocks);
  const std::vector<int32_t> target = block_range(largest_blocks, largest_blocks);

  // The prompt side hands each request to this thread, which sends the rows as the engine thread
  // of a prompt instance would.
  struct Pending {
    std::mutex mutex;
    std::promise<std::shared_ptr<KvSendChannel>> channel;
  };
  auto pending = std::make_shared<Pending>();
  TransferMetrics sender_metrics, receiver_metrics;
  TcpKvConfig sender_config;
  sender_config.port = 0;
  TcpKvTransport sender(sender_config, sender_metrics, [pending](TransferRequest, std::shared_ptr<KvSendChannel> channel) {
    std::lock_guard lock(pending->mutex);
    pending->channel.set_value(std::move(channel));
  });
  TcpKvTransport receiver(TcpKvConfig{}, receiver_metrics);
  sender.start();
  receiver.start();
  const double link_gbps = loopback_tcp_gbps(int64_t{256} << 20);
  link = {{"transport", "splitwise::TcpKvTransport (TCP, host staging on both sides)"},
          {"address", sender.address()},
          {"link", "loopback (one host, one process)"},
          {"loopback_tcp_gbps", link_gbps},
          {"mode", "serialized: every layer's rows after the prompt, written into the receiver's reservation"},
          {"kv_layout", cache.layout.describe()}};

  auto transfer = [&](int32_t n, int32_t id) {
    {
      std::lock_guard lock(pending->mutex);
      pending->channel = {};
    }
    std::future<std::shared_ptr<KvSendChannel>> channel_ready = pending->channel.get_future();
    TransferRequest request{fmt::format("profile-{}", id), std::vector<int32_t>(static_cast<size_t>(n), 0),
                            TransferMode::Serialized, cache.layout};
    std::promise<std::function<void()>> done;
    std::future<std::function<void()>> written = done.get_future();
    FetchCallbacks callbacks;
    callbacks.done = [&done](std::function<void()> write, TransferStats) { done.set_value(std::move(write)); };
    callbacks.failed = [&done](const std::string& message) {
      done.set_exception(std::make_exception_ptr(Error(fmt::format("KV transfer over the loopback failed: {}", message))));
    };
    const auto start = Clock::now();
    receiver.fetch(sender.address(), std::move(request), cache, KvTarget{target, 0}, std::move(callbacks));
    std::shared_ptr<KvSendChannel> channel = channel_ready.get();
    for (int32_t layer = 0; layer < spec.num_layers; ++layer) channel->send_rows(cache, layer, 0, n, source);
    channel->finish(TransferStats{});
    written.get()();  // the token side's write into its reservation
    backend.synchronize();
    return ms_since(start);
  };

  transfer(grid.kv_transfer_tokens.front(), -1);  // untimed: the first connection
  const int64_t bytes_per_token = 2 * static_cast<int64_t>(spec.num_layers) * cache.layout.row_bytes();
  int32_t id = 0;
  for (int32_t n : grid.kv_transfer_tokens) {
    for (int32_t rep = 0; rep < grid.repetitions; ++rep) {
      const double ms = transfer(n, id++);
      const int64_t bytes = bytes_per_token * n;
      rows.push_back(ProfileRow{"kv_transfer", n, 1, 0, bytes, ms, rep});
      const double gbps = static_cast<double>(bytes) / ms / 1e6;
      if (progress)
        progress(fmt::format("kv transfer {:>6} tokens ({:.1f} MiB): {:10.3f} ms ({:.2f} GB/s, {:.2f} of the link's "
                             "{:.2f})",
                             n, static_cast<double>(bytes) / (1 << 20), ms, gbps, gbps / link_gbps, link_gbps));
      if (n == largest(grid.kv_transfer_tokens))  // the best repetition of the largest transfer
        link["largest_transfer_fraction_of_link"] =
            std::max(link.value("largest_transfer_fraction_of_link", 0.0), gbps / link_gbps);
    }
  }
  receiver.stop();
  sender.stop();
  return rows;
}

#else

bool kv_transfer_available() { return false; }

std::vector<ProfileRow> profile_kv_transfer(ModelRunner&, Backend&, const KvCacheConfig&, const ProfileGrid& grid,
                                            nlohmann::json&, const Progress&) {
  SF_CHECK(grid.kv_transfer_tokens.empty(),
           "--kv-transfer-sizes: this build has no Splitwise KV transport (it needs Boost.Beast); pass "
           "--kv-transfer-sizes '' to profile without transfers");
  return {};
}

#endif

void check_writable(const std::string& path, const std::string& flag) {
  SF_CHECK(!path.empty(), "{}: no path given", flag);
  const std::filesystem::path file(path);
  SF_CHECK(!std::filesystem::is_directory(file), "{} '{}': is a directory, not a file", flag, path);
  const std::filesystem::path dir = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  SF_CHECK(std::filesystem::is_directory(dir), "{} '{}': the directory '{}' does not exist", flag, path, dir.string());
  const bool existed = std::filesystem::exists(file);
  {
    std::ofstream probe(path, std::ios::app);
    SF_CHECK(probe.good(), "{} '{}': cannot be written ({})", flag, path, std::strerror(errno));
  }
  if (!existed) std::filesystem::remove(file);
}

void write_perf_csv(const std::string& path, const PerfModelKey& key, const std::vector<ProfileRow>& rows) {
  std::ofstream out(path);
  SF_CHECK(out.good(), "cannot write the perf-model CSV '{}'", path);
  out << "model,hardware,tensor_parallel,phase,prompt_size,batch_size,context_tokens,kv_bytes,prompt_time,token_time,"
         "transfer_time,repetition\n";
  for (const ProfileRow& row : rows) {
    const std::string time = fmt::format("{:.6f}", row.time_ms);
    const bool prompt = row.phase == "prompt", token = row.phase == "token", transfer = row.phase == "kv_transfer";
    out << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{}\n", key.model, key.hardware, key.tensor_parallel, row.phase,
                       token ? "" : std::to_string(row.prompt_size), row.batch_size,
                       token ? std::to_string(row.context_tokens) : (prompt ? "0" : ""),
                       transfer ? std::to_string(row.kv_bytes) : "", prompt ? time : "", token ? time : "",
                       transfer ? time : "", row.repetition);
  }
  out.close();
  SF_CHECK(out.good(), "writing the perf-model CSV '{}' failed", path);
}

}  // namespace splitflow::profile
