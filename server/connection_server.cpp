// ConnectionServer: accept loop, one Session per connection (head -> checks -> body -> handler -> response),
// the worker pool, draining and stopping (see connection_server.h for the guarantees).
//
// Threads: every socket operation of a session runs on the single I/O thread, except while a worker owns
// the session (from handing it the request until it posts the session back): the worker then writes the
// response itself with poll() + send() on the socket, and the I/O thread leaves that socket alone (no
// operation pending, no timer armed). Timeouts are a per-session steady_timer that cancels the pending
// operation, so a timed-out request can still be answered (408).
#include "server/connection_server.h"
#include "server/worker_pool.h"

#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

namespace qrig::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

namespace {

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower((unsigned char)a[i]) != std::tolower((unsigned char)b[i])) return false;
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    int hi, lo;
    if (s[i] == '%' && i + 2 < s.size() && (hi = hex_value(s[i + 1])) >= 0 && (lo = hex_value(s[i + 2])) >= 0) {
      out += (char)(hi * 16 + lo);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

const char* reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
  }
  return "Unknown";
}

// A header value as it may go on the wire: control bytes (CR, LF, NUL...) become spaces.
std::string wire_value(const std::string& v) {
  std::string o = v;
  for (char& c : o)
    if (((unsigned char)c < 0x20 && c != '\t') || c == 0x7f) c = ' ';
  return o;
}

// Writes all of data to a non-blocking socket; fails when the peer makes no room for io_timeout_ms, the
// connection breaks, or the server stops.
bool send_all(int fd, const char* data, size_t size, int64_t timeout_ms, const std::atomic<bool>& stopping) {
  size_t off = 0;
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (off < size) {
    if (stopping) return false;
    ssize_t n = ::send(fd, data + off, size - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += (size_t)n;
      deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (Clock::now() > deadline) return false;
      pollfd p{fd, POLLOUT, 0};
      int r = ::poll(&p, 1, 100);
      if (r < 0 && errno != EINTR) return false;
      if (r > 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL))) return false;
      continue;
    }
    return false;
  }
  return true;
}

class Session;

}  // namespace

// ---- the server ----

struct ConnectionServer::Impl {
  Impl(ConnectionLimits l, Handlers hs) : lim(std::move(l)), h(std::move(hs)), pool(lim.workers) {
    if (lim.max_bodies_total == 0) lim.max_bodies_total = std::max<size_t>(8 * lim.max_body, 64u << 20);
  }

  // Reserves n bytes of the body budget; false when it would go over.
  bool reserve_body(int64_t n) {
    int64_t now = body_bytes.fetch_add(n) + n;
    if (now <= (int64_t)lim.max_bodies_total) return true;
    body_bytes.fetch_sub(n);
    return false;
  }
  std::atomic<int64_t> body_bytes{0};

  ConnectionLimits lim;
  Handlers h;
  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  asio::steady_timer accept_retry{ioc};
  asio::steady_timer drain_timer{ioc};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard{asio::make_work_guard(ioc)};
  std::atomic<bool> draining{false}, stopping{false}, stopped{false};
  bool drain_started = false, idle_grace_over = false;  // I/O thread

  mutable std::mutex mu;
  std::list<Session*> sessions;  // open connections

  WorkerPool pool;  // after ioc: its tasks hold sessions, whose sockets belong to ioc

  void do_accept();
  void on_accept(const error_code& ec, tcp::socket sock);
  void begin_drain();
  void check_drain_done();
  void close_idle();
  void teardown();
  std::list<Session*>::iterator add(Session* s) {
    std::lock_guard<std::mutex> lk(mu);
    return sessions.insert(sessions.end(), s);
  }
  void remove(std::list<Session*>::iterator it) {
    {
      std::lock_guard<std::mutex> lk(mu);
      sessions.erase(it);
    }
    check_drain_done();
  }
};

namespace {

enum class Phase { idle, reading, working, writing, closing, closed };

class Session : public std::enable_shared_from_this<Session> {
 public:
  using Impl = ConnectionServer::Impl;
  Session(Impl& srv, tcp::socket sock) : srv_(srv), sock_(std::move(sock)), timer_(srv.ioc) {}

  void start() {
    error_code ec;
    sock_.non_blocking(true, ec);
    sock_.set_option(tcp::no_delay(true), ec);
    auto ep = sock_.remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string();
    fd_ = sock_.native_handle();
    it_ = srv_.add(this);
    registered_ = true;
    wait_request(srv_.lim.head_timeout_ms);
  }

  Phase phase() const { return phase_; }
  Clock::time_point idle_since() const { return idle_since_; }
  int fd() const { return fd_; }

  // I/O thread. Closes the socket at once (pending operations complete with operation_aborted).
  void close_now() {
    if (phase_ == Phase::closed) return;
    phase_ = Phase::closed;
    release();
    error_code ec;
    timer_.cancel();
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
    if (registered_) {
      registered_ = false;
      srv_.remove(it_);
    }
  }

 private:
  // ---- timeouts ----
  void arm(int64_t ms) {
    timed_out_ = false;
    timer_.expires_after(std::chrono::milliseconds(ms));
    timer_.async_wait([w = weak_from_this()](const error_code& ec) {
      auto self = w.lock();
      if (ec || !self || self->phase_ == Phase::closed || self->phase_ == Phase::working) return;
      self->timed_out_ = true;
      error_code ignored;
      self->sock_.cancel(ignored);
    });
  }
  void disarm() { timer_.cancel(); }
  // The keep-alive clock starts once the client has received the response: while bytes of it are still in
  // the socket's send queue (a large answer, a slow reader) the connection is not idle yet.
  void arm_idle(int64_t timeout_ms) {
    int queued = 0;
    if (::ioctl(fd_, SIOCOUTQ, &queued) != 0 || queued <= 0) return arm(timeout_ms);
    timer_.expires_after(std::chrono::milliseconds(100));
    timer_.async_wait([w = weak_from_this(), timeout_ms](const error_code& ec) {
      auto self = w.lock();
      if (ec || !self || self->phase_ != Phase::idle) return;
      self->arm_idle(timeout_ms);
    });
  }

  // ---- reading a request ----
  // Waits for the first byte of the next request (or uses what is already buffered: pipelining).
  void wait_request(int64_t timeout_ms) {
    if (phase_ == Phase::closed) return;
    if (buf_.size() > 0) return read_head();
    if (srv_.draining && srv_.idle_grace_over) return close_now();
    phase_ = Phase::idle;
    idle_since_ = Clock::now();
    arm_idle(timeout_ms);
    sock_.async_read_some(buf_.prepare(4096), [self = shared_from_this()](const error_code& ec, size_t n) {
      if (self->phase_ == Phase::closed) return;
      if (ec) return self->close_now();  // idle timeout, client closed, evicted
      self->buf_.commit(n);
      self->read_head();
    });
  }

  void read_head() {
    phase_ = Phase::reading;
    t0_ = Clock::now();
    req_ = Request{};
    expect_continue_ = false;
    parser_.emplace();
    parser_->header_limit((std::uint32_t)srv_.lim.max_header_bytes);
    parser_->body_limit((std::uint64_t)srv_.lim.max_body);
    arm(srv_.lim.head_timeout_ms);
    http::async_read_header(sock_, buf_, *parser_, [self = shared_from_this()](const error_code& ec, size_t) {
      self->on_head(ec);
    });
  }

  void on_head(error_code ec) {
    if (phase_ == Phase::closed) return;
    disarm();
    if (ec) {
      if (timed_out_)
        return fail(408, fmt::format("the request head did not arrive within {} s", srv_.lim.head_timeout_ms / 1000.0));
      if (ec == http::error::end_of_stream || ec == http::error::partial_message || ec == asio::error::eof ||
          ec == asio::error::connection_reset || ec == asio::error::operation_aborted)
        return close_now();
      if (ec == http::error::header_limit)
        return fail(400, fmt::format("the request line and headers are over {} KiB", srv_.lim.max_header_bytes / 1024));
      if (ec == http::error::body_limit)  // the Content-Length says so
        return fail(413, fmt::format("the request body is larger than the server's limit of {} bytes (--max-body)",
                                     srv_.lim.max_body));
      return fail(400, "malformed HTTP request: " + ec.message());
    }
    const auto& hdr = parser_->get();
    req_.method = std::string(hdr.method_string());
    req_.target = std::string(hdr.target());
    req_.version = (int)hdr.version();
    req_.remote_addr = remote_;
    req_.socket = fd_;
    req_.stopping = &srv_.stopping;
    if (req_.version != 10 && req_.version != 11) return fail(505, "only HTTP/1.0 and HTTP/1.1 are served");
    if (req_.target.size() > srv_.lim.max_target_bytes)
      return fail(414, fmt::format("the request target is longer than {} bytes", srv_.lim.max_target_bytes));
    int hosts = 0, te = 0;
    for (const auto& f : hdr) {
      std::string name(f.name_string()), value(f.value());
      if (value.size() > srv_.lim.max_field_bytes)
        return fail(400, fmt::format("the header '{}' is longer than {} KiB", name, srv_.lim.max_field_bytes / 1024));
      if (iequal(name, "Host")) ++hosts;
      if (iequal(name, "Transfer-Encoding")) {
        ++te;
        if (!iequal(trim(value), "chunked"))
          return fail(501, "the only transfer coding accepted is a single 'Transfer-Encoding: chunked'");
      }
      if (iequal(name, "Content-Encoding") && !iequal(trim(value), "identity"))
        return fail(415, "compressed request bodies (Content-Encoding) are not accepted: send the body uncompressed");
      if (iequal(name, "Expect")) {
        if (!iequal(trim(value), "100-continue")) return fail(417, "the only expectation served is '100-continue'");
        expect_continue_ = true;
      }
      req_.headers.emplace_back(std::move(name), std::move(value));
    }
    if (te > 1) return fail(501, "the only transfer coding accepted is a single 'Transfer-Encoding: chunked'");
    if (req_.version == 11 && hosts != 1) return fail(400, "an HTTP/1.1 request must have exactly one Host header");
    // The path: origin-form ("/x?y"), absolute-form ("http://host/x"), or "*" (OPTIONS).
    std::string_view t = req_.target;
    if (t.size() > 7 && (iequal(t.substr(0, 7), "http://") || (t.size() > 8 && iequal(t.substr(0, 8), "https://")))) {
      size_t slash = t.find('/', t.find("://") + 3);
      t = slash == std::string_view::npos ? std::string_view("/") : t.substr(slash);
    }
    if (t != "*" && (t.empty() || t.front() != '/')) return fail(400, "the request target must be a path ('/...')");
    req_.path = percent_decode(t.substr(0, t.find('?')));
    keep_alive_ = parser_->keep_alive();

    const bool body_expected = !parser_->is_done();
    Response res;
    if (srv_.h.early(req_, res)) return respond_inline(std::move(res), !body_expected);
    if (!body_expected) return on_request();
    if (auto cl = parser_->content_length(); cl && *cl > srv_.lim.max_body)
      return fail(413, fmt::format("the request body is larger than the server's limit of {} bytes (--max-body)",
                                   srv_.lim.max_body));
    if (!reserve(parser_->content_length() ? (int64_t)*parser_->content_length() : kChunkReserve)) return busy_bodies();
    t_body_ = Clock::now();
    if (!expect_continue_) return read_body();
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    arm(srv_.lim.head_timeout_ms);
    asio::async_write(sock_, asio::buffer(kContinue), [self = shared_from_this()](const error_code& ec, size_t) {
      if (self->phase_ == Phase::closed) return;
      self->disarm();
      if (ec) return self->close_now();
      self->read_body();
    });
  }

  void read_body() {
    arm(srv_.lim.head_timeout_ms);  // the longest gap between two pieces of the body
    http::async_read_some(sock_, buf_, *parser_, [self = shared_from_this()](const error_code& ec, size_t) {
      if (self->phase_ == Phase::closed) return;
      self->disarm();
      if (ec) {
        if (ec == http::error::body_limit)
          return self->fail(413, fmt::format("the request body is larger than the server's limit of {} bytes (--max-body)",
                                             self->srv_.lim.max_body));
        if (self->timed_out_)
          return self->fail(408, fmt::format("the request body stalled for {} s", self->srv_.lim.head_timeout_ms / 1000.0));
        if (ec == http::error::end_of_stream || ec == http::error::partial_message || ec == asio::error::eof ||
            ec == asio::error::connection_reset || ec == asio::error::operation_aborted)
          return self->close_now();
        return self->fail(400, "malformed HTTP request body: " + ec.message());
      }
      // A chunked body grows past what was reserved for it: reserve more as it arrives.
      if (const int64_t have = (int64_t)self->parser_->get().body().size(); have > self->reserved_ &&
          !self->reserve(have - self->reserved_ + kChunkReserve))
        return self->busy_bodies();
      if (self->parser_->is_done()) return self->on_request();
      if (Clock::now() - self->t_body_ > std::chrono::milliseconds(self->srv_.lim.io_timeout_ms))
        return self->fail(408, "the request body took longer than the server's timeout (--timeout)");
      self->read_body();
    });
  }

  // ---- the body budget ----
  static constexpr int64_t kChunkReserve = 1 << 20;  // reserved ahead for a chunked body, per step
  bool reserve(int64_t n) {
    if (!srv_.reserve_body(n)) return false;
    reserved_ += n;
    return true;
  }
  void release() {
    if (reserved_ == 0) return;
    srv_.body_bytes.fetch_sub(reserved_);
    reserved_ = 0;
  }
  void busy_bodies() {
    Response res;
    srv_.h.error(503, fmt::format("the server is receiving more request bodies than it holds at once ({} MiB); retry",
                                  srv_.lim.max_bodies_total >> 20), res);
    res.set_header("Retry-After", "1");
    keep_alive_ = false;
    release();
    respond_inline(std::move(res), false);
  }

  // ---- handling ----
  bool keep_after(const Response& res) const {
    return keep_alive_ && !srv_.draining && served_ < srv_.lim.keep_alive_max && !iequal(res.header("Connection"), "close");
  }

  void on_request() {
    req_.body = std::move(parser_->get().body());
    parser_.reset();
    ++served_;
    if (!srv_.h.on_worker(req_)) {
      Response res;
      try {
        srv_.h.handle(req_, res);
      } catch (const std::exception& e) {
        res = Response{};
        srv_.h.error(500, std::string("internal error: ") + e.what(), res);
      }
      std::string().swap(req_.body);
      release();
      return respond_inline(std::move(res), true);
    }
    phase_ = Phase::working;
    auto req = std::make_shared<Request>(std::move(req_));
    auto self = shared_from_this();
    if (!srv_.pool.try_submit([self, req] { self->work(*req); })) {
      phase_ = Phase::reading;
      req_ = std::move(*req);
      std::string().swap(req_.body);
      release();
      Response res;
      srv_.h.error(429, fmt::format("every one of the server's {} request threads is busy (--threads-http)",
                                    srv_.lim.workers), res);
      res.set_header("Retry-After", "1");
      respond_inline(std::move(res), true);
    }
  }

  std::string head(const Request& req, const Response& res, bool keep, bool chunked, size_t length) const {
    std::string h = fmt::format("HTTP/1.1 {} {}\r\n", res.status, reason_phrase(res.status));
    auto add = [&](const std::string& n, const std::string& v) {
      h += n;
      h += ": ";
      h += wire_value(v);
      h += "\r\n";
    };
    for (const auto& [n, v] : srv_.lim.default_headers)
      if (res.header(n).empty()) add(n, v);
    for (const auto& [n, v] : res.headers)
      if (!iequal(n, "Connection") && !iequal(n, "Content-Length") && !iequal(n, "Transfer-Encoding")) add(n, v);
    if (!res.content_type.empty()) add("Content-Type", res.content_type);
    if (chunked) add("Transfer-Encoding", "chunked");
    else if (res.status != 204 && !res.streaming()) add("Content-Length", std::to_string(length));
    if (!keep) {
      add("Connection", "close");
    } else {
      if (req.version == 10) add("Connection", "keep-alive");
      // Two thirds of the idle timeout, so that clients (undici...) stop reusing the connection well before
      // the server closes it: the server's clock starts when the response is written, theirs once they have
      // read it, which a slow or busy client does seconds later.
      add("Keep-Alive", fmt::format("timeout={}, max={}", std::max<int64_t>(1, srv_.lim.idle_timeout_ms * 2 / 3000),
                                    std::max(1, srv_.lim.keep_alive_max - served_)));
    }
    h += "\r\n";
    return h;
  }

  // I/O thread: a whole response; keep_possible: false when an unread body is left on the connection.
  void respond_inline(Response res, bool keep_possible) {
    if (res.streaming()) {  // handlers on the I/O thread never stream
      res = Response{};
      srv_.h.error(500, "internal error: a streamed response outside a worker", res);
    }
    const bool keep = keep_possible && keep_after(res);
    auto wire = std::make_shared<std::string>(head(req_, res, keep, false, res.body.size()));
    if (req_.method != "HEAD") *wire += res.body;
    auto ex = std::make_shared<std::pair<Request, Response>>(std::move(req_), std::move(res));
    phase_ = Phase::writing;
    arm(srv_.lim.io_timeout_ms);
    asio::async_write(sock_, asio::buffer(*wire), [self = shared_from_this(), wire, ex, keep](const error_code& ec, size_t) {
      if (self->phase_ == Phase::closed) return;
      self->disarm();
      self->log(ex->first, ex->second, !ec);
      if (ec) return self->close_now();
      if (keep) return self->wait_request(self->srv_.lim.idle_timeout_ms);
      self->graceful_close();
    });
  }

  // A failure of the connection layer: an error response, then the connection closes.
  void fail(int status, const std::string& message) {
    release();
    Response res;
    srv_.h.error(status, message, res);
    keep_alive_ = false;
    respond_inline(std::move(res), false);
  }

  void log(const Request& req, const Response& res, bool complete) {
    if (!srv_.h.log) return;
    try {
      srv_.h.log(req, res, std::chrono::duration<double, std::milli>(Clock::now() - t0_).count(), complete);
    } catch (...) {
    }
  }

  // Worker thread: runs the handler and writes the response on the socket itself.
  void work(Request& req) {
    Response res;
    try {
      srv_.h.handle(req, res);
    } catch (const std::exception& e) {
      res = Response{};
      srv_.h.error(500, std::string("internal error: ") + e.what(), res);
    }
    bool keep = keep_after(res);
    bool ok = true;
    const int64_t io_ms = srv_.lim.io_timeout_ms;
    if (res.status == 499) {  // the client left while the handler waited: nothing to write
      ok = false;
    } else if (res.streaming()) {
      const bool chunked = req.version == 11;
      keep = keep && chunked;
      std::string h = head(req, res, keep, chunked, 0);
      ok = send_all(fd_, h.data(), h.size(), io_ms, srv_.stopping);
      bool done = false;
      if (ok) ok = stream(req, res, chunked, done) && done;
      if (ok && chunked) ok = send_all(fd_, "0\r\n\r\n", 5, io_ms, srv_.stopping);
      try {
        if (res.stream_end) res.stream_end(ok);
      } catch (...) {
      }
    } else {
      std::string wire = head(req, res, keep, false, res.body.size());
      if (req.method != "HEAD") wire += res.body;
      ok = send_all(fd_, wire.data(), wire.size(), io_ms, srv_.stopping);
    }
    log(req, res, ok);
    // Large bodies leave freed memory in the allocator's per-thread arenas: hand it back to the system.
    const bool large = req.body.size() + res.body.size() > (1u << 20);
    std::string().swap(req.body);
    release();  // the I/O thread leaves reserved_ alone while a worker owns the session
    res = Response{};
#if defined(__GLIBC__)
    if (large) malloc_trim(0);
#endif
    asio::post(srv_.ioc, [self = shared_from_this(), keep = keep && ok] {
      if (self->phase_ == Phase::closed) return;
      if (keep) return self->wait_request(self->srv_.lim.idle_timeout_ms);
      self->graceful_close();
    });
  }

  // Worker thread: pumps a streamed response; false when it was aborted (pump false, client gone, stop).
  bool stream(Request& req, Response& res, bool chunked, bool& done) {
    struct Sink final : StreamSink {
      int fd;
      bool chunked;
      int64_t timeout_ms;
      const std::atomic<bool>& stopping;
      bool finished = false, failed = false;
      Sink(int f, bool c, int64_t t, const std::atomic<bool>& s) : fd(f), chunked(c), timeout_ms(t), stopping(s) {}
      bool write(const char* data, size_t size) override {
        if (failed) return false;
        if (size == 0) return true;
        std::string frame;
        if (chunked) frame = fmt::format("{:x}\r\n", size);
        frame.append(data, size);
        if (chunked) frame += "\r\n";
        if (!send_all(fd, frame.data(), frame.size(), timeout_ms, stopping)) failed = true;
        return !failed;
      }
      void done() override { finished = true; }
    } sink(fd_, chunked, srv_.lim.io_timeout_ms, srv_.stopping);
    while (!sink.finished && !sink.failed) {
      if (!req.client_alive()) return false;
      bool more = false;
      try {
        more = res.pump(sink);
      } catch (...) {
        more = false;
      }
      if (!more && !sink.finished) return false;
    }
    done = sink.finished && !sink.failed;
    return !sink.failed;
  }

  // ---- closing ----
  // Send side first, then read and drop what the client still sends for a moment: a close with unread
  // input would reset the connection and could destroy the response before the client read it.
  void graceful_close() {
    if (phase_ == Phase::closed) return;
    phase_ = Phase::closing;
    error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
    buf_.consume(buf_.size());
    arm(2000);
    linger();
  }
  void linger() {
    sock_.async_read_some(buf_.prepare(16384), [self = shared_from_this()](const error_code& ec, size_t n) {
      if (self->phase_ == Phase::closed) return;
      self->lingered_ += n;
      if (ec || self->lingered_ > (4u << 20)) return self->close_now();
      self->buf_.consume(self->buf_.size());
      self->linger();
    });
  }

  Impl& srv_;
  tcp::socket sock_;
  asio::steady_timer timer_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Request req_;
  std::string remote_;
  int fd_ = -1;
  Phase phase_ = Phase::idle;
  bool timed_out_ = false, keep_alive_ = true, expect_continue_ = false, registered_ = false;
  int served_ = 0;
  int64_t reserved_ = 0;  // of the body budget
  size_t lingered_ = 0;
  Clock::time_point t0_, t_body_, idle_since_ = Clock::now();
  std::list<Session*>::iterator it_;
};

}  // namespace

void ConnectionServer::Impl::do_accept() {
  acceptor.async_accept(ioc, [this](const error_code& ec, tcp::socket sock) { on_accept(ec, std::move(sock)); });
}

void ConnectionServer::Impl::on_accept(const error_code& ec, tcp::socket sock) {
  if (!acceptor.is_open() || drain_started) return;
  if (ec) {
    if (ec == asio::error::operation_aborted) return;
    // Out of file descriptors (or a transient failure): try again shortly instead of spinning.
    accept_retry.expires_after(std::chrono::milliseconds(100));
    accept_retry.async_wait([this](const error_code& e) {
      if (!e) do_accept();
    });
    return;
  }
  Session* evict = nullptr;
  bool full = false;
  {
    std::lock_guard<std::mutex> lk(mu);
    if ((int)sessions.size() >= lim.max_connections) {
      full = true;
      for (Session* s : sessions)
        if (s->phase() == Phase::idle && (!evict || s->idle_since() < evict->idle_since())) evict = s;
    }
  }
  if (evict) {
    evict->close_now();
  } else if (full) {
    static const std::string kBody =
        "{\"error\":{\"message\":\"too many open connections\",\"type\":\"unavailable_error\",\"param\":null,\"code\":null}}";
    static const std::string kBusy = fmt::format(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nRetry-After: 1\r\n"
        "Content-Length: {}\r\n\r\n{}", kBody.size(), kBody);
    error_code e;
    sock.non_blocking(true, e);
    (void)::send(sock.native_handle(), kBusy.data(), kBusy.size(), MSG_NOSIGNAL);
    sock.shutdown(tcp::socket::shutdown_both, e);
    sock.close(e);
    return do_accept();
  }
  std::make_shared<Session>(*this, std::move(sock))->start();
  do_accept();
}

void ConnectionServer::Impl::close_idle() {
  std::vector<std::shared_ptr<Session>> idle;
  {
    std::lock_guard<std::mutex> lk(mu);
    for (Session* s : sessions)
      if (s->phase() == Phase::idle) idle.push_back(s->shared_from_this());
  }
  for (auto& s : idle) s->close_now();
}

void ConnectionServer::Impl::begin_drain() {
  if (drain_started) return;
  drain_started = true;
  error_code ec;
  acceptor.close(ec);
  accept_retry.cancel();
  drain_timer.expires_after(std::chrono::milliseconds(lim.drain_idle_grace_ms));
  drain_timer.async_wait([this](const error_code&) {
    idle_grace_over = true;
    close_idle();
    check_drain_done();
  });
}

void ConnectionServer::Impl::check_drain_done() {
  if (!drain_started || !idle_grace_over) return;
  bool empty;
  {
    std::lock_guard<std::mutex> lk(mu);
    empty = sessions.empty();
  }
  if (empty) guard.reset();  // run() returns once the last handlers have run
}

void ConnectionServer::Impl::teardown() {
  // Whatever is still open (stop()): cut it, so that workers' writes fail and their handlers see the client
  // gone; then wait for the workers.
  {
    std::lock_guard<std::mutex> lk(mu);
    for (Session* s : sessions) ::shutdown(s->fd(), SHUT_RDWR);
  }
  pool.join();
}

ConnectionServer::ConnectionServer(ConnectionLimits limits, Handlers handlers)
    : impl_(std::make_unique<Impl>(std::move(limits), std::move(handlers))) {}

ConnectionServer::~ConnectionServer() {
  stop();
  impl_->teardown();
}

int ConnectionServer::bind(const std::string& host, int port) {
  error_code ec;
  tcp::resolver resolver(impl_->ioc);
  auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec) throw std::runtime_error(fmt::format("cannot listen on {}:{} ({})", host, port, ec.message()));
  std::string why = "no address";
  for (const auto& r : results) {
    tcp::acceptor& a = impl_->acceptor;
    error_code e;
    a.open(r.endpoint().protocol(), e);
    if (!e) a.set_option(asio::socket_base::reuse_address(true), e);  // restart quickly (no SO_REUSEPORT)
    if (!e) a.bind(r.endpoint(), e);
    if (!e) a.listen(asio::socket_base::max_listen_connections, e);
    if (!e) return a.local_endpoint().port();
    why = e.message();
    a.close(e);
  }
  if (port == 0) throw std::runtime_error(fmt::format("cannot listen on {} (any port): {}", host, why));
  throw std::runtime_error(fmt::format("cannot listen on {}:{} ({}: address in use, or not an address of this machine)",
                                       host, port, why));
}

void ConnectionServer::run() {
  if (impl_->stopped) return;
  asio::post(impl_->ioc, [this] {
    if (impl_->acceptor.is_open() && !impl_->drain_started) impl_->do_accept();
  });
  impl_->ioc.run();
  impl_->teardown();
}

void ConnectionServer::drain() {
  impl_->draining = true;
  asio::post(impl_->ioc, [this] { impl_->begin_drain(); });
}

void ConnectionServer::stop() {
  impl_->stopping = true;
  impl_->stopped = true;
  impl_->ioc.stop();
}

int ConnectionServer::open_connections() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return (int)impl_->sessions.size();
}

int ConnectionServer::worker_threads() const { return impl_->pool.threads(); }

}  // namespace qrig::server
