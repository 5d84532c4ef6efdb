// End-to-end tests (in-process server, scripted backend) of the request fields beyond OpenAI's core that the
// server honours: n > 1 sharing one prefill (whole and streamed), llama.cpp's n_predict / ignore_eos, vLLM's
// min_tokens / stop_token_ids / include_stop_str_in_output / allowed_token_ids / guided_* /
// structured_outputs, the thinking budget; the refusal of the ones it does not implement (and
// ServerOptions::ignore_unsupported_fields); a table of every field llama.cpp's and vLLM's OpenAI endpoints
// document, each honoured, harmless or refused; /v1/completions text_offset across skipped control tokens.
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

TEST_CASE("chat n > 1: n choices from one prefill, whole and streamed", "[server][fields][fixtures]") {
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

TEST_CASE("honoured llama.cpp / vLLM fields change the output", "[server][fields][fixtures]") {
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

TEST_CASE("the thinking budget closes the reasoning after that many tokens", "[server][fields][fixtures]") {
  test::TestServer srv(scripted("a b c d e f g h i j k l", "<|im_start|>assistant\n<think>\n"));
  json b = chat_body({{"enable_thinking", true}, {"thinking_token_budget", 3}, {"max_tokens", 40}});
  json r = ok(srv, b);
  CHECK(r["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3);
  b.erase("thinking_token_budget");
  r = ok(srv, b);
  CHECK(r["usage"]["completion_tokens_details"]["reasoning_tokens"].get<int64_t>() > 3);
}

TEST_CASE("fields that would change the output but are not implemented are a 400 naming them", "[server][fields][fixtures]") {
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

TEST_CASE("completions: text_offset skips control tokens the text leaves out", "[server][fields][fixtures]") {
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

namespace {

enum class Expect { honoured, harmless, refused };

struct FieldCase {
  const char* name;
  json value;  // a value that is not the field's inert default
  Expect expect;
  bool chat = true, completions = true;
};

// The fields llama.cpp's server README lists for POST /completion and its OpenAI-compatible chat endpoint,
// and vLLM's extra parameters of its chat and completions endpoints (besides OpenAI's own).
std::vector<FieldCase> documented_fields() {
  using E = Expect;
  return {
      // llama.cpp
      {"temperature", 0.5, E::honoured}, {"dynatemp_range", 0.3, E::refused}, {"dynatemp_exponent", 2.0, E::harmless},
      {"top_k", 5, E::honoured}, {"top_p", 0.9, E::honoured}, {"min_p", 0.1, E::honoured}, {"n_predict", 4, E::honoured},
      {"n_indent", 2, E::refused}, {"n_keep", 10, E::harmless}, {"stop", {"x"}, E::honoured}, {"typical_p", 0.8, E::honoured},
      {"repeat_penalty", 1.1, E::honoured}, {"repeat_last_n", 32, E::honoured}, {"presence_penalty", 0.5, E::honoured},
      {"frequency_penalty", 0.5, E::honoured}, {"dry_multiplier", 0.8, E::refused}, {"dry_base", 1.75, E::harmless},
      {"dry_allowed_length", 2, E::harmless}, {"dry_penalty_last_n", -1, E::harmless},
      {"dry_sequence_breakers", {"\n"}, E::harmless}, {"xtc_probability", 0.5, E::honoured},
      {"xtc_threshold", 0.1, E::honoured}, {"mirostat", 2, E::refused}, {"mirostat_tau", 5.0, E::harmless},
      {"mirostat_eta", 0.1, E::harmless}, {"grammar", "root ::= \"a\"", E::refused},
      {"json_schema", {{"type", "object"}}, E::honoured}, {"seed", 42, E::honoured}, {"ignore_eos", true, E::honoured},
      {"logit_bias", {{"5", -1}}, E::honoured}, {"n_probs", 3, E::refused}, {"min_keep", 5, E::refused},
      {"t_max_predict_ms", 100, E::refused}, {"id_slot", 1, E::harmless}, {"cache_prompt", false, E::harmless},
      {"return_tokens", true, E::refused}, {"samplers", {"top_k"}, E::refused}, {"timings_per_token", true, E::harmless},
      {"return_progress", true, E::refused}, {"post_sampling_probs", true, E::refused},
      {"response_fields", {"content"}, E::refused}, {"lora", {{{"id", 0}, {"scale", 1.0}}}, E::refused},
      {"top_n_sigma", 1.0, E::refused}, {"n_cmpl", 2, E::honoured}, {"n_cache_reuse", 256, E::harmless},
      {"reasoning_format", "none", E::honoured, true, false}, {"parse_tool_calls", false, E::refused, true, false},
      {"chat_template_kwargs", {{"enable_thinking", false}}, E::honoured, true, false},
      {"thinking_forced_open", true, E::refused, true, false},
      // vLLM
      {"best_of", 2, E::refused, false, true}, {"use_beam_search", true, E::refused}, {"repetition_penalty", 1.1, E::honoured},
      {"length_penalty", 0.5, E::refused}, {"stop_token_ids", {5}, E::honoured}, {"include_stop_str_in_output", true, E::honoured},
      {"min_tokens", 2, E::honoured}, {"skip_special_tokens", false, E::honoured},
      {"spaces_between_special_tokens", false, E::honoured}, {"truncate_prompt_tokens", 100, E::honoured},
      {"prompt_logprobs", 1, E::refused}, {"allowed_token_ids", {5, 6}, E::honoured}, {"bad_words", {"x"}, E::refused},
      {"echo", true, E::refused, true, false}, {"echo", true, E::honoured, false, true},
      {"add_generation_prompt", true, E::honoured, true, false},
      {"continue_final_message", false, E::honoured, true, false}, {"add_special_tokens", true, E::harmless},
      {"documents", {{{"title", "t"}, {"text", "x"}}}, E::refused, true, false},
      {"chat_template", "{{ messages }}", E::refused, true, false}, {"mm_processor_kwargs", json::object(), E::harmless},
      {"structured_outputs", {{"regex", "[a-z]{2}"}}, E::honoured}, {"guided_json", {{"type", "object"}}, E::honoured},
      {"guided_regex", "[a-z]{2}", E::honoured}, {"guided_choice", {"a", "b"}, E::honoured},
      {"guided_grammar", "root ::= \"a\"", E::refused}, {"structural_tag", "{}", E::refused},
      {"guided_decoding_backend", "xgrammar", E::harmless}, {"guided_whitespace_pattern", " ", E::refused},
      {"priority", 1, E::harmless}, {"request_id", "r1", E::harmless}, {"logits_processors", {"x.y"}, E::refused},
      {"return_tokens_as_token_ids", true, E::refused}, {"return_token_ids", true, E::refused},
      {"cache_salt", "s", E::harmless}, {"kv_transfer_params", json::object({{"a", 1}}), E::refused},
      {"vllm_xargs", {{"a", 1}}, E::refused}, {"include_reasoning", false, E::honoured, true, false},
      {"reasoning_effort", "none", E::honoured, true, false}, {"thinking_token_budget", 5, E::honoured, true, false},
      {"response_format", {{"type", "json_object"}}, E::honoured}, {"suffix", "x", E::refused, false, true},
      {"prompt_embeds", "AAAA", E::refused, false, true}, {"enable_thinking", false, E::honoured, true, false},
  };
}

}  // namespace

TEST_CASE("the llama.cpp and vLLM endpoint fields: each honoured, harmless or refused with a 400, none ignored",
          "[server][fields][fixtures]") {
  test::TestServer srv(scripted("Hello world."));
  for (const FieldCase& f : documented_fields()) {
    for (const bool chat : {true, false}) {
      if ((chat && !f.chat) || (!chat && !f.completions)) continue;
      json body = chat ? chat_body() : json{{"prompt", kPlainAnchor}, {"temperature", 0}};
      if (std::string(f.name) != "n_predict") body["max_tokens"] = 12;
      body[f.name] = f.value;
      INFO((chat ? "chat: " : "completions: ") << f.name << " = " << f.value.dump());
      Reply r = post(srv, chat ? "/v1/chat/completions" : "/v1/completions", body);
      INFO(r.raw.substr(0, 400));
      if (f.expect == Expect::refused) {
        CHECK(r.status == 400);
        CHECK(r.body["error"]["param"] == f.name);
      } else {
        CHECK(r.status == 200);
        CHECK(r.ignored.find(f.name) == std::string::npos);  // known: neither unknown nor refused
      }
    }
  }
}
