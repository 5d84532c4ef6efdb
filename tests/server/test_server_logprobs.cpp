// Streamed logprobs are the whole response's, entry for entry, with the real tiny model on the CPU backend
// (distinct log-probabilities per token, so a lost, repeated or shifted entry shows): chat and text
// completions, plain and with a stop string whose partial match holds the text of some tokens back.
#include <catch2/catch.hpp>

#include "server_test_util.h"
#include "tests/runtime/engine_test_util.h"

using namespace qrig;
using nlohmann::json;

namespace {

json post(test::TestServer& srv, const std::string& path, const json& body) {
  auto cli = srv.client();
  auto r = cli.Post(path.c_str(), body.dump(), "application/json");
  REQUIRE(r);
  INFO(r->body);
  REQUIRE(r->status == 200);
  return json::parse(r->body);
}

std::vector<json> stream(test::TestServer& srv, const std::string& path, json body) {
  body["stream"] = true;
  auto cli = srv.client();
  auto r = cli.Post(path.c_str(), body.dump(), "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  auto payloads = test::sse_payloads(r->body);
  REQUIRE(!payloads.empty());
  CHECK(payloads.back() == "[DONE]");
  std::vector<json> chunks;
  for (size_t i = 0; i + 1 < payloads.size(); ++i) chunks.push_back(json::parse(payloads[i]));
  return chunks;
}

// The chat stream's logprobs.content entries in order, its content, its finish reason.
struct ChatStreamed {
  json logprobs = json::array();
  std::string content, finish;
};
ChatStreamed chat_stream(test::TestServer& srv, const json& body) {
  ChatStreamed s;
  for (const json& c : stream(srv, "/v1/chat/completions", body)) {
    const json& ch = c["choices"][0];
    if (ch["logprobs"].is_object())
      for (const json& e : ch["logprobs"]["content"]) s.logprobs.push_back(e);
    s.content += ch["delta"].value("content", "");
    if (ch["finish_reason"].is_string()) s.finish = ch["finish_reason"];
  }
  return s;
}

bool printable_ascii(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

std::string bytes_of(const json& entry) {
  std::string b;
  for (int c : entry["bytes"]) b += (char)c;
  return b;
}

}  // namespace

TEST_CASE("streamed chat logprobs equal the whole response's, also while a stop string holds text back", "[server][fixtures]") {
  test::TestServer srv(runtime::make_backend(test::plan_for(1, 512)));
  json body = {{"messages", json::array({{{"role", "user"}, {"content", "Tell me about the sea."}}})},
               {"temperature", 0}, {"max_tokens", 40}, {"logprobs", true}, {"top_logprobs", 3},
               {"logit_bias", {{"1000", -100}, {"1002", -100}}},  // no end of generation: 40 tokens
               {"chat_template_kwargs", {{"enable_thinking", false}}}};
  const json whole = post(srv, "/v1/chat/completions", body);
  const json& lp = whole["choices"][0]["logprobs"]["content"];
  const std::string content = whole["choices"][0]["message"]["content"];
  REQUIRE(lp.size() == 40);
  ChatStreamed s = chat_stream(srv, body);
  CHECK(s.logprobs == lp);
  CHECK(s.content == content);
  CHECK(s.finish == "length");

  // A stop string made of the bytes of two tokens from the 8th on, where it first occurs in the output: the
  // first of them is held back as a partial match, then the second completes the match. (Printable ASCII: the
  // random model's output has invalid UTF-8, which the content shows as U+FFFD, never as ASCII.)
  std::vector<size_t> offset = {0};
  for (const json& e : lp) offset.push_back(offset.back() + bytes_of(e).size());
  std::string all;
  for (const json& e : lp) all += bytes_of(e);
  size_t k = 8;
  std::string stop;
  for (; k + 2 < lp.size(); ++k) {
    stop = bytes_of(lp[k]) + bytes_of(lp[k + 1]);
    if (!bytes_of(lp[k]).empty() && !bytes_of(lp[k + 1]).empty() && printable_ascii(stop) && all.find(stop) == offset[k])
      break;
  }
  REQUIRE(k + 2 < lp.size());
  INFO("stop string " << json(stop).dump() << " at token " << k);
  REQUIRE(content.find(stop) != std::string::npos);
  const std::string before_stop = content.substr(0, content.find(stop));
  body["stop"] = json::array({stop});
  const json whole_stop = post(srv, "/v1/chat/completions", body);
  CHECK(whole_stop["choices"][0]["finish_reason"] == "stop");
  CHECK(whole_stop["choices"][0]["message"]["content"] == before_stop);
  // The logprobs cover the tokens generated up to the one that completed the stop string: the first k + 2.
  const json& lp_stop = whole_stop["choices"][0]["logprobs"]["content"];
  CHECK(lp_stop == json(std::vector<json>(lp.begin(), lp.begin() + (long)(k + 2))));
  ChatStreamed ss = chat_stream(srv, body);
  CHECK(ss.logprobs == lp_stop);
  CHECK(ss.content == before_stop);
  CHECK(ss.finish == "stop");
}

TEST_CASE("streamed text-completion logprobs equal the whole response's, also with a stop string", "[server][fixtures]") {
  test::TestServer srv(runtime::make_backend(test::plan_for(1, 512)));
  json body = {{"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 30}, {"logprobs", 2},
               {"logit_bias", {{"1000", -100}, {"1002", -100}}}};
  // Concatenates the streamed chunks' logprobs arrays.
  auto streamed = [&](const json& b, std::string& text) {
    json lp = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
               {"text_offset", json::array()}};
    text.clear();
    for (const json& c : stream(srv, "/v1/completions", b)) {
      const json& ch = c["choices"][0];
      text += ch.value("text", "");
      if (!ch["logprobs"].is_object()) continue;
      for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
        for (const json& v : ch["logprobs"][key]) lp[key].push_back(v);
    }
    return lp;
  };
  const json whole = post(srv, "/v1/completions", body);
  const json& lp = whole["choices"][0]["logprobs"];
  REQUIRE(lp["tokens"].size() == 30);
  std::string text;
  CHECK(streamed(body, text) == lp);
  CHECK(text == whole["choices"][0]["text"]);
  // Stop at the text of two tokens from the 10th on (printable ASCII, so the tokens' text is their bytes),
  // where it first occurs (text_offset counts the tokens' bytes, the text shows invalid UTF-8 as U+FFFD).
  const std::string full = whole["choices"][0]["text"];
  std::string all;
  for (const json& t : lp["tokens"]) all += t.get<std::string>();
  size_t k = 10;
  std::string stop;
  for (; k + 2 < 30; ++k) {
    stop = lp["tokens"][k].get<std::string>() + lp["tokens"][k + 1].get<std::string>();
    if (!lp["tokens"][k].get<std::string>().empty() && !lp["tokens"][k + 1].get<std::string>().empty() &&
        printable_ascii(stop) && full.find(stop) != std::string::npos) {
      // the first occurrence is at token k: count the tokens' text before it
      size_t at = 0;
      for (size_t i = 0; i < k; ++i) at += lp["tokens"][i].get<std::string>().size();
      if (all.find(stop) == at) break;
    }
  }
  REQUIRE(k + 2 < 30);
  INFO("stop string " << json(stop).dump() << " at token " << k);
  body["stop"] = stop;
  const json whole_stop = post(srv, "/v1/completions", body);
  CHECK(whole_stop["choices"][0]["finish_reason"] == "stop");
  CHECK(whole_stop["choices"][0]["text"] == full.substr(0, full.find(stop)));
  const json& lps = whole_stop["choices"][0]["logprobs"];
  REQUIRE(lps["tokens"].size() == k + 2);
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    CHECK(lps[key] == json(std::vector<json>(lp[key].begin(), lp[key].begin() + (long)(k + 2))));
  CHECK(streamed(body, text) == lps);
  CHECK(text == whole_stop["choices"][0]["text"]);
}
