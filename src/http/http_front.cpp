#include "http/http_front.h"

#include "core/error.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <variant>

namespace splitflow::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

std::string_view Request::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (beast::iequals(key, beast::string_view(name.data(), name.size()))) return value;
  }
  return {};
}

namespace {

// How long a connection being closed after an error response may keep sending before it is cut
// (reading it lets the client see the response instead of a reset).
constexpr std::chrono::milliseconds kLingerTimeout{2'000};
// How long the accept loop pauses when the process is out of file descriptors.
constexpr std::chrono::milliseconds kAcceptRetry{50};
// Bytes a hang-up watch reads at a time (a pipelined next request lands in the same buffer).
constexpr size_t kWatchReadBytes = 4096;

struct Route {
  std::string method;
  std::string path;
  Handler handler;
  Dispatch dispatch;
};

bool is_disconnect(const beast::error_code& ec) {
  return ec == net::error::eof || ec == bhttp::error::end_of_stream || ec == net::error::operation_aborted ||
         ec == net::error::connection_reset || ec == net::error::broken_pipe || ec == net::error::bad_descriptor ||
         ec == net::error::not_connected || ec == bhttp::error::partial_message;
}

}  // namespace

class Connection;

struct FrontState : std::enable_shared_from_this<FrontState> {
  explicit FrontState(FrontConfig config) : config(std::move(config)) {}

  FrontConfig config;
  net::io_context io;
  tcp::acceptor acceptor{io};
  net::steady_timer accept_retry{io};
  std::unique_ptr<net::thread_pool> workers;
  std::vector<Route> routes;
  std::atomic<bool> keep_alive{true};
  std::atomic<bool> stopped{false};
  std::atomic<int64_t> open_connections{0}, open_exchanges{0}, refused_connections{0}, deadline_closes{0};
  std::atomic<size_t> body_bytes_in_flight{0};

  std::mutex connections_mutex;
  std::unordered_map<uint64_t, std::weak_ptr<Connection>> connections;
  uint64_t next_connection_id = 0;

  void accept();
  void forget(uint64_t id) {
    std::lock_guard lock(connections_mutex);
    connections.erase(id);
  }
  std::string error_body(int status, const std::string& message) const { return config.error_body(status, message); }
};

// Bytes of a request body counted against max_body_bytes_in_flight while the reservation lives
// (the connection while it reads the body, then the exchange that holds it until it is answered).
class BodyReservation {
 public:
  BodyReservation(std::shared_ptr<FrontState> front, size_t bytes) : front_(std::move(front)), bytes_(bytes) {}
  ~BodyReservation() { front_->body_bytes_in_flight -= bytes_; }
  BodyReservation(const BodyReservation&) = delete;
  BodyReservation& operator=(const BodyReservation&) = delete;

 private:
  std::shared_ptr<FrontState> front_;
  size_t bytes_;
};

// One exchange: the request and the state of its response, touched only on its connection's strand.
class ExchangeImpl final : public Exchange, public std::enable_shared_from_this<ExchangeImpl> {
 public:
  ExchangeImpl(std::shared_ptr<Connection> connection, Request request, std::unique_ptr<BodyReservation> body)
      : connection_(std::move(connection)), request_(std::move(request)), body_reservation_(std::move(body)) {}

  const Request& request() const override { return request_; }
  void respond(int status, std::string content_type, std::string body, Headers headers) override;
  void start_stream(int status, std::string content_type, Headers headers) override;
  void write(std::string bytes, std::function<void()> written) override;
  void end_stream() override;
  void on_abort(std::function<void()> callback) override;
  void post(std::function<void()> task) override;

  enum class State { kHandling, kStreaming, kEnding, kDone, kAborted };

 private:
  friend class Connection;
  std::shared_ptr<Connection> connection_;
  Request request_;
  std::unique_ptr<BodyReservation> body_reservation_;
  State state_ = State::kHandling;
  bool response_started_ = false;  // a byte of the response was queued
  std::function<void()> abort_callback_;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<FrontState> front, tcp::socket socket, uint64_t id, bool counted)
      : front_(std::move(front)), socket_(std::move(socket)), timer_(socket_.get_executor()), id_(id),
        counted_(counted) {}

  auto executor() { return socket_.get_executor(); }
  void start() { read_request(); }
  void refuse();
  void close();

 private:
  friend class ExchangeImpl;
  // What goes out, in order, one at a time.
  struct Chunk {
    std::string bytes;
  };
  struct LastChunk {};
  using Out = std::variant<std::shared_ptr<bhttp::response<bhttp::string_body>>, std::string /* raw */, Chunk, LastChunk>;
  struct Pending {
    Out out;
    std::function<void()> written;
  };

  const Limits& limits() const { return front_->config.limits; }
  void arm(Clock::time_point deadline);
  void arm_for_request() {
    if (limits().request_timeout.count() > 0) arm(request_deadline_);
    else arm(Clock::time_point::max());
  }
  void on_deadline();

  void read_request();
  void on_header(const beast::error_code& ec);
  void read_body();
  void on_body(const beast::error_code& ec);
  void on_read_error(const beast::error_code& ec);
  void dispatch();
  Headers cors_headers(const Request& request) const;
  bool answer_preflight(const std::shared_ptr<ExchangeImpl>& exchange);
  void watch();
  void reject(int status, const std::string& message, const Headers& headers = {});
  bool reserve_body();
  void linger_close();

  void send(Out out, std::function<void()> written);
  void send_next();
  void on_sent(const beast::error_code& ec, std::function<void()> written);
  void finish_exchange();
  void abort_exchange();
  std::shared_ptr<bhttp::response<bhttp::string_body>> whole_response(int status, std::string content_type,
                                                                       std::string body, const Headers& headers,
                                                                       bool keep_alive) const;

  std::shared_ptr<FrontState> front_;
  tcp::socket socket_;
  net::steady_timer timer_;
  const uint64_t id_;
  const bool counted_;  // in open_connections (a refused connection is not)
  uint64_t timer_generation_ = 0;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::unique_ptr<BodyReservation> body_reservation_;  // the body being read
  std::shared_ptr<ExchangeImpl> exchange_;
  Clock::time_point request_deadline_ = Clock::time_point::max();
  bool keep_alive_ = false;  // the current request's
  std::deque<Pending> outbox_;
  bool sending_ = false;
  bool watching_ = false;  // a read waiting for a hang-up (or the next request) is outstanding
  bool closing_ = false;   // no new request on this connection
  bool lingering_ = false;  // the response is out: discarding input until the peer closes or the deadline
  bool closed_ = false;
};

// ---- ExchangeImpl: every call hops onto the connection's strand ----

void ExchangeImpl::respond(int status, std::string content_type, std::string body, Headers headers) {
  auto self = shared_from_this();
  net::post(connection_->executor(), [self, status, content_type = std::move(content_type), body = std::move(body),
                                      headers = std::move(headers)]() mutable {
    if (self->state_ != State::kHandling) return;  // aborted, or answered already
    Connection& connection = *self->connection_;
    self->state_ = State::kEnding;
    self->response_started_ = true;
    // Answered: its body no longer counts against the bound, before a byte of the answer leaves, so
    // a client that reads it and sends again never meets its own last body.
    self->body_reservation_.reset();
    for (auto& header : connection.cors_headers(self->request_)) headers.push_back(std::move(header));
    connection.send(connection.whole_response(status, std::move(content_type), std::move(body), headers,
                                              connection.keep_alive_),
                    [self] { self->connection_->finish_exchange(); });
  });
}

void ExchangeImpl::start_stream(int status, std::string content_type, Headers headers) {
  auto self = shared_from_this();
  net::post(connection_->executor(),
            [self, status, content_type = std::move(content_type), headers = std::move(headers)]() mutable {
              if (self->state_ != State::kHandling) return;
              self->state_ = State::kStreaming;
              self->response_started_ = true;
              bhttp::response<bhttp::empty_body> head{static_cast<bhttp::status>(status), 11};
              head.set(bhttp::field::content_type, content_type);
              for (const auto& [key, value] : headers) head.set(key, value);
              for (const auto& [key, value] : self->connection_->cors_headers(self->request_)) head.set(key, value);
              head.keep_alive(self->connection_->keep_alive_);
              head.chunked(true);
              std::ostringstream text;
              text << head.base();
              self->connection_->send(text.str(), nullptr);
            });
}

void ExchangeImpl::write(std::string bytes, std::function<void()> written) {
  auto self = shared_from_this();
  net::post(connection_->executor(), [self, bytes = std::move(bytes), written = std::move(written)]() mutable {
    if (self->state_ != State::kStreaming || bytes.empty()) {
      if (self->state_ == State::kStreaming && written) written();
      return;
    }
    self->connection_->send(Connection::Chunk{std::move(bytes)}, std::move(written));
  });
}

void ExchangeImpl::end_stream() {
  auto self = shared_from_this();
  net::post(connection_->executor(), [self] {
    if (self->state_ != State::kStreaming) return;
    self->state_ = State::kEnding;
    self->body_reservation_.reset();
    self->connection_->send(Connection::LastChunk{}, [self] { self->connection_->finish_exchange(); });
  });
}

void ExchangeImpl::on_abort(std::function<void()> callback) {
  auto self = shared_from_this();
  net::post(connection_->executor(), [self, callback = std::move(callback)]() mutable {
    if (self->state_ == State::kAborted) {
      callback();
    } else if (self->state_ != State::kDone) {
      self->abort_callback_ = std::move(callback);
    }
  });
}

void ExchangeImpl::post(std::function<void()> task) { net::post(connection_->executor(), std::move(task)); }

// ---- Connection: reading requests, deadlines, the outbox ----

void Connection::arm(Clock::time_point deadline) {
  // A generation, not the timer's expiry, tells a stale wake-up from a real one: the handler of a
  // wait that fired just before re-arming may still be queued.
  const uint64_t generation = ++timer_generation_;
  if (deadline == Clock::time_point::max()) {
    timer_.cancel();
    return;
  }
  timer_.expires_at(deadline);
  timer_.async_wait([self = shared_from_this(), generation](const beast::error_code& ec) {
    if (ec || generation != self->timer_generation_ || self->closed_) return;
    self->on_deadline();
  });
}

void Connection::on_deadline() {
  ++front_->deadline_closes;
  // A request whose handler has not started a response gets a 504 (the client learns why); every
  // other deadline (headers, body, a stalled write, a stream that ran too long) just closes.
  if (exchange_ && exchange_->state_ == ExchangeImpl::State::kHandling && !exchange_->response_started_) {
    abort_exchange();
    closing_ = true;
    request_deadline_ = Clock::time_point::max();  // the 504's write gets write_timeout of its own
    send(whole_response(504, front_->config.error_content_type,
                        front_->error_body(504, "the request took longer than the server's request timeout"), {},
                        false),
         [self = shared_from_this()] { self->linger_close(); });
    return;
  }
  close();
}

void Connection::read_request() {
  if (closed_ || closing_) return;
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(std::min<size_t>(limits().max_header_bytes, UINT32_MAX)));
  parser_->body_limit(limits().max_body_bytes);
  arm(Clock::now() + limits().header_timeout);
  bhttp::async_read_header(socket_, buffer_, *parser_,
                           [self = shared_from_this()](const beast::error_code& ec, size_t) { self->on_header(ec); });
}

void Connection::on_header(const beast::error_code& ec) {
  if (closed_) return;
  if (ec) return on_read_error(ec);

  const auto& header = parser_->get();
  const size_t count = static_cast<size_t>(std::distance(header.begin(), header.end()));
  if (count > limits().max_header_count) {
    return reject(431, fmt::format("the request has {} header fields, more than {}", count, limits().max_header_count));
  }
  // RFC 9112 §6.1: a request whose transfer coding does not end in chunked has no knowable length.
  if (header.find(bhttp::field::transfer_encoding) != header.end() && !parser_->chunked()) {
    return reject(400, "Transfer-Encoding other than chunked is not accepted");
  }
  const auto encoding = header.find(bhttp::field::content_encoding);
  if (encoding != header.end() && !beast::iequals(encoding->value(), "identity")) {
    return reject(415, fmt::format("compressed request bodies are not accepted (Content-Encoding: {})",
                                   std::string(encoding->value())));
  }
  if (const auto length = parser_->content_length(); length && *length > limits().max_body_bytes) {
    return reject(413, fmt::format("the request body ({} bytes) exceeds {} bytes", *length, limits().max_body_bytes));
  }
  if (!reserve_body()) {
    return reject(503,
                  fmt::format("the server holds {} bytes of request bodies, its limit; retry in {} s",
                              limits().max_body_bytes_in_flight, front_->config.retry_after_seconds),
                  {{"Retry-After", std::to_string(front_->config.retry_after_seconds)}});
  }
  const auto expect = header.find(bhttp::field::expect);
  if (expect != header.end() && beast::iequals(expect->value(), "100-continue") && !parser_->is_done()) {
    // curl sends large bodies only after this interim response.
    auto interim = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
    net::async_write(socket_, net::buffer(*interim),
                     [self = shared_from_this(), interim](const beast::error_code& ec, size_t) {
                       if (ec) return self->close();
                       self->read_body();
                     });
    return;
  }
  read_body();
}

bool Connection::reserve_body() {
  const auto length = parser_->content_length();
  const size_t bytes = length ? static_cast<size_t>(*length) : parser_->chunked() ? limits().max_body_bytes : 0;
  if (bytes == 0) return true;
  size_t held = front_->body_bytes_in_flight.load();
  do {
    if (held + bytes > limits().max_body_bytes_in_flight) return false;
  } while (!front_->body_bytes_in_flight.compare_exchange_weak(held, held + bytes));
  body_reservation_ = std::make_unique<BodyReservation>(front_, bytes);
  return true;
}

void Connection::read_body() {
  if (closed_) return;
  arm(Clock::now() + limits().body_timeout);
  bhttp::async_read(socket_, buffer_, *parser_,
                    [self = shared_from_this()](const beast::error_code& ec, size_t) { self->on_body(ec); });
}

void Connection::on_body(const beast::error_code& ec) {
  if (closed_) return;
  if (ec) return on_read_error(ec);
  dispatch();
}

void Connection::on_read_error(const beast::error_code& ec) {
  // The parser checks a Content-Length against the body limit as soon as the header is in, and a
  // chunked body chunk by chunk as it is decoded.
  if (ec == bhttp::error::body_limit) {
    return reject(413, fmt::format("the request body exceeds {} bytes", limits().max_body_bytes));
  }
  if (ec == bhttp::error::header_limit) {
    return reject(431, fmt::format("the request's header block exceeds {} bytes", limits().max_header_bytes));
  }
  if (is_disconnect(ec)) return close();
  reject(400, fmt::format("malformed HTTP request: {}", ec.message()));
}

void Connection::dispatch() {
  bhttp::request<bhttp::string_body> message = parser_->release();
  parser_.reset();
  keep_alive_ = message.keep_alive() && front_->keep_alive && !front_->stopped;
  Request request;
  request.method = std::string(message.method_string());
  request.target = std::string(message.target());
  request.path = request.target.substr(0, request.target.find('?'));
  for (const auto& field : message) request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  request.body = std::move(message.body());

  const Route* route = nullptr;
  bool path_known = false;
  for (const Route& candidate : front_->routes) {
    if (candidate.path != request.path) continue;
    path_known = true;
    if (candidate.method == request.method) route = &candidate;
  }
  exchange_ = std::make_shared<ExchangeImpl>(shared_from_this(), std::move(request), std::move(body_reservation_));
  ++front_->open_exchanges;
  request_deadline_ = limits().request_timeout.count() > 0 ? Clock::now() + limits().request_timeout
                                                            : Clock::time_point::max();
  arm_for_request();
  watch();
  const std::shared_ptr<ExchangeImpl> exchange = exchange_;
  if (path_known && answer_preflight(exchange)) return;
  if (!route) {
    const Request& r = exchange->request();
    const int status = path_known ? 405 : 404;
    const std::string message_text = path_known ? fmt::format("method {} is not allowed on {}", r.method, r.path)
                                                : fmt::format("no route for {} {}", r.method, r.path);
    exchange->respond(status, front_->config.error_content_type, front_->error_body(status, message_text), {});
    return;
  }
  const auto run = [exchange, handler = route->handler, front = front_] {
    try {
      handler(exchange);
    } catch (const std::exception& e) {
      exchange->respond(500, front->config.error_content_type, front->error_body(500, e.what()), {});
    }
  };
  if (route->dispatch == Dispatch::kInline) {
    run();
  } else {
    net::post(*front_->workers, run);
  }
}

Headers Connection::cors_headers(const Request& request) const {
  const std::string_view origin = request.header("Origin");
  const auto& allowed = front_->config.allowed_origins;
  if (origin.empty() || allowed.empty()) return {};
  const bool any = std::find(allowed.begin(), allowed.end(), "*") != allowed.end();
  if (!any && std::find(allowed.begin(), allowed.end(), origin) == allowed.end()) return {};
  // "*" stays "*" (credentials are headers, not cookies, here); a listed origin is echoed, and
  // caches told the answer depends on it.
  if (any) return {{"Access-Control-Allow-Origin", "*"}};
  return {{"Access-Control-Allow-Origin", std::string(origin)}, {"Vary", "Origin"}};
}

// A CORS preflight (OPTIONS with Access-Control-Request-Method) on a known path: 204 with what the
// browser may send, or 403 for an origin that is not allowed.
bool Connection::answer_preflight(const std::shared_ptr<ExchangeImpl>& exchange) {
  const Request& request = exchange->request();
  if (request.method != "OPTIONS" || request.header("Access-Control-Request-Method").empty()) return false;
  Headers headers = cors_headers(request);
  if (headers.empty()) {
    exchange->respond(403, front_->config.error_content_type,
                      front_->error_body(403, fmt::format("origin '{}' is not allowed (--allowed-origins)",
                                                          std::string(request.header("Origin")))),
                      {});
    return true;
  }
  std::string methods;
  for (const Route& route : front_->routes) {
    if (route.path == request.path) methods += route.method + ", ";
  }
  const std::string_view requested = request.header("Access-Control-Request-Headers");
  headers.emplace_back("Access-Control-Allow-Methods", methods + "OPTIONS");
  headers.emplace_back("Access-Control-Allow-Headers",
                       requested.empty() ? std::string("Authorization, Content-Type") : std::string(requested));
  headers.emplace_back("Access-Control-Max-Age", "600");
  // respond() adds the origin headers again: send them once.
  headers.erase(headers.begin(), headers.begin() + static_cast<std::ptrdiff_t>(cors_headers(request).size()));
  exchange->respond(204, front_->config.error_content_type, "", std::move(headers));
  return true;
}

void Connection::watch() {
  // One read stays outstanding while a request is handled and while a closing connection lingers:
  // it ends with an error when the client hangs up. Bytes it reads are a pipelined next request
  // (kept for read_request(); watching stops, as nothing more is read before that request is
  // parsed) or, when lingering, discarded.
  if (watching_ || closed_) return;
  if (lingering_) buffer_.consume(buffer_.size());
  else if (buffer_.size() > 0) return;  // a pipelined request is already buffered: it is read next
  watching_ = true;
  socket_.async_read_some(buffer_.prepare(kWatchReadBytes),
                          [self = shared_from_this()](const beast::error_code& ec, size_t bytes) {
                            self->watching_ = false;
                            if (self->closed_) return;
                            if (ec) return self->close();
                            self->buffer_.commit(bytes);
                            if (self->lingering_) return self->watch();
                            if (!self->exchange_) self->read_request();  // these bytes begin the next request
                          });
}

void Connection::reject(int status, const std::string& message, const Headers& headers) {
  // The request's framing can't be trusted after this: answer and close.
  closing_ = true;
  body_reservation_.reset();
  send(whole_response(status, front_->config.error_content_type, front_->error_body(status, message), headers, false),
       [self = shared_from_this()] { self->linger_close(); });
}

void Connection::refuse() {
  closing_ = true;
  auto response = whole_response(
      503, front_->config.error_content_type,
      front_->error_body(503, fmt::format("the server has {} open connections, its limit; retry in {} s",
                                          front_->config.max_connections, front_->config.retry_after_seconds)),
      {{"Retry-After", std::to_string(front_->config.retry_after_seconds)}}, false);
  send(std::move(response), [self = shared_from_this()] { self->linger_close(); });
  arm(Clock::now() + kLingerTimeout);
}

void Connection::linger_close() {
  // Half-close and read what the client still sends, so that it sees the response rather than a
  // reset; the deadline is set once, so a client that keeps sending is cut at it.
  if (closed_ || lingering_) return;
  lingering_ = closing_ = true;
  beast::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  arm(Clock::now() + kLingerTimeout);
  watch();
}

void Connection::close() {
  if (closed_) return;
  closed_ = true;
  ++timer_generation_;
  timer_.cancel();
  beast::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  abort_exchange();
  outbox_.clear();
  body_reservation_.reset();
  front_->forget(id_);
  if (counted_) --front_->open_connections;
}

void Connection::abort_exchange() {
  if (!exchange_) return;
  const std::shared_ptr<ExchangeImpl> exchange = std::move(exchange_);
  exchange_.reset();
  if (exchange->state_ == ExchangeImpl::State::kDone || exchange->state_ == ExchangeImpl::State::kAborted) return;
  exchange->state_ = ExchangeImpl::State::kAborted;
  --front_->open_exchanges;
  if (auto callback = std::move(exchange->abort_callback_)) callback();
  exchange->abort_callback_ = nullptr;
}

void Connection::finish_exchange() {
  if (!exchange_) return;
  exchange_->state_ = ExchangeImpl::State::kDone;
  exchange_->abort_callback_ = nullptr;
  exchange_.reset();
  --front_->open_exchanges;
  if (!keep_alive_ || front_->stopped) return linger_close();
  // Waiting for the next request: the header deadline runs from now. A watch read still
  // outstanding receives its first bytes and starts read_request() itself.
  if (watching_) {
    arm(Clock::now() + limits().header_timeout);
  } else {
    read_request();
  }
}

std::shared_ptr<bhttp::response<bhttp::string_body>> Connection::whole_response(int status, std::string content_type,
                                                                                std::string body,
                                                                                const Headers& headers,
                                                                                bool keep_alive) const {
  auto response = std::make_shared<bhttp::response<bhttp::string_body>>(static_cast<bhttp::status>(status), 11);
  response->set(bhttp::field::content_type, content_type);
  for (const auto& [key, value] : headers) response->set(key, value);
  response->keep_alive(keep_alive);
  response->body() = std::move(body);
  response->prepare_payload();
  return response;
}

void Connection::send(Out out, std::function<void()> written) {
  if (closed_) return;
  outbox_.push_back({std::move(out), std::move(written)});
  if (!sending_) send_next();
}

void Connection::send_next() {
  if (outbox_.empty() || closed_) return;
  sending_ = true;
  // A write the client does not take within write_timeout closes the connection.
  arm(std::min(request_deadline_, Clock::now() + limits().write_timeout));
  // The write's bytes live in its completion handler: a close() while it is out must not free them.
  auto current = std::make_shared<Pending>(std::move(outbox_.front()));
  outbox_.pop_front();
  auto done = [self = shared_from_this(), current](const beast::error_code& ec, size_t) {
    self->on_sent(ec, std::move(current->written));
  };
  std::visit(
      [&](auto& out) {
        using T = std::decay_t<decltype(out)>;
        if constexpr (std::is_same_v<T, std::shared_ptr<bhttp::response<bhttp::string_body>>>) {
          bhttp::async_write(socket_, *out, std::move(done));
        } else if constexpr (std::is_same_v<T, std::string>) {
          net::async_write(socket_, net::buffer(out), std::move(done));
        } else if constexpr (std::is_same_v<T, Chunk>) {
          net::async_write(socket_, bhttp::make_chunk(net::buffer(out.bytes)), std::move(done));
        } else {
          net::async_write(socket_, bhttp::make_chunk_last(), std::move(done));
        }
      },
      current->out);
}

void Connection::on_sent(const beast::error_code& ec, std::function<void()> written) {
  sending_ = false;
  if (closed_) return;
  if (ec) return close();
  if (exchange_ && exchange_->state_ != ExchangeImpl::State::kDone) arm_for_request();
  if (written) written();
  if (!sending_) send_next();
}

// ---- Front ----

void FrontState::accept() {
  acceptor.async_accept(net::make_strand(io), [self = shared_from_this()](const beast::error_code& ec,
                                                                         tcp::socket socket) {
    if (self->stopped || ec == net::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors (or another transient failure): pause instead of spinning; the
      // connections waiting in the backlog are taken once some close.
      SPDLOG_WARN("http: accept failed: {}", ec.message());
      self->accept_retry.expires_after(kAcceptRetry);
      self->accept_retry.async_wait([self](const beast::error_code& wait_ec) {
        if (!wait_ec && !self->stopped) self->accept();
      });
      return;
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    // Refused connections (answered 503 and closed) do not count against the cap.
    const bool refuse = self->open_connections >= self->config.max_connections;
    if (!refuse) ++self->open_connections;
    std::shared_ptr<Connection> connection;
    {
      std::lock_guard lock(self->connections_mutex);
      const uint64_t id = self->next_connection_id++;
      connection = std::make_shared<Connection>(self, std::move(socket), id, /*counted=*/!refuse);
      self->connections.emplace(id, connection);
    }
    if (refuse) ++self->refused_connections;
    net::post(connection->executor(), [connection, refuse] { refuse ? connection->refuse() : connection->start(); });
    self->accept();
  });
}

Front::Front(FrontConfig config) : impl_(std::make_shared<FrontState>(std::move(config))) {
  const FrontConfig& c = impl_->config;
  SF_CHECK(c.io_threads > 0 && c.worker_threads > 0, "http: io_threads ({}) and worker_threads ({}) must be positive",
           c.io_threads, c.worker_threads);
  SF_CHECK(c.backlog > 0 && c.max_connections > 0, "http: backlog ({}) and max_connections ({}) must be positive",
           c.backlog, c.max_connections);
  SF_CHECK(c.limits.max_header_bytes > 0 && c.limits.max_header_count > 0,
           "http: the header limits must be positive");
  SF_CHECK(c.limits.header_timeout.count() > 0 && c.limits.body_timeout.count() > 0 && c.limits.write_timeout.count() > 0,
           "http: the header, body and write timeouts must be positive");
  impl_->workers = std::make_unique<net::thread_pool>(static_cast<size_t>(c.worker_threads));
}

Front::~Front() {
  stop();
  impl_->workers->join();
  // Handlers posted after the I/O threads ended hold their connections, which hold this Impl: run
  // them (against closed sockets, they do nothing) so the cycle ends.
  impl_->io.restart();
  impl_->io.poll();
}

void Front::route(std::string method, std::string path, Handler handler, Dispatch dispatch) {
  impl_->routes.push_back({std::move(method), std::move(path), std::move(handler), dispatch});
}

int Front::bind() {
  FrontState& impl = *impl_;
  // Every connection is a descriptor: take all the process may have.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(impl.config.host, ec);
  SF_CHECK(!ec, "cannot listen on '{}': not an IP address ({})", impl.config.host, ec.message());
  SF_CHECK(impl.config.port >= 0 && impl.config.port <= 65535, "cannot listen on port {}", impl.config.port);
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(impl.config.port));
  impl.acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl.acceptor.bind(endpoint, ec);
  if (!ec) impl.acceptor.listen(impl.config.backlog, ec);
  SF_CHECK(!ec, "cannot listen on {}:{}: {}", impl.config.host, impl.config.port, ec.message());
  return impl.acceptor.local_endpoint().port();
}

void Front::serve() {
  FrontState& impl = *impl_;
  if (impl.stopped) return;
  SF_CHECK(impl.acceptor.is_open(), "http: serve() before bind()");
  impl.accept();
  std::vector<std::thread> threads;
  for (int i = 1; i < impl.config.io_threads; ++i) threads.emplace_back([&impl] { impl.io.run(); });
  impl.io.run();
  for (std::thread& thread : threads) thread.join();
}

void Front::stop_keep_alive() { impl_->keep_alive = false; }

void Front::stop() {
  if (impl_->stopped.exchange(true)) return;
  // Closing the listener and every socket leaves the I/O threads without work, so serve() returns.
  net::post(impl_->io, [impl = impl_] {
    beast::error_code ignored;
    impl->acceptor.close(ignored);
    impl->accept_retry.cancel();
    std::vector<std::shared_ptr<Connection>> open;
    {
      std::lock_guard lock(impl->connections_mutex);
      for (auto& [id, weak] : impl->connections) {
        if (auto connection = weak.lock()) open.push_back(std::move(connection));
      }
    }
    for (auto& connection : open) net::post(connection->executor(), [connection] { connection->close(); });
  });
}

FrontStats Front::stats() const {
  return {impl_->open_connections.load(), impl_->open_exchanges.load(), impl_->refused_connections.load(),
          impl_->deadline_closes.load(), static_cast<int64_t>(impl_->body_bytes_in_flight.load())};
}

}  // namespace splitflow::http
