// The server under bad input and bad clients, in process: error objects for every failure class (400 with
// param, 401, 404, 405, 413, 429, context overflow), cancellation when a client disconnects (streamed or
// not), and draining (in-flight requests complete, run() returns).
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>

#include <fmt/format.h>

#include "server_test_util.h"

using namespace qrig;
using nlohmann::json;

namespace {

std::vector<int32_t> enc(const std::string& s) { return test::tiny_tokenizer()->encode(s, true); }

std::string long_text() {
  std::string out;
  for (int i = 0; i < 300; ++i) out += "word ";
  return out;
}

std::unique_ptr<test::ScriptedBackend> long_script(int slots = 2, int64_t ctx = 4096, int delay_ms = 0) {
  auto b = std::make_unique<test::ScriptedBackend>(*test::tiny_tokenizer(), enc(long_text()),
                                                   enc("<|im_start|>assistant\n<think>\n"), slots, ctx);
  b->step_delay_ms = delay_ms;
  return b;
}

const std::string kChat = R"({"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 5})";

json error_of(const httplib::Result& r, int status) {
  REQUIRE(r);
  INFO(r->body);
  CHECK(r->status == status);
  CHECK(r->get_header_value("Content-Type") == "application/json");
  json j = json::parse(r->body);
  REQUIRE(j.contains("error"));
  CHECK(j["error"]["message"].is_string());
  CHECK(j["error"]["type"].is_string());
  return j["error"];
}

// A raw TCP connection to the server (for clients httplib's client cannot imitate).
int connect_raw(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

void send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    REQUIRE(n > 0);
    off += (size_t)n;
  }
}

std::string post_request(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Waits until the engine has nothing running (true) or the time is up (false).
bool wait_idle(runtime::Engine& e, int ms) {
  for (int i = 0; i < ms / 10; ++i) {
    auto s = e.stats();
    if (s.running == 0 && s.queued == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

TEST_CASE("errors: malformed and invalid requests are 400 error objects naming the field", "[server][fixtures]") {
  test::TestServer srv(long_script());
  auto cli = srv.client();
  error_of(cli.Post("/v1/chat/completions", "{not json", "application/json"), 400);
  error_of(cli.Post("/v1/chat/completions", "", "application/json"), 400);
  error_of(cli.Post("/v1/chat/completions", std::string("{\"messages\": \"\xc3\x28\"}"), "application/json"), 400);
  CHECK(error_of(cli.Post("/v1/chat/completions", "{}", "application/json"), 400)["param"] == "messages");
  CHECK(error_of(cli.Post("/v1/chat/completions", R"({"messages": []})", "application/json"), 400)["param"] == "messages");
  CHECK(error_of(cli.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "n": 17})",
                          "application/json"), 400)["param"] == "n");
  CHECK(error_of(cli.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"})",
                          "application/json"), 400)["param"] == "max_tokens");
  CHECK(error_of(cli.Post("/v1/chat/completions", R"({"messages": [{"role": "assistant", "content": "x"}]})",
                          "application/json"), 400)["message"] == "No user query found in messages.");
  CHECK(error_of(cli.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"x": 1}]})",
                          "application/json"), 400)["param"] == "tools");
  CHECK(error_of(cli.Post("/v1/chat/completions",
                          R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})",
                          "application/json"), 400)["param"] == "tool_choice");
  CHECK(error_of(cli.Post("/v1/chat/completions",
                          R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})",
                          "application/json"), 400)["param"] == "messages");
  CHECK(error_of(cli.Post("/v1/chat/completions",
                          R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}})",
                          "application/json"), 400)["param"] == "response_format");
  std::string deep = "{\"messages\": " + std::string(5000, '[') + std::string(5000, ']') + "}";
  error_of(cli.Post("/v1/chat/completions", deep, "application/json"), 400);
  // Still serving.
  auto ok = cli.Post("/v1/chat/completions", kChat, "application/json");
  REQUIRE(ok);
  CHECK(ok->status == 200);
}

TEST_CASE("while the model loads: /health and the API are 503, /metrics answers", "[server][fixtures]") {
  server::ServerOptions opt;
  opt.host = "127.0.0.1";
  opt.port = 0;
  opt.log_requests = false;
  server::HttpServer http(opt);
  const int port = http.bind();
  std::thread t([&] { http.run(); });
  httplib::Client cli("127.0.0.1", port);
  json h = error_of(cli.Get("/health"), 503);
  CHECK(h["type"] == "unavailable_error");
  CHECK(h["message"] == "the model is loading");
  error_of(cli.Post("/v1/chat/completions", kChat, "application/json"), 503);
  error_of(cli.Get("/v1/models"), 503);
  auto m = cli.Get("/metrics");
  REQUIRE(m);
  CHECK(m->status == 200);
  CHECK(m->body.find("qrig_ready 0") != std::string::npos);
  auto model = std::make_shared<server::ServedModel>();
  model->tokenizer = test::tiny_tokenizer();
  model->engine = std::make_shared<runtime::Engine>(long_script(), 4);
  model->id = "late";
  model->init();
  http.set_model(model);
  auto ok = cli.Get("/health");
  REQUIRE(ok);
  CHECK(ok->status == 200);
  auto r = cli.Post("/v1/chat/completions", kChat, "application/json");
  REQUIRE(r);
  CHECK(r->status == 200);
  http.drain();
  t.join();
}

TEST_CASE("errors: routes, methods, body size, context overflow", "[server][fixtures]") {
  server::ServerOptions opt;
  opt.max_body_bytes = 4096;
  test::TestServer srv(long_script(2, 64), opt);
  auto cli = srv.client();
  CHECK(error_of(cli.Get("/v1/nothing"), 404)["type"] == "not_found_error");
  error_of(cli.Post("/v1/nothing", "{}", "application/json"), 404);
  auto m = cli.Get("/v1/chat/completions");
  CHECK(error_of(m, 405)["code"] == "method_not_allowed");
  CHECK(m->get_header_value("Allow") == "POST, OPTIONS");
  std::string big = "{\"messages\": [{\"role\": \"user\", \"content\": \"" + std::string(10000, 'a') + "\"}]}";
  CHECK(error_of(cli.Post("/v1/chat/completions", big, "application/json"), 413)["code"] == "payload_too_large");

  std::string words;
  for (int i = 0; i < 200; ++i) words += "hello ";
  json body = {{"messages", json::array({{{"role", "user"}, {"content", words}}})}};
  json e = error_of(cli.Post("/v1/chat/completions", body.dump(), "application/json"), 400);
  CHECK(e["type"] == "exceed_context_size_error");
  CHECK(e["n_ctx"] == 64);
  CHECK(e["n_prompt_tokens"].get<int64_t>() > 64);
  CHECK(e["param"] == "messages");
  auto ok = cli.Post("/v1/chat/completions", kChat, "application/json");
  REQUIRE(ok);
  CHECK(ok->status == 200);
}

TEST_CASE("headers: a flood of header lines is cut off at 64 KiB with a 400; pipelined requests work", "[server][fixtures]") {
  test::TestServer srv(long_script());
  int fd = connect_raw(srv.port());
  std::string head = "GET /health HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 2000; ++i) head += "X-Filler-" + std::to_string(i) + ": " + std::string(100, 'f') + "\r\n";
  head += "\r\n";
  send(fd, head.data(), head.size(), MSG_NOSIGNAL);  // the server may close before reading it all
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, (size_t)n);
  close(fd);
  CHECK(got.rfind("HTTP/1.1 400", 0) == 0);
  CHECK(got.find("invalid_request_error") != std::string::npos);

  // Two requests in one write on one connection: both answered, in order.
  fd = connect_raw(srv.port());
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  got.clear();
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, (size_t)n);
  close(fd);
  size_t second = got.find("HTTP/1.1 200", 1);
  CHECK(got.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(second != std::string::npos);
  CHECK(got.find("\"slots_idle\"") < second);
  CHECK(got.find("\"object\":\"list\"") > second);
}

TEST_CASE("API key: 401 without or with a wrong key, /health stays public", "[server][fixtures]") {
  server::ServerOptions opt;
  opt.api_key = "sekret";
  test::TestServer srv(long_script(), opt);
  auto cli = srv.client();
  json e = error_of(cli.Post("/v1/chat/completions", kChat, "application/json"), 401);
  CHECK(e["type"] == "authentication_error");
  error_of(cli.Post("/v1/chat/completions", httplib::Headers{{"Authorization", "Bearer wrong"}}, kChat, "application/json"), 401);
  error_of(cli.Get("/v1/models"), 401);
  error_of(cli.Get("/metrics"), 401);
  auto h = cli.Get("/health");
  REQUIRE(h);
  CHECK(h->status == 200);
  auto ok = cli.Post("/v1/chat/completions", httplib::Headers{{"Authorization", "Bearer sekret"}}, kChat, "application/json");
  REQUIRE(ok);
  CHECK(ok->status == 200);
}

TEST_CASE("API keys: a comma list and a key file, from Authorization or x-api-key", "[server][fixtures]") {
  const std::string file = (std::filesystem::temp_directory_path() / fmt::format("qrig-keys-{}.txt", ::getpid())).string();
  {
    std::ofstream out(file);
    out << "# team keys\n  filekey-1  \n\nfilekey-2\n";
  }
  server::ServerOptions opt;
  opt.api_key = "alpha, beta";
  opt.api_key_file = file;
  test::TestServer srv(long_script(), opt);
  auto cli = srv.client();
  for (const char* key : {"alpha", "beta", "filekey-1", "filekey-2"}) {
    INFO(key);
    auto r = cli.Post("/v1/chat/completions", httplib::Headers{{"Authorization", std::string("Bearer ") + key}}, kChat,
                      "application/json");
    REQUIRE(r);
    CHECK(r->status == 200);
    r = cli.Post("/v1/chat/completions", httplib::Headers{{"x-api-key", key}}, kChat, "application/json");
    REQUIRE(r);
    CHECK(r->status == 200);
  }
  for (const char* key : {"alpha, beta", "# team keys", "gamma", ""}) {
    INFO(key);
    error_of(cli.Post("/v1/chat/completions", httplib::Headers{{"x-api-key", key}}, kChat, "application/json"), 401);
  }
  // The Messages API answers in Anthropic's error shape.
  auto m = cli.Post("/v1/messages", httplib::Headers{{"x-api-key", "wrong"}}, "{}", "application/json");
  REQUIRE(m);
  CHECK(m->status == 401);
  json mj = json::parse(m->body);
  CHECK(mj["type"] == "error");
  CHECK(mj["error"]["type"] == "authentication_error");
  std::filesystem::remove(file);
  server::ServerOptions missing;
  missing.api_key_file = file;
  CHECK_THROWS_WITH(server::api_keys_of(missing), Catch::Contains("cannot read the API key file"));
}

TEST_CASE("CORS preflight allows the headers the OpenAI and Anthropic browser SDKs send", "[server][fixtures]") {
  test::TestServer srv(long_script());
  auto cli = srv.client();
  auto r = cli.Options("/v1/messages", httplib::Headers{{"Origin", "http://localhost:3000"},
                                                       {"Access-Control-Request-Method", "POST"},
                                                       {"Access-Control-Request-Headers",
                                                        "x-api-key,anthropic-version,x-stainless-future-header"}});
  REQUIRE(r);
  CHECK(r->status == 204);
  const std::string allowed = r->get_header_value("Access-Control-Allow-Headers");
  for (const char* h : {"Authorization", "Content-Type", "X-Api-Key", "Anthropic-Version", "X-Stainless-OS",
                        "X-Stainless-Retry-Count", "x-stainless-future-header", "OpenAI-Organization"}) {
    INFO(h);
    CHECK(allowed.find(h) != std::string::npos);
  }
  // A header value that is not a token list is not echoed.
  r = cli.Options("/v1/messages", httplib::Headers{{"Access-Control-Request-Headers", "x-a\"; evil"}});
  REQUIRE(r);
  CHECK(r->get_header_value("Access-Control-Allow-Headers").find("evil") == std::string::npos);
}

TEST_CASE("queue full is 429 with Retry-After", "[server][fixtures]") {
  test::TestServer srv(long_script(1, 4096, 20), {}, /*max_queue=*/1);
  const std::string stream = R"({"messages": [{"role": "user", "content": "hi"}], "stream": true})";
  auto run = [&] {
    auto cli = srv.client();
    return cli.Post("/v1/chat/completions", stream, "application/json");
  };
  auto wait_for = [&](int64_t running, int64_t queued) {
    for (int i = 0; i < 300; ++i) {
      auto s = srv.engine().stats();
      if (s.running == running && s.queued == queued) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  // One at a time: a request counts as queued until the scheduler gives it the slot.
  auto a = std::async(std::launch::async, run);
  REQUIRE(wait_for(1, 0));
  auto b = std::async(std::launch::async, run);
  REQUIRE(wait_for(1, 1));
  auto cli = srv.client();
  auto r = cli.Post("/v1/chat/completions", kChat, "application/json");
  CHECK(error_of(r, 429)["type"] == "rate_limit_error");
  CHECK(r->get_header_value("Retry-After") == "1");
  srv.engine().shutdown(false);  // cancel the two long requests: their streams end with an error event
  auto ra = a.get();
  auto rb = b.get();
  REQUIRE(ra);
  REQUIRE(rb);
  CHECK(ra->body.find("\"unavailable_error\"") != std::string::npos);
}

TEST_CASE("a client that disconnects mid-stream stops its generation", "[server][fixtures]") {
  auto backend = long_script(2, 4096, 10);
  test::ScriptedBackend* be = backend.get();
  test::TestServer srv(std::move(backend));
  auto cli = srv.client();
  int chunks = 0;
  // A streamed request read by a receiver that hangs up after a few chunks.
  httplib::Client c2("127.0.0.1", srv.port());
  std::string body = R"({"messages": [{"role": "user", "content": "hi"}], "stream": true, "temperature": 0})";
  int64_t steps_before = be->steps;
  httplib::Request hr;
  hr.method = "POST";
  hr.path = "/v1/chat/completions";
  hr.body = body;
  hr.set_header("Content-Type", "application/json");
  hr.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  auto res = c2.send(hr);
  CHECK(chunks == 3);
  CHECK(wait_idle(srv.engine(), 1000));
  int64_t steps = be->steps - steps_before;
  CHECK(steps < 50);  // the script is at least 300 tokens long
  CHECK(srv.engine().stats().generated_tokens_total < 50);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(be->steps - steps_before == steps);  // nothing runs any more
  auto ok = cli.Post("/v1/chat/completions", kChat, "application/json");
  REQUIRE(ok);
  CHECK(ok->status == 200);
}

TEST_CASE("a client that disconnects while waiting for a whole response stops its generation", "[server][fixtures]") {
  auto backend = long_script(2, 4096, 10);
  test::ScriptedBackend* be = backend.get();
  test::TestServer srv(std::move(backend));
  // No max_tokens: left alone, the request would generate the whole script (a step every 10 ms).
  REQUIRE(enc(long_text()).size() >= 300);
  int fd = connect_raw(srv.port());
  send_all(fd, post_request("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "temperature": 0})"));
  for (int i = 0; i < 400 && be->steps < 5; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(srv.engine().stats().running == 1);
  const int64_t at_close = be->steps;  // a few tokens are out
  REQUIRE(at_close >= 5);
  close(fd);
  CHECK(wait_idle(srv.engine(), 1000));
  const auto st = srv.engine().stats();
  CHECK(st.requests_total == 1);
  CHECK(be->steps - at_close < 40);  // stopped within a few steps of the hang-up,
  CHECK(st.generated_tokens_total < at_close + 40);  // far below the script's length
  auto cli = srv.client();
  auto ok = cli.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})",
                     "application/json");
  REQUIRE(ok);
  CHECK(ok->status == 200);
}

TEST_CASE("draining: the request in flight completes, new ones are refused, run() returns", "[server][fixtures]") {
  test::TestServer srv(long_script(2, 4096, 5));
  auto streamed = std::async(std::launch::async, [&] {
    auto cli = srv.client();
    return cli.Post("/v1/chat/completions",
                    R"({"messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": 60})",
                    "application/json");
  });
  for (int i = 0; i < 200 && srv.engine().stats().running == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  srv.http().drain();
  auto r = streamed.get();
  REQUIRE(r);
  CHECK(r->status == 200);
  auto payloads = test::sse_payloads(r->body);
  REQUIRE(payloads.size() >= 3);
  CHECK(payloads.back() == "[DONE]");
  CHECK(json::parse(payloads[payloads.size() - 2])["choices"][0]["finish_reason"] == "length");
  srv.join();  // run() has returned
  httplib::Client late("127.0.0.1", srv.port());
  late.set_connection_timeout(1, 0);
  auto refused = late.Get("/health");
  CHECK(!refused);
}
