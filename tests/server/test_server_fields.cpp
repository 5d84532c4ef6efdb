// End-to-end tests (in-process server, scripted backend) of the request fields beyond OpenAI's core that the
// server honours: n > 1 sharing one prefill (whole and streamed), llama.cpp's n_predict / ignore_eos, vLLM's
// min_tokens / stop_token_ids / include_stop_str_in_output / allowed_token_ids / guided_* /
// structured_outputs, the thinking budget; the refusal of the ones it does not implement (and
// ServerOptions::ignore_unsupported_fields); /v1/completions text_offset across skipped control tokens.
#include <catch2/catch.hpp>

#include <regex>
#include <set>

#include "server_test_util.h"

using namespace qrig;
using nlohmann::json;

namespace {

std::vector<int32_t> enc(const std::string& s) { return test::tiny_tokenizer()->encode(s, true); }
std::string dec(const std::vector<int32_t>& ids) { return test::tiny_tokenizer()->decode(ids); }

const char* kPlainAnchor = "<|im_start|>assistant\n<think>\n\n</think>\n\n";

std::unique_ptr<test::ScriptedBackend> scripted(const std::string& out, const std::string& anchor = kPlainAnchor) {
  return std::make_unique<test::ScriptedBackend>(*test::tiny_tokenizer(), enc(out), enc(anchor), 2);
}

json chat_body(json extra = json::object()) {
  json b = {{"messages", json::array({{{"role", "user"}, {"content", "Say hello."}}})},
            {"temperature", 0},
            {"enable_thinking", false}};
  for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
  return b;
}

struct Reply {
  int status = 0;
  json body;
  std::string ignored;  // X-Qrig-Ignored-Fields
  std::string raw;
};

Reply post(test::TestServer& srv, const std::string& path, const json& body) {
  auto cli = srv.client();
  auto r = cli.Post(path.c_str(), body.dump(), "application/json");
  REQUIRE(r);
  Reply out{r->status, json(), r->get_header_value("X-Qrig-Ignored-Fields"), r->body};
  if (r->get_header_value("Content-Type").rfind("application/json", 0) == 0) out.body = json::parse(r->body);
  return out;
}

json ok(test::TestServer& srv, const json& body, const std::string& path = "/v1/chat/completions") {
  Reply r = post(srv, path, body);
  INFO(r.raw);
  REQUIRE(r.status == 200);
  CHECK(r.ignored.empty());
  return r.body;
}

std::string content(const json& r, size_t i = 0) { return r["choices"][i]["message"]["content"].get<std::string>(); }

}  // namespace

TEST_CASE("chat n > 1: n choices from one prefill, whole and streamed", "[server][fields]") {
  int64_t fed1 = 0, prompt = 0, completion1 = 0;
  {
    auto b = scripted("Hello world.");
    auto* backend = b.get();
    test::TestServer srv(std::move(b));
    json r = ok(srv, chat_body());
    REQUIRE(r["choices"].size() == 1);
    fed1 = backend->tokens_fed;
    prompt = r["usage"]["prompt_tokens"];
    completion1 = r["usage"]["completion_tokens"];
  }
  auto b = scripted("Hello world.");
  auto* backend = b.get();
  test::TestServer srv(std::move(b));
  json r = ok(srv, chat_body({{"n", 3}}));
  REQUIRE(r["choices"].size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(r["choices"][i]["index"] == i);
    CHECK(content(r, i) == "Hello world.");
    CHECK(r["choices"][i]["finish_reason"] == "stop");
  }
  CHECK(r["usage"]["prompt_tokens"] == prompt);
  CHECK(r["usage"]["completion_tokens"] == 3 * completion1);
  // One prefill: the prompt went through the backend once, the generated tokens three times.
  CHECK(backend->tokens_fed == prompt + 3 * (fed1 - prompt));

  auto cli = srv.client();
  auto s = cli.Post("/v1/chat/completions", chat_body({{"n", 2}, {"stream", true},
                                                       {"stream_options", {{"include_usage", true}}}}).dump(),
                    "application/json");
  REQUIRE(s);
  REQUIRE(s->status == 200);
  std::vector<std::string> text(2);
  std::vector<int> roles(2, 0), finishes(2, 0);
  int64_t last_index = 0;
  bool done = false, usage = false;
  for (const std::string& p : test::sse_payloads(s->body)) {
    if (p == "[DONE]") {
      done = true;
      continue;
    }
    json c = json::parse(p);
    if (c["choices"].empty()) {
      usage = true;
      CHECK(c["usage"]["completion_tokens"] == 2 * completion1);
      CHECK(c["usage"]["prompt_tokens"] == prompt);
      continue;
    }
    const json& ch = c["choices"][0];
    const int64_t i = ch["index"];
    REQUIRE((i == 0 || i == 1));
    CHECK(i >= last_index);
    last_index = i;
    if (ch["delta"].contains("role")) ++roles[(size_t)i];
    if (ch["delta"].contains("content")) text[(size_t)i] += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) {
      CHECK(ch["finish_reason"] == "stop");
      ++finishes[(size_t)i];
    }
  }
  CHECK(done);
  CHECK(usage);
  CHECK(text == std::vector<std::string>{"Hello world.", "Hello world."});
  CHECK(roles == std::vector<int>{1, 1});
  CHECK(finishes == std::vector<int>{1, 1});
}

TEST_CASE("honoured llama.cpp / vLLM fields change the output", "[server][fields]") {
  const std::string script = "Hello world. Goodbye world.";
  const std::vector<int32_t> ids = enc(script);
  test::TestServer srv(scripted(script));
  json plain = ok(srv, chat_body());
  REQUIRE(content(plain) == script);
  const int64_t n_plain = plain["usage"]["completion_tokens"];

  SECTION("n_predict and ignore_eos") {
    json r = ok(srv, chat_body({{"n_predict", 2}}));
    CHECK(r["choices"][0]["finish_reason"] == "length");
    CHECK(r["usage"]["completion_tokens"] == 2);
    r = ok(srv, chat_body({{"ignore_eos", true}, {"max_tokens", n_plain + 5}}));
    CHECK(r["choices"][0]["finish_reason"] == "length");
    CHECK(r["usage"]["completion_tokens"] == n_plain + 5);
    CHECK(content(r) == script);  // the end-of-generation tokens past it are control tokens: no text
  }
  SECTION("min_tokens holds the end back") {
    json r = ok(srv, chat_body({{"min_tokens", n_plain + 3}, {"max_tokens", 100}}));
    CHECK(r["usage"]["completion_tokens"].get<int64_t>() >= n_plain + 3);
    CHECK(content(r).rfind(script, 0) == 0);
  }
  SECTION("stop_token_ids and include_stop_str_in_output") {
    json r = ok(srv, chat_body({{"stop_token_ids", {ids[2]}}}));
    CHECK(content(r) == dec({ids[0], ids[1]}));
    CHECK(r["choices"][0]["finish_reason"] == "stop");
    r = ok(srv, chat_body({{"stop", {"Goodbye"}}, {"include_stop_str_in_output", true}}));
    CHECK(content(r) == "Hello world. Goodbye");
  }
  SECTION("allowed_token_ids") {
    json r = ok(srv, chat_body({{"allowed_token_ids", {ids[1]}}, {"max_tokens", 4}}));
    const std::string t = dec({ids[1]});
    CHECK(content(r) == t + t + t + t);
  }
  SECTION("guided_choice, guided_regex, guided_json, structured_outputs") {
    for (const char* key : {"guided_choice", "structured_outputs"}) {
      json b = std::string(key) == "guided_choice" ? chat_body({{key, {"yes", "no"}}})
                                                   : chat_body({{key, {{"choice", {"yes", "no"}}}}});
      json r = ok(srv, b);
      INFO(key);
      CHECK((content(r) == "yes" || content(r) == "no"));
    }
    json r = ok(srv, chat_body({{"guided_regex", "[0-9]{3}-[a-c]+"}, {"max_tokens", 30}}));
    CHECK(std::regex_match(content(r), std::regex("[0-9]{3}-[a-c]+")));
    json schema = {{"type", "object"},
                   {"properties", {{"a", {{"type", "integer"}, {"minimum", 2}, {"maximum", 5}}}}},
                   {"required", {"a"}}};
    r = ok(srv, chat_body({{"guided_json", schema}, {"max_tokens", 30}}));
    json out = json::parse(content(r));
    CHECK(out["a"].get<int64_t>() >= 2);
    CHECK(out["a"].get<int64_t>() <= 5);
    Reply both = post(srv, "/v1/chat/completions", chat_body({{"guided_regex", "a"}, {"guided_choice", {"b"}}}));
    CHECK(both.status == 400);
    CHECK(both.body["error"]["param"] == "guided_choice");
  }
  SECTION("completions: n, guided_choice, stop_token_ids") {
    const std::string prompt = kPlainAnchor;
    json r = ok(srv, {{"prompt", prompt}, {"temperature", 0}, {"max_tokens", 50}, {"n", 2}}, "/v1/completions");
    REQUIRE(r["choices"].size() == 2);
    CHECK(r["choices"][1]["index"] == 1);
    CHECK(r["choices"][0]["text"] == script);
    CHECK(r["choices"][1]["text"] == script);
    r = ok(srv, {{"prompt", prompt}, {"temperature", 0}, {"guided_choice", {"left", "right"}}}, "/v1/completions");
    const std::string t = r["choices"][0]["text"];
    CHECK((t == "left" || t == "right"));
    r = ok(srv, {{"prompt", prompt}, {"temperature", 0}, {"stop_token_ids", {ids[1]}}}, "/v1/completions");
    CHECK(r["choices"][0]["text"] == dec({ids[0]}));
  }
}

TEST_CASE("the thinking budget closes the reasoning after that many tokens", "[server][fields]") {
  test::TestServer srv(scripted("a b c d e f g h i j k l", "<|im_start|>assistant\n<think>\n"));
  json b = chat_body({{"enable_thinking", true}, {"thinking_token_budget", 3}, {"max_tokens", 40}});
  json r = ok(srv, b);
  CHECK(r["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3);
  b.erase("thinking_token_budget");
  r = ok(srv, b);
  CHECK(r["usage"]["completion_tokens_details"]["reasoning_tokens"].get<int64_t>() > 3);
}

TEST_CASE("fields that would change the output but are not implemented are a 400 naming them", "[server][fields]") {
  test::TestServer srv(scripted("Hello."));
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"mirostat", 2}, {"dry_multiplier", 0.8}, {"use_beam_search", true}, {"grammar", "root ::= \"a\""},
           {"samplers", {"top_k"}}, {"top_n_sigma", 1.0}, {"logits_processors", {"x"}}, {"prompt_logprobs", 1}}) {
    INFO(field);
    Reply r = post(srv, "/v1/chat/completions", chat_body({{field, value}}));
    CHECK(r.status == 400);
    CHECK(r.body["error"]["param"] == field);
    CHECK(r.body["error"]["message"].get<std::string>().find(field) != std::string::npos);
  }
  // Their inert values are accepted.
  ok(srv, chat_body({{"mirostat", 0}, {"dry_multiplier", 0}, {"use_beam_search", false}, {"top_n_sigma", -1}}));
  // Harmless fields are accepted and not reported.
  ok(srv, chat_body({{"metadata", {{"k", "v"}}}, {"store", false}, {"user", "u"}, {"cache_prompt", true},
                     {"service_tier", "auto"}, {"priority", 1}}));

  server::ServerOptions lax;
  lax.ignore_unsupported_fields = true;
  test::TestServer srv2(scripted("Hello."), lax);
  Reply r = post(srv2, "/v1/chat/completions", chat_body({{"mirostat", 2}, {"frobnicate", 1}}));
  CHECK(r.status == 200);
  CHECK(r.ignored == "frobnicate,mirostat");
}

TEST_CASE("completions: text_offset skips control tokens the text leaves out", "[server][fields]") {
  const std::string prompt = "The answer:";
  auto backend = std::make_unique<test::ScriptedBackend>(*test::tiny_tokenizer(), enc("<|vision_start|>iz"), enc(prompt), 1);
  test::TestServer srv(std::move(backend));
  json r = ok(srv, {{"prompt", prompt}, {"temperature", 0}, {"logprobs", 0}}, "/v1/completions");
  const json& lp = r["choices"][0]["logprobs"];
  REQUIRE(r["choices"][0]["text"] == "iz");
  REQUIRE(lp["tokens"].size() >= 2);
  CHECK(lp["tokens"][0] == "<|vision_start|>");
  CHECK(lp["text_offset"][0] == 0);
  CHECK(lp["text_offset"][1] == 0);  // was 16: the skipped token's bytes were counted
}
