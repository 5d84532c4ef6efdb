// The server when generation fails part-way (tests/runtime/test_backends.h FailingBackend over the scripted
// backend: the step that feeds back a chosen output token throws): a whole response is a 500 server_error
// "generation failed: <the backend's message>"; a stream that has started ends with an error event and no
// [DONE]; both for chat and text completions, and the server goes on serving.
#include <catch2/catch.hpp>

#include "server_test_util.h"
#include "tests/runtime/test_backends.h"

using namespace qrig;
using nlohmann::json;

namespace {

std::vector<int32_t> enc(const std::string& s) { return test::tiny_tokenizer()->encode(s, true); }

const std::string kScript = "alpha beta gamma zebra delta epsilon";

struct FailingServer {
  test::FailingBackend* fail = nullptr;
  std::unique_ptr<test::TestServer> srv;
  int32_t poison = -1;
  std::string before;  // the output text before the failing step
  FailingServer() {
    const auto script = enc(kScript);
    // The poison is the first token of " zebra": the step that feeds it back fails, after the tokens of
    // "alpha beta gamma zebra" went out ("zebra"'s first token included: it was sampled by the step before).
    const auto z = enc(" zebra");
    poison = z.at(0);
    const auto at = std::find(script.begin(), script.end(), poison);
    REQUIRE(at != script.end());
    REQUIRE(std::count(script.begin(), script.end(), poison) == 1);
    before = test::tiny_tokenizer()->decode(std::vector<int32_t>(script.begin(), at + 1));
    auto scripted = std::make_unique<test::ScriptedBackend>(*test::tiny_tokenizer(), script,
                                                            enc("<|im_start|>assistant\n<think>\n\n</think>\n\n"), 2);
    auto f = std::make_unique<test::FailingBackend>(std::move(scripted));
    fail = f.get();
    fail->poison_token = poison;
    srv = std::make_unique<test::TestServer>(std::move(f));
  }
};

json chat(bool stream) {
  return {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
          {"temperature", 0},
          {"chat_template_kwargs", {{"enable_thinking", false}}},
          {"stream", stream}};
}

void check_failed_error(const json& e, const std::string& message) {
  INFO(e.dump());
  CHECK(e["type"] == "server_error");
  CHECK(e["message"] == "generation failed: " + message);
}

// The payloads of a stream that failed: no [DONE], the last one is the error object.
std::vector<std::string> failed_stream(const httplib::Result& r, const std::string& message) {
  REQUIRE(r);
  INFO(r->body);
  CHECK(r->status == 200);  // the stream had started
  const auto payloads = test::sse_payloads(r->body);
  REQUIRE(payloads.size() >= 2);
  for (const auto& p : payloads) CHECK(p != "[DONE]");
  const json last = json::parse(payloads.back());
  REQUIRE(last.contains("error"));
  check_failed_error(last["error"], message);
  return payloads;
}

}  // namespace

TEST_CASE("a generation that fails: 500 'generation failed', or a stream that ends in an error event", "[server][fixtures]") {
  FailingServer fs;
  auto cli = fs.srv->client();
  // Whole response.
  auto whole = cli.Post("/v1/chat/completions", chat(false).dump(), "application/json");
  REQUIRE(whole);
  INFO(whole->body);
  CHECK(whole->status == 500);
  check_failed_error(json::parse(whole->body)["error"], fs.fail->step_message);
  CHECK(fs.fail->failed_steps == 1);

  // Streamed: the text before the failure arrives, then the error event; no finish chunk, no [DONE].
  auto streamed = cli.Post("/v1/chat/completions", chat(true).dump(), "application/json");
  const auto payloads = failed_stream(streamed, fs.fail->step_message);
  std::string content;
  for (size_t i = 0; i + 1 < payloads.size(); ++i) {
    const json c = json::parse(payloads[i]);
    CHECK(c["object"] == "chat.completion.chunk");
    CHECK(c["choices"][0]["finish_reason"].is_null());
    content += c["choices"][0]["delta"].value("content", "");
  }
  CHECK(content == fs.before);
  CHECK(fs.fail->failed_steps == 2);

  // Text completions, the same two ways (the anchor is the chat prompt's end, so a raw prompt ending with it
  // is continued by the script).
  const std::string prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
  json comp = {{"prompt", prompt}, {"temperature", 0}, {"max_tokens", 50}};
  auto cw = cli.Post("/v1/completions", comp.dump(), "application/json");
  REQUIRE(cw);
  INFO(cw->body);
  CHECK(cw->status == 500);
  check_failed_error(json::parse(cw->body)["error"], fs.fail->step_message);
  comp["stream"] = true;
  const auto cp = failed_stream(cli.Post("/v1/completions", comp.dump(), "application/json"), fs.fail->step_message);
  std::string text;
  for (size_t i = 0; i + 1 < cp.size(); ++i) text += json::parse(cp[i])["choices"][0].value("text", "");
  CHECK(text == fs.before);
  CHECK(fs.fail->failed_steps == 4);

  // Nothing is left running, and the server goes on: without the poison the script completes.
  int64_t running = -1;
  for (int i = 0; i < 200 && running != 0; ++i) {
    running = fs.srv->engine().stats().running;
    if (running != 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(running == 0);
  fs.fail->poison_token = -1;
  auto ok = cli.Post("/v1/chat/completions", chat(false).dump(), "application/json");
  REQUIRE(ok);
  CHECK(ok->status == 200);
  CHECK(json::parse(ok->body)["choices"][0]["message"]["content"] == kScript);
}
