// TransportServer: httplib's per-connection loop with bounded headers and a known socket (see transport.h).
#include "server/transport.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace qrig::server {

namespace {

thread_local int t_socket = -1;

// Waits until fd is ready for `events` or `timeout_ms` passes; >0 ready, 0 timeout, <0 error.
int wait_for(int fd, short events, int64_t timeout_ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    int r = poll(&p, 1, (int)std::min<int64_t>(timeout_ms, 1 << 30));
    if (r < 0 && errno == EINTR) continue;
    if (r > 0 && (p.revents & (POLLERR | POLLNVAL)) && !(p.revents & events)) return -1;
    return r;
  }
}

void address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  int r = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  if (r != 0) return;
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(serv);
  }
}

// httplib's Stream over a connected socket, with read/write timeouts, a read buffer (httplib reads request
// lines byte by byte), and a budget for the bytes of the request line and headers of the current request.
class BoundedSocketStream final : public httplib::Stream {
 public:
  BoundedSocketStream(int fd, int64_t read_timeout_ms, int64_t write_timeout_ms)
      : fd_(fd), read_ms_(read_timeout_ms), write_ms_(write_timeout_ms) {}

  // A new request starts: its headers get a fresh budget.
  void next_request() {
    in_headers_ = true;
    header_bytes_ = 0;
    tail_ = 0;
  }

  bool is_readable() const override { return buffered() || wait_for(fd_, POLLIN, read_ms_) > 0; }
  bool buffered() const { return pos_ < len_; }  // bytes already received (e.g. a pipelined request)
  bool is_writable() const override { return wait_for(fd_, POLLOUT, write_ms_) > 0 && socket_alive(fd_); }

  ssize_t read(char* ptr, size_t size) override {
    if (pos_ == len_) {
      if (wait_for(fd_, POLLIN, read_ms_) <= 0) return -1;
      ssize_t n;
      do n = recv(fd_, buf_, sizeof buf_, 0);
      while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      pos_ = 0;
      len_ = (size_t)n;
    }
    size_t n = std::min(size, len_ - pos_);
    if (in_headers_) {
      // Count header bytes up to the blank line that ends them ("\r\n\r\n"; httplib also accepts "\n\n").
      size_t k = 0;
      for (; k < n && in_headers_; ++k) {
        char c = buf_[pos_ + k];
        tail_ = (tail_ << 8) | (unsigned char)c;
        if ((tail_ & 0xffffffffu) == 0x0d0a0d0au || (tail_ & 0xffffu) == 0x0a0au) in_headers_ = false;
      }
      header_bytes_ += k;
      if (header_bytes_ > kMaxHeaderBytes) return -1;  // httplib answers 400 and closes the connection
    }
    std::memcpy(ptr, buf_ + pos_, n);
    pos_ += n;
    return (ssize_t)n;
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (wait_for(fd_, POLLOUT, write_ms_) <= 0) return -1;
    ssize_t n;
    do n = send(fd_, ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { address_of(fd_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address_of(fd_, false, ip, port); }
  socket_t socket() const override { return fd_; }

 private:
  int fd_;
  int64_t read_ms_, write_ms_;
  char buf_[4096];
  size_t pos_ = 0, len_ = 0;
  bool in_headers_ = true;
  size_t header_bytes_ = 0;
  uint32_t tail_ = 0;
};

}  // namespace

int client_socket() { return t_socket; }

bool socket_alive(int fd) {
  if (fd < 0) return true;
  pollfd p{fd, POLLIN, 0};
  int r = poll(&p, 1, 0);
  if (r < 0) return errno == EINTR;
  if (r == 0) return true;  // nothing to read: still connected
  if (p.revents & (POLLERR | POLLNVAL)) return false;
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return true;    // the client sent more (a pipelined request): still there
  if (n == 0) return false;  // orderly shutdown
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

bool TransportServer::process_and_close_socket(socket_t sock) {
  const int64_t read_ms = (int64_t)read_timeout_sec_ * 1000 + read_timeout_usec_ / 1000;
  const int64_t write_ms = (int64_t)write_timeout_sec_ * 1000 + write_timeout_usec_ / 1000;
  BoundedSocketStream strm(sock, read_ms, write_ms);
  t_socket = sock;
  bool ret = false;
  for (size_t left = keep_alive_max_count_; left > 0; --left) {
    // Keep-alive: wait for the next request, giving up early when the server drains (a request already
    // sent is still answered, with 503) or stops.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(keep_alive_timeout_sec_);
    int ready = strm.buffered() ? 1 : 0;
    while (ready == 0 && svr_sock_ != INVALID_SOCKET) {
      const bool last_look = draining_ || std::chrono::steady_clock::now() > deadline;
      ready = wait_for(sock, POLLIN, last_look ? 0 : 50);
      if (last_look) break;
    }
    if (ready <= 0 || svr_sock_ == INVALID_SOCKET) break;
    strm.next_request();
    bool closed = false;
    ret = process_request(strm, left == 1 || draining_, closed, nullptr);
    if (!ret || closed || draining_) break;
  }
  t_socket = -1;
  shutdown(sock, SHUT_RDWR);
  close(sock);
  return ret;
}

}  // namespace qrig::server
