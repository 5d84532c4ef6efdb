// Tests of server/request_parse and server/errors: body limits (depth, UTF-8, type), field readers and
// their `param`, the shared generation fields, unknown-field reporting, and the error table.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "server/errors.h"
#include "server/request_fields.h"
#include "server/request_parse.h"

using namespace qrig::server;

namespace {

// The ApiError a call throws (fails the test when it throws nothing).
template <class F>
ApiError error_of(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return e;
  }
  FAIL("no ApiError thrown");
  return ApiError(ErrorKind::internal, "");
}

GenParams common(const std::string& body, int32_t vocab = 1000) {
  GenParams g;
  std::set<std::string> known;
  parse_common(parse_body(body), g, vocab, -1, known);
  return g;
}

}  // namespace

TEST_CASE("error table: every kind has a status and type; error bodies follow OpenAI", "[server]") {
  for (ErrorKind k : {ErrorKind::invalid_request, ErrorKind::unsupported, ErrorKind::context_overflow,
                      ErrorKind::authentication, ErrorKind::not_found, ErrorKind::method_not_allowed,
                      ErrorKind::payload_too_large, ErrorKind::uri_too_long, ErrorKind::queue_full, ErrorKind::internal,
                      ErrorKind::unavailable}) {
    const ErrorSpec& s = error_spec(k);
    CHECK(s.status >= 400);
    CHECK(std::string(s.type).size() > 0);
  }
  CHECK(error_spec(ErrorKind::context_overflow).status == 400);
  CHECK(std::string(error_spec(ErrorKind::context_overflow).type) == "exceed_context_size_error");
  CHECK(error_spec(ErrorKind::authentication).status == 401);
  CHECK(error_spec(ErrorKind::queue_full).status == 429);
  CHECK(error_spec(ErrorKind::unavailable).status == 503);
  CHECK(kind_for_status(404) == ErrorKind::not_found);
  CHECK(kind_for_status(413) == ErrorKind::payload_too_large);
  CHECK(kind_for_status(400) == ErrorKind::invalid_request);
  CHECK(kind_for_status(418) == ErrorKind::invalid_request);
  CHECK(kind_for_status(502) == ErrorKind::internal);

  ApiError e(ErrorKind::context_overflow, "too long", "messages");
  e.extra = {{"n_prompt_tokens", 10}, {"n_ctx", 8}};
  nlohmann::json b = error_body(e);
  CHECK(b["error"]["message"] == "too long");
  CHECK(b["error"]["type"] == "exceed_context_size_error");
  CHECK(b["error"]["param"] == "messages");
  CHECK(b["error"]["n_prompt_tokens"] == 10);
  CHECK(b["error"]["n_ctx"] == 8);
  nlohmann::json b2 = error_body(ApiError(ErrorKind::invalid_request, "x"));
  CHECK(b2["error"]["param"].is_null());
  CHECK(b2["error"]["code"].is_null());
}

TEST_CASE("parse_body: malformed, non-object, too deep and invalid UTF-8 bodies are 400", "[server]") {
  CHECK(error_of([] { parse_body(""); }).kind == ErrorKind::invalid_request);
  CHECK(error_of([] { parse_body("{\"a\": "); }).kind == ErrorKind::invalid_request);
  CHECK(error_of([] { parse_body("[1, 2]"); }).kind == ErrorKind::invalid_request);
  CHECK(error_of([] { parse_body("\"text\""); }).kind == ErrorKind::invalid_request);
  CHECK(error_of([] { parse_body(std::string("{\"a\": \"\xff\xfe\"}")); }).kind == ErrorKind::invalid_request);
  std::string deep = "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  ApiError d = error_of([&] { parse_body(deep); });
  CHECK(std::string(d.what()).find("nested deeper") != std::string::npos);
  std::string ok_depth = "{\"a\": " + std::string(kMaxDepth - 1, '[') + std::string(kMaxDepth - 1, ']') + "}";
  CHECK_NOTHROW(parse_body(ok_depth));
  CHECK(parse_body("{\"x\": 1}")["x"] == 1);
}

TEST_CASE("field readers: types, ranges, null as absent, param names", "[server]") {
  Json j = Json::parse(R"({"i": 5, "f": 2.0, "h": 2.5, "s": "x", "b": true, "n": null, "neg": -3, "big": 18446744073709551615})");
  CHECK(get_int(j, "i", 0, 10) == 5);
  CHECK(get_int(j, "f", 0, 10) == 2);
  CHECK(!get_int(j, "n", 0, 10).has_value());
  CHECK(!get_int(j, "absent", 0, 10).has_value());
  CHECK(error_of([&] { get_int(j, "h", 0, 10); }).param == "h");
  CHECK(error_of([&] { get_int(j, "s", 0, 10); }).param == "s");
  CHECK(error_of([&] { get_int(j, "neg", 0, 10); }).param == "neg");
  CHECK(error_of([&] { get_int(j, "big", 0, 10); }).param == "big");
  CHECK(error_of([&] { get_int(j, "b", 0, 10); }).param == "b");
  CHECK(get_number(j, "h", 0, 3) == 2.5);
  CHECK(error_of([&] { get_number(j, "h", 0, 1); }).param == "h");
  CHECK(get_bool(j, "b") == true);
  CHECK(error_of([&] { get_bool(j, "i"); }).param == "i");
  CHECK(get_string(j, "s") == "x");
  CHECK(error_of([&] { get_string(j, "i", "nested.i"); }).param == "nested.i");
}

TEST_CASE("parse_common: sampling fields override the defaults they are given", "[server]") {
  GenParams g;
  g.sampling = qrig::runtime::SamplingParams::qwen_defaults(true);
  std::set<std::string> known;
  parse_common(parse_body(R"({"temperature": 0, "top_k": -1, "min_p": 0.1, "seed": 42, "max_tokens": 7})"), g, 1000, -1,
               known);
  CHECK(g.sampling.temperature == 0.0f);
  CHECK(g.sampling.top_k == 0);
  CHECK(g.sampling.min_p == Approx(0.1f));
  CHECK(g.sampling.top_p == Approx(0.95f));         // untouched default (thinking)
  CHECK(g.sampling.presence_penalty == Approx(1.5f));  // untouched default
  CHECK(g.sampling.seed == 42u);
  CHECK(g.max_tokens == 7);
  CHECK(known.count("temperature") == 1);

  CHECK(common(R"({"max_tokens": 7, "max_completion_tokens": 9})").max_tokens == 9);
  CHECK(common("{}").max_tokens == -1);
  CHECK(!common(R"({"seed": -1})").sampling.seed.has_value());
  CHECK(common(R"({"seed": 18446744073709551615})").sampling.seed == 18446744073709551615ull);
  CHECK(common(R"({"repeat_penalty": 1.1})").sampling.repetition_penalty == Approx(1.1f));
}

TEST_CASE("parse_common: invalid values name their field", "[server]") {
  CHECK(error_of([] { common(R"({"temperature": "hot"})"); }).param == "temperature");
  CHECK(error_of([] { common(R"({"temperature": -1})"); }).param == "temperature");
  CHECK(error_of([] { common(R"({"top_p": 0})"); }).param == "top_p");
  CHECK(error_of([] { common(R"({"top_p": 1.5})"); }).param == "top_p");
  CHECK(error_of([] { common(R"({"presence_penalty": 3})"); }).param == "presence_penalty");
  CHECK(error_of([] { common(R"({"max_tokens": 0})"); }).param == "max_tokens");
  CHECK(error_of([] { common(R"({"max_tokens": 1.5})"); }).param == "max_tokens");
  CHECK(error_of([] { common(R"({"seed": -2})"); }).param == "seed");
  CHECK(error_of([] { common(R"({"model": 3})"); }).param == "model");
  CHECK(error_of([] { common(R"({"stream": "yes"})"); }).param == "stream");
  CHECK(error_of([] { common(R"({"repetition_penalty": 1.1, "repeat_penalty": 1.2})"); }).param == "repeat_penalty");
  ApiError n = error_of([] { common(R"({"n": 17})"); });
  CHECK(n.param == "n");
  CHECK(n.kind == ErrorKind::unsupported);
  CHECK_NOTHROW(common(R"({"n": 1})"));
  CHECK(error_of([] { common(R"({"stream_options": {"include_usage": true}})"); }).param == "stream_options");
  CHECK(error_of([] { common(R"({"stream": true, "stream_options": {"include_usage": 1}})"); }).param ==
        "stream_options.include_usage");
  CHECK(common(R"({"stream": true, "stream_options": {"include_usage": true}})").include_usage);
}

TEST_CASE("parse_common: stop strings and logit_bias", "[server]") {
  CHECK(common(R"({"stop": "END"})").stop == std::vector<std::string>{"END"});
  CHECK(common(R"({"stop": ["a", "bc"]})").stop == std::vector<std::string>{"a", "bc"});
  CHECK(common(R"({"stop": null})").stop.empty());
  CHECK(error_of([] { common(R"({"stop": ""})"); }).param == "stop");
  CHECK(error_of([] { common(R"({"stop": ["a", 3]})"); }).param == "stop[1]");
  CHECK(error_of([] { common(R"({"stop": 5})"); }).param == "stop");
  auto b = common(R"({"logit_bias": {"12": -100, "7": 2.5}})").sampling.logit_bias;
  REQUIRE(b.size() == 2);
  CHECK(((b[0].first == 12 && b[0].second == -100.0f) || (b[1].first == 12 && b[1].second == -100.0f)));
  CHECK(error_of([] { common(R"({"logit_bias": {"abc": 1}})"); }).param == "logit_bias");
  CHECK(error_of([] { common(R"({"logit_bias": {"5000": 1}})"); }).param == "logit_bias");
  CHECK(error_of([] { common(R"({"logit_bias": {"-1": 1}})"); }).param == "logit_bias");
  CHECK(error_of([] { common(R"({"logit_bias": {"3": 101}})"); }).param == "logit_bias");
  CHECK(error_of([] { common(R"({"logit_bias": [1]})"); }).param == "logit_bias");
}

TEST_CASE("unknown fields are listed, known ones are not; unsupported ones are refused", "[server]") {
  Json body = parse_body(R"({"model": "m", "temperature": 1, "mirostat": 2, "stream": true,
                            "stream_options": {"include_usage": true, "continuous_usage_stats": true}})");
  GenParams g;
  std::set<std::string> known;
  parse_common(body, g, 1000, -1, known);
  CHECK(unknown_fields(body, known) == "mirostat,stream_options.continuous_usage_stats");
}

TEST_CASE("the field table: refused fields are a 400 naming them unless inert; --ignore-unsupported-fields reports them", "[server]") {
  std::set<std::string> known;
  std::string ignored;
  auto check = [&](const char* body, Endpoint ep, bool ignore = false) {
    known.clear(), ignored.clear();
    check_table_fields(parse_body(body), ep, FieldPolicy{ignore}, known, ignored);
  };
  ApiError e = error_of([&] { check(R"({"suffix": "x"})", Endpoint::completions); });
  CHECK(e.kind == ErrorKind::unsupported);
  CHECK(e.param == "suffix");
  CHECK_NOTHROW(check(R"({"suffix": null, "best_of": 1, "mirostat": 0, "use_beam_search": false})", Endpoint::completions));
  CHECK(error_of([&] { check(R"({"mirostat": 2})", Endpoint::chat); }).param == "mirostat");
  CHECK(error_of([&] { check(R"({"dry_multiplier": 0.8})", Endpoint::chat); }).param == "dry_multiplier");
  CHECK(error_of([&] { check(R"({"best_of": 3})", Endpoint::completions); }).param == "best_of");
  CHECK(error_of([&] { check(R"({"functions": []})", Endpoint::chat); }).param == "functions");
  CHECK_NOTHROW(check(R"({"functions": []})", Endpoint::completions));  // not a completions field: unknown there
  CHECK(known.count("functions") == 0);
  CHECK_NOTHROW(check(R"({"metadata": {"a": "b"}, "store": true, "cache_prompt": true, "priority": 3})", Endpoint::chat));
  CHECK(known.count("metadata") == 1);
  CHECK_NOTHROW(check(R"({"mirostat": 2, "grammar": "root ::= x"})", Endpoint::chat, true));
  CHECK(ignored == "grammar,mirostat");
  for (const std::string& f : table_field_names(Endpoint::chat, true)) {
    Json body = Json::object();
    body[f] = "surely not inert";
    INFO(f);
    CHECK(error_of([&] { check(body.dump().c_str(), Endpoint::chat); }).param == f);
  }
}

TEST_CASE("parse_common: llama.cpp and vLLM extensions", "[server]") {
  auto g = common(R"({"n_predict": 7, "ignore_eos": true, "min_tokens": 3, "stop_token_ids": [5, 9],
                      "typical_p": 0.5, "xtc_probability": 0.3, "xtc_threshold": 0.2, "n": 3,
                      "include_stop_str_in_output": true, "allowed_token_ids": [1, 2]})");
  CHECK(g.max_tokens == 7);
  CHECK(g.ignore_eos);
  CHECK(g.min_tokens == 3);
  CHECK(g.stop_token_ids == std::vector<int32_t>{5, 9});
  CHECK(g.sampling.typical_p == 0.5f);
  CHECK(g.sampling.xtc_probability == 0.3f);
  CHECK(g.sampling.xtc_threshold == 0.2f);
  CHECK(g.n == 3);
  CHECK(g.include_stop_str);
  CHECK(g.allowed_token_ids == std::vector<int32_t>{1, 2});
  CHECK(common(R"({"n_predict": -1})").max_tokens == -1);
  CHECK(common(R"({"n_cmpl": 2})").n == 2);
  CHECK(error_of([] { common(R"({"n_predict": 5, "max_tokens": 4})"); }).param == "n_predict");
  CHECK(error_of([] { common(R"({"n_predict": 0})"); }).kind == ErrorKind::unsupported);
  CHECK(error_of([] { common(R"({"stop_token_ids": [5000]})"); }).param == "stop_token_ids");
  CHECK(error_of([] { common(R"({"typical_p": 0})"); }).param == "typical_p");
  CHECK(error_of([] { common(R"({"n": 0})"); }).param == "n");
  CHECK(error_of([] { common(R"({"n": 17})"); }).kind == ErrorKind::unsupported);
  CHECK(error_of([] { common(R"({"allowed_token_ids": []})"); }).param == "allowed_token_ids");
  CHECK(error_of([] { common(R"({"truncation_side": "middle"})"); }).param == "truncation_side");
  GenParams t;
  t.truncate_prompt_tokens = 2;
  CHECK(truncated_prompt({1, 2, 3, 4}, t, 100) == std::vector<int32_t>{3, 4});
  t.truncate_left = false;
  CHECK(truncated_prompt({1, 2, 3, 4}, t, 100) == std::vector<int32_t>{1, 2});
}
