// libFuzzer target for the HTTP request path (build with -DQRIG_FUZZ=ON, run scripts/fuzz-http.sh): each input
// is sent as raw bytes to a real in-process HttpServer over loopback TCP (the connection layer's framing and
// limits, Beast's parser, the head checks, then the JSON front of every route: parse_body, the chat,
// completion and tokenize request readers) and the client side half-closes. Whatever the bytes, the server
// must answer with zero or more well-formed HTTP/1.1 responses and close; a crash, a sanitizer report, a hang
// (no end of the answer within kAnswerSeconds) or a response that does not start with a status line is a
// finding. The server's own deadlines here are 1 s (head, body gaps) and 5 s (writing, a whole body), and a
// half-closed client leaves it nothing to wait for, so every answer ends within a few milliseconds of
// server work. The limit is still 20 s, not 5: on a loaded shared machine the kernel has been seen to hold
// loopback segments for over 5 s after the server had answered and closed (the client's socket in FIN_WAIT1,
// its FIN unacknowledged, nothing received, no retransmission; see docs/server.md, "Fuzzing"), which a 5 s
// limit reported as a server hang. A real hang is reported with the client socket's TCP state beside the
// server's open connections, so the two can be told apart.
// The model is the tiny fixture's tokenizer with a scripted backend that ends every generation at once.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/sockios.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "../server/server_test_util.h"

namespace {

constexpr int kAnswerSeconds = 20;  // scripts/fuzz-http.sh gives libFuzzer's -timeout more than this

qrig::test::TestServer& server() {
  static qrig::test::TestServer* srv = [] {
    qrig::server::ServerOptions opt;
    opt.max_body_bytes = 1 << 20;
    opt.head_timeout_s = 1;
    opt.timeout_s = 5;
    auto backend = std::make_unique<qrig::test::ScriptedBackend>(*qrig::test::tiny_tokenizer(), std::vector<int32_t>{},
                                                                 std::vector<int32_t>{}, 2, 256);
    return new qrig::test::TestServer(std::move(backend), opt);
  }();
  return *srv;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int port = server().port();
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) std::abort();
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) std::abort();
  size_t off = 0;
  while (off < size) {
    ssize_t n = send(fd, data + off, size - off, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server closed early (an error it answered at once)
    off += (size_t)n;
  }
  shutdown(fd, SHUT_WR);
  std::string got;
  char buf[65536];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kAnswerSeconds);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, (int)left.count()) <= 0) {
      // Who holds the answer: the server (a connection still open there) or the kernel (the client's socket
      // not ESTABLISHED, bytes unacknowledged, nothing queued to read)?
      tcp_info ti{};
      socklen_t tl = sizeof ti;
      int inq = -1, outq = -1;
      (void)getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl);
      (void)ioctl(fd, SIOCINQ, &inq);
      (void)ioctl(fd, SIOCOUTQ, &outq);
      std::fprintf(stderr,
                   "fuzz_http: no end of the answer within %d s (%zu bytes of it so far: %.200s); %d connections open "
                   "in the server; client socket: TCP state %d, %u unacknowledged, %d bytes to read, %d to send, "
                   "%u retransmissions\n",
                   kAnswerSeconds, got.size(), got.c_str(), server().http().open_connections(), ti.tcpi_state,
                   ti.tcpi_unacked, inq, outq, ti.tcpi_total_retrans);
      std::abort();
    }
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, (size_t)n);
  }
  close(fd);
  if (!got.empty() && got.rfind("HTTP/1.1 ", 0) != 0) {
    std::fprintf(stderr, "fuzz_http: the answer does not start with a status line: %.80s\n", got.c_str());
    std::abort();
  }
  return 0;
}
