#include "splitwise/tcp_kv_transport.h"

#include "core/error.h"
#include "splitwise/kv_frames.h"
#include "splitwise/kv_rows.h"

#include <boost/asio.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>

namespace splitflow::splitwise {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

using namespace wire;  // the frames (kv_frames.h)

namespace {

// Wait frames keep a transfer alive for at most this many idle timeouts without a row.
constexpr int kMaxWaitTimeouts = 10;

double ms_since(Clock::time_point start) { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); }

}  // namespace

struct TcpKvTransport::Impl : std::enable_shared_from_this<Impl> {
  Impl(TcpKvConfig config, TransferMetrics& metrics, TransferHandler handler)
      : config(std::move(config)), metrics(metrics), handler(std::move(handler)), guard(asio::make_work_guard(io)) {}

  TcpKvConfig config;
  TransferMetrics& metrics;
  TransferHandler handler;
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> guard;
  std::optional<tcp::acceptor> acceptor;
  std::thread thread;
  int port = 0;

  void accept();
};

namespace {

// The prompt side of one transfer: reads the request, hands it to the handler, writes what the
// exporter gives (in order, one write at a time), waits for the receiver's Ack.
class ServerConnection : public KvSendChannel, public std::enable_shared_from_this<ServerConnection> {
 public:
  ServerConnection(TcpKvTransport::Impl& impl, tcp::socket socket)
      : impl_(impl), socket_(std::move(socket)), idle_(impl.io), delay_(impl.io), heartbeat_(impl.io) {}

  void start() {
    start_ = Clock::now();
    arm_idle("reading the transfer request");
    asio::async_read(socket_, asio::buffer(&header_, sizeof header_),
                     [self = shared_from_this()](boost::system::error_code ec, size_t) { self->on_request_header(ec); });
  }

  void send_rows(const KvCache& cache, int32_t layer, int32_t first_position, int32_t num_tokens,
                 std::span<const int32_t> block_table) override {
    if (closed_ || num_tokens <= 0) return;
    const int64_t row_bytes = cache.layout.row_bytes();
    const int64_t bytes = 2 * num_tokens * row_bytes;
    std::string payload(kRowsHeaderBytes + static_cast<size_t>(bytes), '\0');
    const int32_t fields[4] = {layer, first_position, num_tokens, 0};
    std::memcpy(payload.data(), fields, sizeof fields);
    char* k = payload.data() + kRowsHeaderBytes;
    read_rows(cache, layer, first_position, num_tokens, block_table, k, k + num_tokens * row_bytes);
    const double at_ms = ms_since(start_);
    asio::post(impl_.io, [self = shared_from_this(), out = frame(kRows, payload), bytes, at_ms]() mutable {
      if (self->stats_.bytes == 0) self->stats_.first_layer_ms = at_ms;
      self->stats_.bytes += bytes;
      self->enqueue(std::move(out));
    });
  }

  void finish(TransferStats stats) override {
    const double at_ms = ms_since(start_);
    asio::post(impl_.io, [self = shared_from_this(), at_ms] {
      self->stats_.computed_ms = at_ms;
      self->finished_ = true;
      self->write_next();
    });
  }

  void fail(const std::string& message) override {
    asio::post(impl_.io, [self = shared_from_this(), message] {
      if (self->closed_) return;
      self->failing_ = true;
      self->impl_.metrics.send_failed();
      self->counted_ = true;
      // Rows not written yet are dropped (the one being written stays until its write ends).
      while (self->out_.size() > (self->writing_ ? 1u : 0u)) {
        self->staged_ -= static_cast<int64_t>(self->out_.back().size());
        self->impl_.metrics.add_staged(-static_cast<int64_t>(self->out_.back().size()));
        self->out_.pop_back();
      }
      self->enqueue(frame(kError, error_payload(message)));
    });
  }

  bool closed() const override { return closed_; }

 private:
  void on_request_header(boost::system::error_code ec) {
    if (ec) return close(fmt::format("reading the transfer request: {}", ec.message()));
    try {
      check_request_header(header_);
    } catch (const std::exception& e) {
      return refuse(e.what());
    }
    payload_.resize(header_.length);
    asio::async_read(socket_, asio::buffer(payload_), [self = shared_from_this()](boost::system::error_code ec, size_t) {
      self->on_request(ec);
    });
  }

  void on_request(boost::system::error_code ec) {
    if (ec) return close(fmt::format("reading the transfer request: {}", ec.message()));
    idle_.cancel();
    TransferRequest request;
    try {
      ParsedRequest parsed = parse_request(payload_);
      request = std::move(parsed.request);
      // The receiver's patience sets the heartbeat, whatever this side's own timeout is.
      if (parsed.receiver_timeout.count() > 0) receiver_timeout_ = parsed.receiver_timeout;
    } catch (const std::exception& e) {
      return refuse(e.what());
    }
    payload_.clear();
    spdlog::debug("kv transfer {}: {} tokens requested ({})", request.transfer_id, request.token_ids.size(),
                  transfer_mode_name(request.mode));
    // The receiver sends nothing more until its Ack: this read sees the Ack, or the receiver going away.
    asio::async_read(socket_, asio::buffer(&header_, sizeof header_),
                     [self = shared_from_this()](boost::system::error_code ec, size_t) { self->on_tail(ec); });
    if (!impl_.handler) return refuse("this instance does not serve KV transfers (its role is token)");
    heartbeat();
    try {
      impl_.handler(std::move(request), shared_from_this());
    } catch (const std::exception& e) {
      fail(e.what());
    }
  }

  void on_tail(boost::system::error_code ec) {
    if (ec) return close(acked_ ? "" : fmt::format("the token instance went away mid-transfer ({})", ec.message()));
    if (header_.magic == kMagic && header_.type == kAck && header_.length == 0 && done_written_) {
      acked_ = true;
      impl_.metrics.sent(stats_);
      counted_ = true;
      return close("");
    }
    close("the token instance sent an unexpected frame");
  }

  // While the prefill waits in the engine's queue (or computes) and nothing else is being written,
  // a Wait frame tells the receiver the sender is alive, so a busy prompt instance is not taken for
  // a stalled one; a stopped or hung process sends none.
  void heartbeat() {
    const std::chrono::milliseconds patience = std::min(impl_.config.idle_timeout, receiver_timeout_);
    heartbeat_.expires_after(std::max<std::chrono::milliseconds>(patience / 3, std::chrono::milliseconds(5)));
    heartbeat_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec || self->closed_ || self->done_queued_ || self->failing_) return;
      if (!self->writing_ && self->out_.empty()) self->enqueue(frame(kWait, ""));
      self->heartbeat();
    });
  }

  void refuse(const std::string& message) {
    spdlog::warn("kv transfer refused: {}", message);
    impl_.metrics.send_failed();
    counted_ = true;
    failing_ = true;
    enqueue(frame(kError, error_payload(message)));
  }

  void enqueue(std::string out) {
    if (closed_) return;
    staged_ += static_cast<int64_t>(out.size());
    impl_.metrics.add_staged(static_cast<int64_t>(out.size()));
    out_.push_back(std::move(out));
    write_next();
  }

  void write_next() {
    if (writing_ || closed_) return;
    if (out_.empty()) {
      if (finished_ && !done_queued_ && !failing_) {
        done_queued_ = true;
        stats_.sent_ms = ms_since(start_);
        enqueue(frame(kDone, stats_json(stats_).dump()));
      }
      return;
    }
    writing_ = true;
    const bool rows = static_cast<uint8_t>(out_.front()[4]) == kRows;
    if (rows && impl_.config.debug_rows_delay.count() > 0) {
      delay_.expires_after(impl_.config.debug_rows_delay);
      delay_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
        if (!ec) self->write_front();
      });
      return;
    }
    write_front();
  }

  void write_front() {
    if (closed_) return;
    arm_idle("a write the token instance does not take");
    asio::async_write(socket_, asio::buffer(out_.front()), [self = shared_from_this()](boost::system::error_code ec, size_t) {
      self->on_written(ec);
    });
  }

  void on_written(boost::system::error_code ec) {
    idle_.cancel();
    writing_ = false;
    if (closed_) return;
    if (ec) return close(fmt::format("writing to the token instance: {}", ec.message()));
    const uint8_t type = static_cast<uint8_t>(out_.front()[4]);
    staged_ -= static_cast<int64_t>(out_.front().size());
    impl_.metrics.add_staged(-static_cast<int64_t>(out_.front().size()));
    out_.pop_front();
    if (type == kError) return close("");
    if (type == kDone) {
      done_written_ = true;
      arm_idle("waiting for the token instance's Ack");
      return;
    }
    write_next();
  }

  void arm_idle(const char* what) {
    idle_.expires_after(impl_.config.idle_timeout);
    idle_.async_wait([self = shared_from_this(), what](boost::system::error_code ec) {
      if (!ec) self->close(fmt::format("no progress for {} ms: {}", self->impl_.config.idle_timeout.count(), what));
    });
  }

  void close(const std::string& reason) {
    if (closed_) return;
    closed_ = true;
    if (!reason.empty()) spdlog::warn("kv transfer (prompt side): {}", reason);
    if (!counted_) impl_.metrics.send_failed();
    counted_ = true;
    impl_.metrics.add_staged(-staged_);
    staged_ = 0;
    if (!writing_) out_.clear();  // a write in flight keeps its buffer until its handler runs
    idle_.cancel();
    delay_.cancel();
    heartbeat_.cancel();
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  TcpKvTransport::Impl& impl_;
  tcp::socket socket_;
  asio::steady_timer idle_, delay_, heartbeat_;
  std::chrono::milliseconds receiver_timeout_{std::chrono::milliseconds::max()};
  FrameHeader header_;
  std::string payload_;
  std::deque<std::string> out_;
  Clock::time_point start_;
  TransferStats stats_;
  int64_t staged_ = 0;
  bool writing_ = false, finished_ = false, done_queued_ = false, done_written_ = false, acked_ = false;
  bool failing_ = false, counted_ = false;
  std::atomic<bool> closed_{false};
};

// Host staging of one transfer's rows, released (and uncounted) when the last holder lets go.
struct Staging {
  Staging(TransferMetrics& metrics, int32_t layers, int64_t layer_bytes) : metrics(metrics), k(layers), v(layers) {
    for (auto& layer : k) layer.resize(static_cast<size_t>(layer_bytes));
    for (auto& layer : v) layer.resize(static_cast<size_t>(layer_bytes));
    bytes = 2 * layers * layer_bytes;
    metrics.add_staged(bytes);
  }
  ~Staging() { metrics.add_staged(-bytes); }
  TransferMetrics& metrics;
  std::vector<std::vector<char>> k, v;  // [layers][num_tokens * row_bytes]
  int64_t bytes = 0;
};

// The token side of one transfer: connects, sends the request, checks and stages every frame.
class FetchConnection : public std::enable_shared_from_this<FetchConnection> {
 public:
  FetchConnection(TcpKvTransport::Impl& impl, std::string address, TransferRequest request, const KvCache& cache,
                  KvTarget target, FetchCallbacks callbacks)
      : impl_(impl), address_(std::move(address)), request_(std::move(request)), cache_(cache),
        target_(std::move(target)), callbacks_(std::move(callbacks)), resolver_(impl.io), socket_(impl.io),
        idle_(impl.io) {}

  void start() {
    start_ = last_rows_ = Clock::now();
    const size_t colon = address_.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == address_.size()) {
      return fail(fmt::format("'{}' is not a KV address (host:port)", address_), false);
    }
    num_tokens_ = static_cast<int32_t>(request_.token_ids.size());
    row_bytes_ = cache_.layout.row_bytes();
    try {
      receiver_.emplace(cache_.layout.num_layers, num_tokens_, row_bytes_);
    } catch (const std::exception& e) {
      return fail(e.what(), false);
    }
    staging_ = std::make_shared<Staging>(impl_.metrics, cache_.layout.num_layers, num_tokens_ * row_bytes_);
    arm_idle();
    resolver_.async_resolve(address_.substr(0, colon), address_.substr(colon + 1),
                            [self = shared_from_this()](boost::system::error_code ec, tcp::resolver::results_type results) {
                              if (ec) return self->fail(fmt::format("resolving {}: {}", self->address_, ec.message()), false);
                              asio::async_connect(self->socket_, results, [self](boost::system::error_code ec, const tcp::endpoint&) {
                                self->on_connect(ec);
                              });
                            });
  }

  void cancel() {
    asio::post(impl_.io, [self = shared_from_this()] {
      if (self->completed_) return;
      self->completed_ = true;
      self->shut();
    });
  }

 private:
  void on_connect(boost::system::error_code ec) {
    if (completed_) return;
    if (ec) return fail(fmt::format("connecting to the prompt instance at {}: {}", address_, ec.message()), false);
    arm_idle();
    out_ = frame(kRequest, request_payload(request_, impl_.config.idle_timeout));
    asio::async_write(socket_, asio::buffer(out_), [self = shared_from_this()](boost::system::error_code ec, size_t) {
      if (self->completed_) return;
      if (ec) return self->fail(fmt::format("sending the transfer request to {}: {}", self->address_, ec.message()), false);
      self->read_header();
    });
  }

  void read_header() {
    asio::async_read(socket_, asio::buffer(&header_, sizeof header_), [self = shared_from_this()](boost::system::error_code ec, size_t) {
      self->on_header(ec);
    });
  }

  void on_header(boost::system::error_code ec) {
    if (completed_) return;
    if (ec) return fail(lost(ec), false);
    arm_idle();
    RowsReceiver::Next next;
    try {
      next = receiver_->on_header(header_);
    } catch (const std::exception& e) {
      return fail(fmt::format("{} from {}", e.what(), address_), false);
    }
    if (next == RowsReceiver::Next::Wait) {
      // Alive, but a sender that never gets to the rows (a wedged engine) is not waited on forever.
      if (Clock::now() - last_rows_ > kMaxWaitTimeouts * impl_.config.idle_timeout) {
        return fail(fmt::format("the prompt instance at {} sent no rows for {} ms", address_,
                                kMaxWaitTimeouts * impl_.config.idle_timeout.count()),
                    true);
      }
      return read_header();
    }
    payload_.resize(header_.length);
    asio::async_read(socket_, asio::buffer(payload_), [self = shared_from_this()](boost::system::error_code ec, size_t) {
      self->on_payload(ec);
    });
  }

  void on_payload(boost::system::error_code ec) {
    if (completed_) return;
    if (ec) return fail(lost(ec), false);
    arm_idle();
    if (header_.type == kRows) {
      try {
        received_bytes_ += receiver_->on_rows(payload_, staging_->k, staging_->v);
      } catch (const std::exception& e) {
        return fail(fmt::format("{} from {}", e.what(), address_), false);
      }
      last_rows_ = Clock::now();
      return read_header();
    }
    if (header_.type == kError) {
      return fail(fmt::format("the prompt instance at {} failed the transfer: {}", address_,
                              RowsReceiver::error_message(payload_)),
                  false);
    }
    // Done.
    TransferStats stats;
    try {
      stats = receiver_->on_done(payload_);
    } catch (const std::exception& e) {
      return fail(fmt::format("the prompt instance at {}: {}", address_, e.what()), false);
    }
    completed_ = true;
    idle_.cancel();
    out_ = frame(kAck, "");
    asio::async_write(socket_, asio::buffer(out_), [self = shared_from_this()](boost::system::error_code, size_t) { self->shut(); });
    const double fetch_ms = ms_since(start_);
    impl_.metrics.received(stats, fetch_ms, received_bytes_);
    KvCache cache = cache_;
    KvTarget target = std::move(target_);
    auto write = [cache, target = std::move(target), staging = std::move(staging_), n = num_tokens_,
                  row = row_bytes_]() {
      const int32_t from = std::min(target.num_cached_tokens, n);
      if (from == n) return;
      for (int32_t layer = 0; layer < cache.layout.num_layers; ++layer) {
        const size_t at = static_cast<size_t>(from) * static_cast<size_t>(row);
        write_rows(cache, layer, from, n - from, target.block_table, staging->k[static_cast<size_t>(layer)].data() + at,
                   staging->v[static_cast<size_t>(layer)].data() + at);
      }
    };
    spdlog::debug("kv transfer {}: {} bytes from {} in {:.2f} ms", request_.transfer_id, received_bytes_, address_, fetch_ms);
    callbacks_.done(std::move(write), stats);
  }

  std::string lost(boost::system::error_code ec) const {
    return fmt::format("the prompt instance at {} closed the connection mid-transfer ({}; {} of {} bytes received)",
                       address_, ec.message(), received_bytes_,
                       2 * static_cast<int64_t>(num_tokens_) * row_bytes_ * cache_.layout.num_layers);
  }

  void arm_idle() {
    idle_.expires_after(impl_.config.idle_timeout);
    idle_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec || self->completed_) return;
      self->fail(fmt::format("the KV transfer from {} stalled: no progress for {} ms ({} bytes received)",
                             self->address_, self->impl_.config.idle_timeout.count(), self->received_bytes_),
                 true);
    });
  }

  void fail(const std::string& message, bool timed_out) {
    if (completed_) return;
    completed_ = true;
    spdlog::warn("kv transfer {} (token side): {}", request_.transfer_id, message);
    impl_.metrics.receive_failed(timed_out);
    shut();
    staging_.reset();
    callbacks_.failed(message);
  }

  void shut() {
    idle_.cancel();
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    resolver_.cancel();
  }

  TcpKvTransport::Impl& impl_;
  std::string address_;
  TransferRequest request_;
  KvCache cache_;
  KvTarget target_;
  FetchCallbacks callbacks_;
  tcp::resolver resolver_;
  tcp::socket socket_;
  asio::steady_timer idle_;
  FrameHeader header_;
  std::string payload_, out_;
  std::shared_ptr<Staging> staging_;
  std::optional<RowsReceiver> receiver_;  // checks every frame against the request
  int32_t num_tokens_ = 0;
  int64_t row_bytes_ = 0, received_bytes_ = 0;
  Clock::time_point start_, last_rows_;
  bool completed_ = false;
};

}  // namespace

void TcpKvTransport::Impl::accept() {
  acceptor->async_accept([self = shared_from_this()](boost::system::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !self->acceptor->is_open()) return;
    if (!ec) std::make_shared<ServerConnection>(*self, std::move(socket))->start();
    self->accept();
  });
}

TcpKvTransport::TcpKvTransport(TcpKvConfig config, TransferMetrics& metrics, TransferHandler handler)
    : impl_(std::make_shared<Impl>(std::move(config), metrics, std::move(handler))) {
  SF_CHECK(impl_->config.idle_timeout.count() > 0, "the KV transfer timeout must be positive");
}

TcpKvTransport::~TcpKvTransport() { stop(); }

int TcpKvTransport::start() {
  Impl& impl = *impl_;
  SF_CHECK(!impl.thread.joinable(), "kv transport: start() called twice");
  if (impl.config.port >= 0) {
    boost::system::error_code ec;
    const asio::ip::address host = asio::ip::make_address(impl.config.host, ec);
    SF_CHECK(!ec, "--kv-host '{}' is not an IP address: {}", impl.config.host, ec.message());
    tcp::endpoint endpoint(host, static_cast<unsigned short>(impl.config.port));
    impl.acceptor.emplace(impl.io);
    impl.acceptor->open(endpoint.protocol(), ec);
    if (!ec) impl.acceptor->set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) impl.acceptor->bind(endpoint, ec);
    if (!ec) impl.acceptor->listen(asio::socket_base::max_listen_connections, ec);
    SF_CHECK(!ec, "cannot listen for KV transfers on {}:{}: {}", impl.config.host, impl.config.port, ec.message());
    impl.port = impl.acceptor->local_endpoint().port();
    impl.accept();
  }
  impl.thread = std::thread([impl = impl_] { impl->io.run(); });
  return impl.port;
}

void TcpKvTransport::stop() {
  Impl& impl = *impl_;
  if (!impl.thread.joinable()) return;
  impl.guard.reset();
  impl.io.stop();
  impl.thread.join();
  boost::system::error_code ignored;
  if (impl.acceptor) impl.acceptor->close(ignored);
}

std::function<void()> TcpKvTransport::fetch(const std::string& address, TransferRequest request, const KvCache& cache,
                                             KvTarget target, FetchCallbacks callbacks) {
  SF_CHECK(request.layout == cache.layout, "kv transport: the request's layout is not the cache's");
  auto connection = std::make_shared<FetchConnection>(*impl_, address, std::move(request), cache, std::move(target),
                                                      std::move(callbacks));
  asio::post(impl_->io, [connection] { connection->start(); });
  return [connection] { connection->cancel(); };
}

std::string TcpKvTransport::address() const {
  if (impl_->port == 0) return "";
  return fmt::format("{}:{}", impl_->config.host, impl_->port);
}

}  // namespace splitflow::splitwise
