// Issue 16 in process: request bodies parse in linear time with Json::parse's semantics (order kept, a
// duplicate key's last value in its first place), out-of-range numbers are 400s, unknown field names cannot
// inject response headers, and draining answers a request on an idle keep-alive connection with a 503.
// (The hostile-client cases against the real process are tests/server/client/hardening.test.mjs.)
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "server/errors.h"
#include "server/request_parse.h"
#include "server_test_util.h"

using namespace qrig;
using qrig::server::ApiError;
using qrig::server::ErrorKind;

namespace {

std::unique_ptr<test::ScriptedBackend> short_script() {
  auto tok = test::tiny_tokenizer();
  return std::make_unique<test::ScriptedBackend>(*tok, tok->encode("ok", true), tok->encode("<|im_start|>assistant\n", true), 1);
}

int connect_to(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// What arrives within ms (or until the server closes).
std::string read_for(int fd, int ms) {
  std::string got;
  char buf[4096];
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, (size_t)n);
  }
  return got;
}

}  // namespace

TEST_CASE("parse_body: numbers out of range are 400s, not 500s", "[server][hardening]") {
  for (const char* body : {"{\"t\": 1e400}", "{\"t\": -1e400}", "{\"a\": [1, 2, 1e999]}"}) {
    try {
      server::parse_body(body);
      FAIL("no error for " << body);
    } catch (const ApiError& e) {
      CHECK(e.kind == ErrorKind::invalid_request);
      CHECK(std::string(e.what()).find("not valid JSON") != std::string::npos);
    }
  }
}

TEST_CASE("parse_body: 200,000 keys in linear time, order and duplicate keys as Json::parse has them", "[server][hardening]") {
  std::string body = "{";
  for (int i = 0; i < 200000; ++i) body += "\"k" + std::to_string(i) + "\": " + std::to_string(i) + ",";
  body += "\"k5\": \"last\", \"k199999\": [1]}";
  auto t0 = std::chrono::steady_clock::now();
  server::Json j = server::parse_body(body);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s < 2.0);
  REQUIRE(j.size() == 200000);
  auto it = j.begin();
  CHECK(it.key() == "k0");
  std::advance(it, 5);
  CHECK(it.key() == "k5");
  CHECK(it.value() == "last");
  CHECK(j["k199999"] == server::Json::array({1}));
  CHECK(j["k1234"] == 1234);
  // Small objects take the other path: the same semantics.
  server::Json small = server::parse_body(R"({"a": 1, "b": {"x": 1, "x": 2}, "a": 3})");
  CHECK(small.dump() == R"({"a":3,"b":{"x":2}})");
}

TEST_CASE("unknown field names cannot inject response headers", "[server][hardening][fixtures]") {
  test::TestServer srv(short_script());
  auto cli = srv.client();
  const std::string body = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 1, "
                           "\"evil\\r\\nX-Injected: 1\": 1}";
  auto r = cli.Post("/v1/chat/completions", body, "application/json");
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK_FALSE(r->has_header("X-Injected"));
  REQUIRE(r->has_header("X-Qrig-Ignored-Fields"));
  CHECK(r->get_header_value("X-Qrig-Ignored-Fields") == "evil\\x0d\\x0aX-Injected: 1");
}

TEST_CASE("draining: a request on an idle keep-alive connection gets a 503, then run() returns", "[server][hardening][fixtures]") {
  test::TestServer srv(short_script());
  int fd = connect_to(srv.port());
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  send(fd, get.data(), get.size(), MSG_NOSIGNAL);
  CHECK(read_for(fd, 300).rfind("HTTP/1.1 200", 0) == 0);
  srv.http().drain();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  send(fd, get.data(), get.size(), MSG_NOSIGNAL);
  std::string got = read_for(fd, 2000);
  close(fd);
  CHECK(got.rfind("HTTP/1.1 503", 0) == 0);
  CHECK(got.find("Connection: close") != std::string::npos);
  srv.join();  // returns once the connection has closed and the idle grace has passed
}
