// The connection layer of `qrig serve`: HTTP/1.1 over TCP, event-driven (Boost.Asio, one I/O thread) with
// Boost.Beast's strict request parser, so that no client can hold a thread or the server by sending slowly or
// ambiguously. What it guarantees, whatever the client sends:
// - a request head must arrive complete within head_timeout of its first byte (else 408 and close), a body
//   must keep arriving (no gap longer than head_timeout), an idle keep-alive connection closes after
//   idle_timeout (counted once its last response has left the send queue); waiting clients cost a socket, never a thread; at most max_connections are open (the
//   oldest idle one is closed to make room, else the newcomer gets a 503);
// - framing is unambiguous: Content-Length together with Transfer-Encoding, two different Content-Lengths,
//   any transfer coding but exactly "chunked", malformed chunks, bare LF line ends or control bytes in
//   header values are a 400/501 and the connection closes; a Content-Encoding (gzip...) is a 415, so bodies
//   are never inflated; the body limit counts chunked bodies too (413); an unknown method's body is read per
//   its framing like any other, never run as a request;
// - handlers run on a bounded pool of worker threads (started on demand); the head and body are read, and
//   quick responses written, on the I/O thread. A connection that must close after an error is closed
//   gracefully (send side first, then what the client still sends is read and dropped for a moment), so the
//   client gets the error response instead of a reset;
// - the request bodies held at one time (being received or handled) are bounded all together
//   (max_bodies_total): past it a request gets a 503, so a thousand connections each sending --max-body
//   cannot exhaust memory.
// Routes, authentication and error bodies belong to the application (server/http_server.cpp), called
// through Handlers.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/http_message.h"

namespace qrig::server {

struct ConnectionLimits {
  int64_t head_timeout_ms = 10'000;  // a request head, from its first byte; also the longest gap in a body
  int64_t idle_timeout_ms = 15'000;  // keep-alive: waiting for the next request (Keep-Alive: timeout= 2/3 of it)
  int64_t io_timeout_ms = 600'000;   // writing a response (a client that stops reading); a whole body
  size_t max_body = 16u << 20;       // after transfer decoding (chunked bodies too)
  size_t max_bodies_total = 0;       // bodies being received or handled, all together (503 above); 0:
                                     // 8 x max_body, at least 64 MiB
  size_t max_header_bytes = 64 * 1024;  // request line + header lines
  size_t max_field_bytes = 8 * 1024;    // one header value
  size_t max_target_bytes = 8192;       // the request target (414 above)
  int max_connections = 1024;
  int workers = 16;                  // handler threads at most
  int keep_alive_max = 1000;         // requests per connection
  int64_t drain_idle_grace_ms = 1000;  // after drain(): idle connections still answer (503) this long
  std::vector<std::pair<std::string, std::string>> default_headers;  // on every response
};

class ConnectionServer {
 public:
  struct Handlers {
    // I/O thread, the request's head only (body not read yet): answer at once (return true: the body is then
    // not read and the connection closes if one was sent), or let it through.
    std::function<bool(const Request&, Response&)> early;
    // Whether the complete request runs on a worker thread (true) or on the I/O thread (it must be quick).
    std::function<bool(const Request&)> on_worker;
    std::function<void(Request&, Response&)> handle;
    // A failure of the connection layer itself (framing, limits, timeouts, no free worker): fill `res`.
    std::function<void(int status, const std::string& message, Response& res)> error;
    // After each response (written, or failed; status 499: the client left before it): the request log. `ms`:
    // since the request's first byte; `complete`: the whole response reached the socket.
    std::function<void(const Request&, const Response&, double ms, bool complete)> log;
  };

  ConnectionServer(ConnectionLimits limits, Handlers handlers);
  ~ConnectionServer();
  ConnectionServer(const ConnectionServer&) = delete;
  ConnectionServer& operator=(const ConnectionServer&) = delete;

  // Listens on host:port (port 0: any free port); returns the port. Throws std::runtime_error.
  int bind(const std::string& host, int port);
  // Serves until drain() has completed or stop(); returns once every connection is closed and every worker
  // has finished. Returns at once if stop() came first.
  void run();
  // Stops accepting; every response from now on closes its connection; idle connections are closed
  // drain_idle_grace_ms later; run() returns when the last connection has closed. Any thread, repeatedly.
  void drain();
  // At once: closes every connection (streams are cut, waiting handlers see client_alive() false).
  void stop();

  int open_connections() const;
  int worker_threads() const;  // started so far (at most limits.workers)

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace qrig::server
