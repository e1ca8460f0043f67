// The event-driven HTTP front (http/http_front.h) over raw sockets, with no engine behind it:
// header and body limits (after de-chunking), refused framings, deadlines, the connection cap,
// hang-ups seen at once, keep-alive and pipelining, 100-continue, streaming, and a quick route
// that stays quick while hundreds of slow sockets are open.
#include "http/http_front.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>

namespace splitflow::http {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A blocking client socket with a receive timeout.
class Socket {
 public:
  // receive_buffer > 0: a small receive window, set before connecting (a client that reads slowly).
  explicit Socket(int port, int receive_buffer = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (receive_buffer > 0) setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    timeval timeout{5, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~Socket() { close(); }
  Socket(const Socket&) = delete;
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)), connected_(other.connected_) {}

  bool connected() const { return connected_; }
  // False when the peer reset or closed the connection.
  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t sent = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (sent <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(sent));
    }
    return true;
  }
  // Everything until the peer closes (or the receive timeout).
  std::string read_all() {
    std::string out;
    char buffer[65536];
    while (true) {
      const ssize_t got = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (got <= 0) break;
      out.append(buffer, static_cast<size_t>(got));
    }
    return out;
  }
  // One response with a Content-Length body (keep-alive).
  std::string read_response() {
    while (true) {
      const size_t end = pending_.find("\r\n\r\n");
      if (end != std::string::npos) {
        const size_t length_at = pending_.find("Content-Length: ");
        const size_t length = length_at < end ? std::stoul(pending_.substr(length_at + 16)) : 0;
        if (pending_.size() >= end + 4 + length) {
          std::string response = pending_.substr(0, end + 4 + length);
          pending_.erase(0, end + 4 + length);
          return response;
        }
      }
      char buffer[65536];
      const ssize_t got = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (got <= 0) return std::exchange(pending_, "");
      pending_.append(buffer, static_cast<size_t>(got));
    }
  }
  // Whether the server closed the connection within `timeout` (EOF or reset seen).
  bool closed_within(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 10) > 0) {
        char byte;
        const ssize_t got = ::recv(fd_, &byte, 1, MSG_DONTWAIT);
        if (got == 0 || (got < 0 && errno != EAGAIN)) return true;
      }
    }
    return false;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string pending_;
};

int status_of(const std::string& response) {
  return response.starts_with("HTTP/1.1 ") ? std::stoi(response.substr(9, 3)) : 0;
}

std::string post(const std::string& path, const std::string& body, const std::string& extra_headers = "") {
  return fmt::format("POST {} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n{}\r\n{}", path, body.size(), extra_headers,
                     body);
}

// A Front on a free port with an echo route, a stream route, a route that never answers, and a
// quick inline route; serve() runs on a thread of its own.
class TestFront {
 public:
  explicit TestFront(FrontConfig config = small_config()) : front_(std::move(config)) {
    front_.route("POST", "/echo",
                 [](const std::shared_ptr<Exchange>& exchange) {
                   exchange->respond(200, "text/plain", exchange->request().body);
                 },
                 Dispatch::kWorker);
    front_.route("GET", "/quick",
                 [](const std::shared_ptr<Exchange>& exchange) { exchange->respond(200, "text/plain", "ok"); },
                 Dispatch::kInline);
    front_.route("GET", "/never",
                 [this](const std::shared_ptr<Exchange>& exchange) {
                   exchange->on_abort([this] { ++aborts; });
                   std::lock_guard lock(mutex_);
                   held_.push_back(exchange);  // answered by nobody
                 },
                 Dispatch::kWorker);
    // 64 (or, with ?big, 4096) chunks of 64 KiB, each written after the previous one was taken.
    front_.route("GET", "/stream",
                 [this](const std::shared_ptr<Exchange>& exchange) {
                   exchange->on_abort([this] { ++aborts; });
                   exchange->start_stream(200, "text/plain");
                   write_chunks(exchange, exchange->request().target.ends_with("?big") ? 4096 : 64);
                 },
                 Dispatch::kWorker);
    port_ = front_.bind();
    thread_ = std::thread([this] { front_.serve(); });
  }
  ~TestFront() {
    front_.stop();
    thread_.join();
  }

  static FrontConfig small_config() {
    FrontConfig config;
    config.limits.max_header_bytes = 4096;
    config.limits.max_header_count = 16;
    config.limits.max_body_bytes = 1 << 16;
    config.limits.header_timeout = 400ms;
    config.limits.body_timeout = 400ms;
    config.limits.write_timeout = 400ms;
    config.limits.request_timeout = 2000ms;
    config.error_body = [](int status, const std::string& message) { return fmt::format("{}: {}", status, message); };
    return config;
  }

  int port() const { return port_; }
  Front& front() { return front_; }
  std::atomic<int> aborts{0};
  std::atomic<int> chunks_written{0};

 private:
  void write_chunks(const std::shared_ptr<Exchange>& exchange, int left) {
    if (left == 0) return exchange->end_stream();
    exchange->write(std::string(size_t{64} << 10, 'x'), [this, exchange, left] {
      ++chunks_written;
      write_chunks(exchange, left - 1);
    });
  }

  Front front_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<Exchange>> held_;
};

TEST(HttpFront, RoutesKeepAliveAndPipelining) {
  TestFront server;
  Socket socket(server.port());
  ASSERT_TRUE(socket.connected());
  ASSERT_TRUE(socket.send(post("/echo", "one")));
  std::string response = socket.read_response();
  EXPECT_EQ(status_of(response), 200) << response;
  EXPECT_TRUE(response.ends_with("\r\n\r\none"));
  // Three requests in one write, the last one without a body: three answers, in order.
  ASSERT_TRUE(socket.send(post("/echo", "two") + post("/echo", "three") + "GET /quick HTTP/1.1\r\nHost: t\r\n\r\n"));
  EXPECT_TRUE(socket.read_response().ends_with("two"));
  EXPECT_TRUE(socket.read_response().ends_with("three"));
  EXPECT_TRUE(socket.read_response().ends_with("ok"));
  // A chunked body arrives de-chunked.
  ASSERT_TRUE(socket.send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"));
  EXPECT_TRUE(socket.read_response().ends_with("\r\n\r\nabcde"));
  ASSERT_TRUE(socket.send("GET /nowhere HTTP/1.1\r\nHost: t\r\n\r\n"));
  response = socket.read_response();
  EXPECT_EQ(status_of(response), 404) << response;
  EXPECT_NE(response.find("404: no route for GET /nowhere"), std::string::npos) << response;
  ASSERT_TRUE(socket.send("GET /echo HTTP/1.1\r\nHost: t\r\n\r\n"));
  EXPECT_EQ(status_of(socket.read_response()), 405);
  // curl's 100-continue: the interim response, then the body is read.
  ASSERT_TRUE(socket.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"));
  EXPECT_EQ(socket.read_response(), "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(socket.send("body"));
  EXPECT_TRUE(socket.read_response().ends_with("body"));
}

TEST(HttpFront, LimitsAndBadFramingAreRefusedWithTheirStatus) {
  TestFront server;
  struct Case {
    std::string name;
    std::string request;
    int status;
    std::string message;
  };
  const std::string big_body(70000, 'b');
  std::string chunked_over_limit = "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 40; ++i) chunked_over_limit += fmt::format("800\r\n{}\r\n", std::string(2048, 'c'));  // 80 KiB
  chunked_over_limit += "0\r\n\r\n";
  std::string many_headers = "GET /quick HTTP/1.1\r\nHost: t\r\n";
  for (int i = 0; i < 20; ++i) many_headers += fmt::format("X-{}: v\r\n", i);
  const std::vector<Case> cases = {
      {"header bytes", "GET /quick HTTP/1.1\r\nHost: t\r\nX: " + std::string(5000, 'h') + "\r\n\r\n", 431,
       "exceeds 4096 bytes"},
      {"header count", many_headers + "\r\n", 431, "21 header fields, more than 16"},
      {"declared body", post("/echo", big_body), 413, "exceeds 65536 bytes"},
      {"chunked body", chunked_over_limit, 413, "exceeds 65536 bytes"},
      {"gzip", post("/echo", "xx", "Content-Encoding: gzip\r\n"), 415, "Content-Encoding: gzip"},
      {"conflicting lengths", "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400,
       "Content-Length"},
      {"length and chunked", "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
       400, "Transfer-Encoding"},
      {"other coding", "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\nabc", 400,
       "other than chunked"},
      {"bad chunk", "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", 400,
       "malformed"},
      {"not HTTP", "HELLO\r\n\r\n", 400, "malformed"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Socket socket(server.port());
    socket.send(c.request);
    const std::string response = socket.read_all();  // the server closes after an error
    EXPECT_EQ(status_of(response), c.status) << response.substr(0, 300);
    EXPECT_NE(response.find(c.message), std::string::npos) << response.substr(0, 300);
    EXPECT_NE(response.find("Connection: close"), std::string::npos);
  }
  EXPECT_EQ(server.front().stats().open_exchanges, 0);
}

TEST(HttpFront, BodiesInFlightTogetherAreBounded) {
  FrontConfig config = TestFront::small_config();
  config.limits.max_body_bytes_in_flight = 100'000;  // one 60 KB body fits, two do not
  config.limits.body_timeout = 5s;
  TestFront server(std::move(config));
  const std::string body(60'000, 'b');
  Socket first(server.port());
  first.send(fmt::format("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n", body.size()) +
             body.substr(0, 100));  // its body is still coming
  const auto deadline = Clock::now() + 1s;
  while (server.front().stats().body_bytes_in_flight == 0 && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(server.front().stats().body_bytes_in_flight, 60'000);
  Socket second(server.port());
  second.send(post("/echo", body));
  const std::string refused = second.read_all();
  EXPECT_EQ(status_of(refused), 503) << refused.substr(0, 300);
  EXPECT_NE(refused.find("Retry-After: 1"), std::string::npos);
  EXPECT_NE(refused.find("holds 100000 bytes of request bodies"), std::string::npos);
  first.send(body.substr(100));
  EXPECT_TRUE(first.read_response().ends_with(body));
  Socket third(server.port());
  third.send(post("/echo", body));
  EXPECT_TRUE(third.read_response().ends_with(body));
  third.close();
  first.close();
  const auto released = Clock::now() + 1s;
  while (server.front().stats().body_bytes_in_flight != 0 && Clock::now() < released) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(server.front().stats().body_bytes_in_flight, 0);
}

TEST(HttpFront, SlowHeadersAndBodiesAreClosedAtTheirDeadline) {
  TestFront server;  // header and body deadlines: 400 ms
  Socket slow_header(server.port()), slow_body(server.port()), idle(server.port());
  const auto start = Clock::now();
  slow_header.send("GET /quick HTTP/1.1\r\n");
  slow_body.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nab");
  bool header_closed = false, body_closed = false;
  // A byte every 100 ms keeps neither alive: the deadline covers the whole header block or body.
  for (int i = 0; i < 12 && !(header_closed && body_closed); ++i) {
    if (!header_closed) header_closed = !slow_header.send("X") || slow_header.closed_within(100ms);
    if (!body_closed) body_closed = !slow_body.send("c") || slow_body.closed_within(1ms);
  }
  EXPECT_TRUE(header_closed);
  EXPECT_TRUE(body_closed);
  EXPECT_TRUE(idle.closed_within(1000ms));  // a connection that never sends a request
  EXPECT_LT(Clock::now() - start, 1500ms);
  EXPECT_GE(server.front().stats().deadline_closes, 3);
}

TEST(HttpFront, HangUpAbortsTheExchangeAtOnce) {
  TestFront server;
  {
    Socket socket(server.port());
    socket.send("GET /never HTTP/1.1\r\nHost: t\r\n\r\n");
    const auto deadline = Clock::now() + 1s;
    while (server.front().stats().open_exchanges == 0 && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
  }  // closed
  const auto deadline = Clock::now() + 1s;
  while (server.aborts == 0 && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(server.aborts, 1);
  EXPECT_EQ(server.front().stats().open_exchanges, 0);
}

TEST(HttpFront, RequestTimeoutAnswers504) {
  FrontConfig config = TestFront::small_config();
  config.limits.request_timeout = 300ms;
  TestFront server(std::move(config));
  Socket socket(server.port());
  const auto start = Clock::now();
  socket.send("GET /never HTTP/1.1\r\nHost: t\r\n\r\n");
  const std::string response = socket.read_all();
  EXPECT_EQ(status_of(response), 504) << response;
  EXPECT_NE(response.find("request timeout"), std::string::npos);
  EXPECT_LT(Clock::now() - start, 1500ms);
  EXPECT_EQ(server.aborts, 1);
}

TEST(HttpFront, StreamIsWrittenAsFastAsTheClientReads) {
  TestFront server;
  {
    Socket reader(server.port());
    reader.send("GET /stream HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    const std::string response = reader.read_all();
    EXPECT_EQ(status_of(response), 200);
    EXPECT_NE(response.find("Transfer-Encoding: chunked"), std::string::npos);
    EXPECT_TRUE(response.ends_with("0\r\n\r\n"));
    EXPECT_GT(response.size(), size_t{64} * (64 << 10));
  }
  EXPECT_EQ(server.chunks_written, 64);
  // A client that reads nothing: the socket buffers fill, the writer is held back (no callback),
  // and the stalled write is cut at the write deadline (400 ms), which aborts the exchange.
  server.chunks_written = 0;
  Socket stalled(server.port(), /*receive_buffer=*/4096);
  stalled.send("GET /stream?big HTTP/1.1\r\nHost: t\r\n\r\n");
  const auto deadline = Clock::now() + 3s;
  while (server.aborts == 0 && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(server.aborts, 1);
  EXPECT_LT(server.chunks_written, 4096);
}

TEST(HttpFront, ConnectionsBeyondTheCapGet503WithRetryAfter) {
  FrontConfig config = TestFront::small_config();
  config.max_connections = 4;
  config.limits.header_timeout = 5s;
  TestFront server(std::move(config));
  std::vector<Socket> held;
  for (int i = 0; i < 4; ++i) held.emplace_back(server.port());
  const auto deadline = Clock::now() + 1s;
  while (server.front().stats().open_connections < 4 && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
  Socket extra(server.port());
  extra.send("GET /quick HTTP/1.1\r\nHost: t\r\n\r\n");
  const std::string response = extra.read_all();
  EXPECT_EQ(status_of(response), 503) << response;
  EXPECT_NE(response.find("Retry-After: 1"), std::string::npos) << response;
  EXPECT_EQ(server.front().stats().refused_connections, 1);
  // Once one closes, a new connection is served.
  held.pop_back();
  std::this_thread::sleep_for(50ms);
  Socket next(server.port());
  next.send("GET /quick HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(status_of(next.read_all()), 200);
}

TEST(HttpFront, QuickRouteStaysQuickBesideHundredsOfSlowSockets) {
  FrontConfig config = TestFront::small_config();
  config.limits.header_timeout = 10s;
  TestFront server(std::move(config));
  std::vector<Socket> slow;
  for (int i = 0; i < 500; ++i) {
    slow.emplace_back(server.port());
    slow.back().send("GET /quick HTTP/1.1\r\nX-Slow: ");
  }
  std::vector<double> latencies_ms;
  for (int i = 0; i < 50; ++i) {
    const auto start = Clock::now();
    Socket probe(server.port());
    probe.send("GET /quick HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(status_of(probe.read_all()), 200);
    latencies_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    for (int j = i * 10; j < i * 10 + 10; ++j) slow[static_cast<size_t>(j)].send("a");
  }
  std::sort(latencies_ms.begin(), latencies_ms.end());
  EXPECT_LT(latencies_ms[48], 100.0) << "p98 of /quick beside 500 slow sockets";
  EXPECT_GE(server.front().stats().open_connections, 500);  // the probes' may still be closing
}

}  // namespace
}  // namespace splitflow::http
