// libFuzzer target for the HTTP request path (build with -DQRIG_FUZZ=ON, run scripts/fuzz-http.sh): each input
// is sent as raw bytes to a real in-process HttpServer over loopback TCP (the connection layer's framing and
// limits, Beast's parser, the head checks, then the JSON front of every route: parse_body, the chat,
// completion and tokenize request readers) and the client side half-closes. Whatever the bytes, the server
// must answer with zero or more well-formed HTTP/1.1 responses and close; a crash, a sanitizer report, a hang
// (the read below gives up after 5 s) or a response that does not start with a status line is a finding.
// The model is the tiny fixture's tokenizer with a scripted backend that ends every generation at once.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "../server/server_test_util.h"

namespace {

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
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) {
      std::fprintf(stderr, "fuzz_http: no end of the answer within 5 s (%zu bytes of it so far: %.200s); %d connections open\n",
                   got.size(), got.c_str(), server().http().open_connections());
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
