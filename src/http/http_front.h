// http/http_front.h — an event-driven HTTP/1.1 server (Boost.Beast on Boost.Asio): a few I/O
// threads own every socket, thousands of connections cost a socket and a small buffer each, and
// nothing waits on a client. It owns the transport and its limits:
//   - a listen backlog sized for bursts, and a cap on open connections (beyond it: 503 with
//     Retry-After, written without reading the request);
//   - deadlines: the header block, the body, a response write that makes no progress, the whole
//     request; a socket past its deadline is closed (a request past its deadline gets 504 when
//     nothing of its response was sent yet);
//   - limits on header bytes and count, on body bytes counted after de-chunking, and on the bodies
//     of all requests in flight together; compressed
//     bodies (Content-Encoding) are refused with 415, malformed framing (conflicting
//     Content-Length, Content-Length with chunked) with 400, by the parser, before any body is read;
//   - a client that hangs up is seen on its socket (an outstanding read ends), and the request's
//     on_abort callback runs at once;
//   - CORS for browsers: preflights (OPTIONS) answered for the allowed origins, and the
//     Access-Control-Allow-Origin header on every response to one, streams included.
// Handlers are routes: inline ones (health, metrics) run on an I/O thread and must not block;
// worker ones (parsing, tokenizing) run on a small pool. A handler answers through its Exchange,
// from any thread, whole or as a chunked stream written only as fast as the client reads.
// It never knows what the bodies mean: error bodies come from FrontConfig::error_body.
// Boost types stay inside http_front.cpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace splitflow::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: path and query
  std::string path;    // the target without its query
  Headers headers;
  std::string body;  // de-chunked
  // The first field of that name, case-insensitively; empty when absent.
  std::string_view header(std::string_view name) const;
};

// The server's side of one request. Every method may be called from any thread; they run in order
// on the connection's I/O strand. A handler answers exactly once: respond(), or start_stream(),
// then write()s, then end_stream().
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual const Request& request() const = 0;

  virtual void respond(int status, std::string content_type, std::string body, Headers headers = {}) = 0;
  virtual void start_stream(int status, std::string content_type, Headers headers = {}) = 0;
  // Sends `bytes` as one chunk; `written` runs on the strand once the socket took all of it (not
  // when the exchange ends first). One write at a time: the writer waits for `written`, so a slow
  // reader holds back its producer instead of filling memory.
  virtual void write(std::string bytes, std::function<void()> written) = 0;
  virtual void end_stream() = 0;

  // `callback` runs once, on the strand, if the exchange ends before its response was sent whole:
  // the client hung up, a deadline passed, or the server stopped. Runs at once (on the strand)
  // when that already happened. Set it once.
  virtual void on_abort(std::function<void()> callback) = 0;
  // Runs `task` on the strand, after what was posted before it.
  virtual void post(std::function<void()> task) = 0;
};

using Handler = std::function<void(const std::shared_ptr<Exchange>&)>;

enum class Dispatch {
  kInline,  // on the I/O thread that read the request: quick and non-blocking only
  kWorker,  // on the worker pool: may parse, tokenize, take locks
};

struct Limits {
  size_t max_header_bytes = size_t{64} << 10;  // request line and header fields together
  size_t max_header_count = 128;
  size_t max_body_bytes = size_t{32} << 20;  // after de-chunking
  // Every request's body together, from its header until its exchange ends (a chunked body counts
  // as max_body_bytes): a body that would pass it gets 503 with Retry-After, so a crowd of large
  // uploads cannot exhaust memory.
  size_t max_body_bytes_in_flight = size_t{1} << 30;
  // From the start of waiting for a request (after accept, or after the previous response on a
  // kept-alive connection) to the end of its header block.
  std::chrono::milliseconds header_timeout{15'000};
  std::chrono::milliseconds body_timeout{60'000};  // from the end of the header block to the end of the body
  std::chrono::milliseconds write_timeout{60'000};  // one response write that the client does not take
  // From the end of the body to the end of the response (0: none).
  std::chrono::milliseconds request_timeout{600'000};
};

struct FrontConfig {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port (bind() returns it)
  int io_threads = 2;
  int worker_threads = 4;
  int backlog = 4096;  // the kernel caps it at net.core.somaxconn
  int max_connections = 8192;
  int retry_after_seconds = 1;  // in the 503 beyond max_connections
  // Origins browsers may call from (CORS): exact origins ("https://app.example.com") or "*" for any.
  // Empty: no CORS headers, and a preflight gets 403.
  std::vector<std::string> allowed_origins;
  Limits limits;
  // The body of an error the front answers itself (400 malformed request, 404, 405, 408, 413,
  // 415, 431, 503, 504), and its content type.
  std::function<std::string(int status, const std::string& message)> error_body = [](int, const std::string& message) {
    return message;
  };
  std::string error_content_type = "text/plain";
};

struct FrontStats {
  int64_t open_connections = 0;
  int64_t open_exchanges = 0;  // requests read whose response is not sent whole yet
  int64_t refused_connections = 0;  // 503 beyond max_connections
  int64_t deadline_closes = 0;      // sockets closed at a deadline
  int64_t body_bytes_in_flight = 0;  // reserved by the bodies being read or not answered yet
};

struct FrontState;  // http_front.cpp

class Front {
 public:
  explicit Front(FrontConfig config);
  ~Front();  // stop()
  Front(const Front&) = delete;
  Front& operator=(const Front&) = delete;

  // Before bind(). A request for a known path with another method gets 405, an unknown path 404.
  void route(std::string method, std::string path, Handler handler, Dispatch dispatch);

  // Binds host:port with the configured backlog and returns the port; throws splitflow::Error.
  int bind();
  // Runs the I/O threads (the caller is one of them) until stop().
  void serve();
  // Responses from now on close their connection instead of keeping it alive.
  void stop_keep_alive();
  // Any thread: closes the listener and every connection (open exchanges abort), and makes serve()
  // return. Idempotent.
  void stop();

  FrontStats stats() const;

 private:
  std::shared_ptr<FrontState> impl_;
};

}  // namespace splitflow::http
