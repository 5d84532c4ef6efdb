// The request log line on its own (issue 14): it carries the request id, tokens, speeds, finish reasons and
// error messages, escapes what a client sent, and says when the client left; request ids and the per-thread
// scope generations report into.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <thread>

#include "server/http_message.h"
#include "server/request_log.h"

using namespace qrig;
using namespace qrig::server;
using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;
using Catch::Matchers::StartsWith;

TEST_CASE("the request log line: id, tokens, speeds, finish reasons, errors, disconnects, escaping", "[server][log]") {
  Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.remote_addr = "10.0.0.7";
  Response res;
  res.set_header("X-Request-Id", "abc-1");
  RequestRecord rec;
  rec.add_generation(30, 12, 8, 120, 70, 20, "stop", "");
  const std::string line = request_log_line(req, res, &rec, {42.5, true, false});
  CHECK_THAT(line, StartsWith("qrig serve: 20"));
  CHECK_THAT(line, Contains(" abc-1 10.0.0.7 POST /v1/chat/completions 200 42.5 ms prompt=30 cached=12 generated=8 "
                            "prompt_tps=180.0 gen_tps=100.0 queued=20ms finish=stop\n"));
  CHECK_THAT(line, EndsWith("finish=stop\n"));

  // Two generations (n > 1): tokens add up, distinct reasons in order; a reclassified one.
  RequestRecord two;
  two.add_generation(5, 0, 3, 10, 10, 0, "stop", "");
  two.add_generation(5, 0, 4, 10, 10, 0, "stop", "");
  two.reclassify("stop", "tool_calls");
  CHECK_THAT(request_log_line(req, res, &two, {}), Contains("prompt=10 cached=0 generated=7") &&
                                                     Contains("finish=tool_calls,stop\n"));

  // A 4xx: its error message, escaped, quotes included; what the client sent cannot break the line.
  Request evil = req;
  evil.path = "/v1/x\nqrig serve: FORGED";
  Response err;
  err.status = 400;
  err.set_content(R"({"error":{"message":"unknown field \"a\nb\"","type":"invalid_request_error"}})", "application/json");
  const std::string e = request_log_line(evil, err, nullptr, {1, true, false});
  CHECK(e.find('\n') == e.size() - 1);
  CHECK_THAT(e, Contains("/v1/x\\x0aqrig serve: FORGED 400"));
  CHECK_THAT(e, Contains(" - "));  // no id: the connection layer's own error answers have none
  CHECK_THAT(e, EndsWith("error=\"unknown field \\x22a\\x0ab\\x22\"\n"));

  // A stream that ended in an error event: the generation's error; a client that left.
  RequestRecord failed;
  failed.add_generation(5, 0, 1, 10, 0, 0, "error", "CUDA: device lost");
  CHECK_THAT(request_log_line(req, res, &failed, {}), EndsWith("finish=error error=\"CUDA: device lost\"\n"));
  Response gone;
  gone.status = 499;
  CHECK_THAT(request_log_line(req, gone, nullptr, {3, false, true}), EndsWith(" 499 3.0 ms client disconnected\n"));
  CHECK_THAT(request_log_line(req, res, nullptr, {3, false, false}), EndsWith(" response cut short\n"));
}

TEST_CASE("request ids: a plain X-Request-Id is kept, anything else replaced; scopes nest per thread", "[server][log]") {
  Request req;
  req.headers = {{"X-Request-Id", "trace.7:a_b-c"}};
  CHECK(request_id(req) == "trace.7:a_b-c");
  for (const char* bad : {"", "a b", "a\"b", "x\r\ny"}) {
    req.headers = {{"X-Request-Id", bad}};
    const std::string id = request_id(req);
    CHECK_THAT(id, StartsWith("req-"));
    CHECK(id.size() == 20);
  }
  req.headers = {{"X-Request-Id", std::string(129, 'a')}};
  CHECK_THAT(request_id(req), StartsWith("req-"));

  auto outer = std::make_shared<RequestRecord>(), inner = std::make_shared<RequestRecord>();
  CHECK(RequestScope::current() == nullptr);
  {
    RequestScope a(outer);
    CHECK(RequestScope::current() == outer);
    {
      RequestScope b(inner);
      CHECK(RequestScope::current() == inner);
      std::thread([] { CHECK(RequestScope::current() == nullptr); }).join();  // per thread
    }
    CHECK(RequestScope::current() == outer);
  }
  CHECK(RequestScope::current() == nullptr);
}
