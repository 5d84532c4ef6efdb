// Tests of the JSON-schema keywords beyond shapes (text/grammar_json.h, grammar_schema.h): strings under
// `pattern` / `format` (random walks decoded and checked with PCRE2; JSON escapes inside them; the mask equal
// to a token-by-token check), tool-call values under a pattern, enum/const filtered by their siblings, allOf
// and $ref siblings combined soundly, oneOf honoured only when exclusive, and every keyword that cannot be
// honoured refused by name with where it sits.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tests/text/grammar_test_util.h"
#include "tests/text/tokenizer_test_util.h"
#include "text/grammar.h"
#include "text/output_parser.h"

using namespace qrig::text;
using namespace qrig::text::testutil;

namespace {

std::shared_ptr<const TokenVocab> tiny_vocab() { return TokenVocab::of(tiny_tokenizer()); }
std::vector<int32_t> enc(const std::string& s) { return tiny_tokenizer().encode(s, false); }
ojson J(const char* text) { return ojson::parse(text); }

// PCRE2 search with ECMA-like settings (UTF, $ only at the end).
bool pcre_search(const std::string& pattern, const std::string& s) {
  int err;
  PCRE2_SIZE off;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &err, &off, nullptr);
  REQUIRE(code != nullptr);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md, nullptr);
  pcre2_match_data_free(md);
  pcre2_code_free(code);
  return rc >= 0;
}

std::string refusal(const ojson& schema) {
  try {
    (void)TokenGrammar::json_schema(schema, tiny_vocab());
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("pattern strings: random walks decode to matching strings", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  const std::vector<std::string> patterns = {
      "^[A-Z]{3}-\\d{4}$",
      "^(red|green|blue)$",
      "^[a\"\\\\\\n/]{1,6}$",  // quotes, backslashes, newlines, slashes: written as JSON escapes
      "ab",                     // a search: anything around "ab"
      "^\\w+@\\w+\\.(com|org)$",
      "^[^\\s]+$",
      "^é{2}日?$",
  };
  for (const std::string& p : patterns) {
    const ojson schema = {{"type", "object"}, {"properties", {{"s", {{"type", "string"}, {"pattern", p}}}}},
                          {"required", {"s"}}};
    for (uint64_t seed = 1; seed <= 15; ++seed) {
      auto g = TokenGrammar::json_schema(schema, vocab);
      const WalkResult r = random_walk(*g, enc, {"\"", "}", "com\"", "\"}", "ab\"", "@a.com\""}, seed * 977, 3000, true);
      INFO("pattern " << p << ": " << show(r.text));
      REQUIRE(r.completed);
      const ojson v = ojson::parse(r.text);
      CHECK(pcre_search(p, v["s"].get<std::string>()));
    }
  }
}

TEST_CASE("pattern strings: escapes are decoded before matching", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  const ojson schema = {{"type", "string"}, {"pattern", "^a\"b\\\\c\\nd/e\\u0001$"}};
  for (const std::string doc : {R"("a\"b\\c\nd/e\u0001")", R"("a\"b\\c\nd\/e\u0001")"}) {
    auto g = TokenGrammar::json_schema(schema, vocab);
    INFO(doc);
    CHECK(feed(*g, enc(doc)) == enc(doc).size());
    CHECK(g->complete());
  }
  for (const std::string doc : {R"("a\"b\\c\nd/e\u0002")", R"("a\"b\\c\rd/e\u0001")", R"("ab")"}) {
    auto g = TokenGrammar::json_schema(schema, vocab);
    INFO(doc);
    CHECK((feed(*g, enc(doc)) < enc(doc).size() || !g->complete()));
  }
  // \u escapes of non-control characters are not written under a pattern (documented)
  auto g = TokenGrammar::json_schema(ojson{{"type", "string"}, {"pattern", "^A$"}}, vocab);
  CHECK(feed(*g, enc(R"("\u0041")")) < enc(R"("\u0041")").size());
}

TEST_CASE("pattern strings: the mask equals a token-by-token check, lengths folded in", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  for (const char* text : {R"({"type":"string","pattern":"^[a-z\"]+$","minLength":2,"maxLength":5})",
                           R"({"type":"string","format":"date"})",
                           R"({"type":"string","format":"email","maxLength":12})"}) {
    const ojson schema = J(text);
    auto g = TokenGrammar::json_schema(schema, vocab);
    const WalkResult r = random_walk(*g, enc, {"\"", "a\"", "com\"", "@a.com\""}, 99, 3000, true);
    INFO(text << ": " << show(r.text));
    REQUIRE(r.completed);
    const std::string s = ojson::parse(r.text).get<std::string>();
    if (schema.contains("maxLength")) CHECK(utf8_chars(s) <= schema["maxLength"].get<size_t>());
    if (schema.contains("minLength")) CHECK(utf8_chars(s) >= schema["minLength"].get<size_t>());
    auto h = TokenGrammar::json_schema(schema, vocab);
    for (size_t step = 0; step <= r.ids.size(); ++step) {
      const std::vector<int32_t> fast = allowed_ids(*h);
      std::vector<int32_t> brute;
      for (int32_t id = 0; id < vocab->size(); ++id)
        if (h->accepts(id)) brute.push_back(id);
      REQUIRE(fast == brute);
      REQUIRE(!fast.empty());
      if (step < r.ids.size()) h->accept(r.ids[step]);
    }
  }
  // a pattern no string of the allowed lengths matches: no value
  CHECK(refusal(J(R"({"type":"string","pattern":"^a{10}$","maxLength":5})")).find("admits no value") != std::string::npos);
}

TEST_CASE("formats in schemas: random walks give valid values", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  const ojson schema = J(R"({"type":"object","properties":{"d":{"type":"string","format":"date"},
      "t":{"type":"string","format":"time"},"dt":{"type":"string","format":"date-time"},
      "u":{"type":"string","format":"uuid"},"e":{"type":"string","format":"email"},
      "ip":{"type":"string","format":"ipv4"}},"required":["d","t","dt","u","e","ip"]})");
  const std::vector<std::pair<std::string, std::string>> checks = {
      {"d", "^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])$"},
      {"t", "^([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d+)?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)$"},
      {"dt", "^\\d{4}-\\d\\d-\\d\\dT([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d"},
      {"u", "^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$"},
      {"e", "^[^@\\s]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)+$"},
      {"ip", "^(\\d{1,3}\\.){3}\\d{1,3}$"}};
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    auto g = TokenGrammar::json_schema(schema, vocab);
    const WalkResult r = random_walk(*g, enc, {"\"", "Z\"", "com\"", "1\"", "}", "@a.com\""}, seed * 13, 4000, true);
    INFO(show(r.text));
    REQUIRE(r.completed);
    const ojson v = ojson::parse(r.text);
    for (const auto& [k, re] : checks) {
      INFO(k << " = " << v[k]);
      CHECK(pcre_search(re, v[k].get<std::string>()));
    }
  }
}

TEST_CASE("tool calls: raw string parameters follow pattern, format and lengths", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  const ojson tools = J(R"([{"type":"function","function":{"name":"book","parameters":{"type":"object","properties":{
      "code":{"type":"string","pattern":"^[A-Z]{2}\\d{2,3}$"},
      "day":{"type":"string","format":"date"},
      "note":{"type":["string","null"],"pattern":"^[a-z ]*$","maxLength":8},
      "seats":{"type":"integer","minimum":1,"maximum":9}},"required":["code","day","note","seats"]}}}])");
  auto tok_enc = [](const std::string& s) { return tiny_tokenizer().encode(s, true); };
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    auto g = TokenGrammar::tool_call(tools, std::nullopt, false, false, vocab);
    const WalkResult r = random_walk(*g, tok_enc, {"\n</parameter>\n", "</function>\n</tool_call>", "1"}, seed * 7, 4000, true);
    INFO(show(r.text));
    REQUIRE(r.completed);
    const ParsedOutput out = parse_output(r.text, nlohmann::json::parse(tools.dump()), false, "call_");
    REQUIRE(out.tool_calls.size() == 1);
    const ojson args = ojson::parse(out.tool_calls[0].arguments);
    CHECK(pcre_search("^[A-Z]{2}\\d{2,3}$", args["code"].get<std::string>()));
    CHECK(pcre_search("^\\d{4}-\\d\\d-\\d\\d$", args["day"].get<std::string>()));
    if (!args["note"].is_null()) {
      CHECK(pcre_search("^[a-z ]*$", args["note"].get<std::string>()));
      CHECK(args["note"].get<std::string>().size() <= 8);
    }
    CHECK(args["seats"].get<int>() >= 1);
    CHECK(args["seats"].get<int>() <= 9);
  }
  // a required parameter that is not declared follows additionalProperties
  const ojson undeclared = J(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
      "properties":{},"required":["n"],"additionalProperties":{"type":"integer","minimum":1,"maximum":3}}}}])");
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    auto g = TokenGrammar::tool_call(undeclared, std::nullopt, false, false, vocab);
    const WalkResult r = random_walk(*g, tok_enc, {"\n</parameter>\n", "</function>\n</tool_call>", "1"}, seed, 3000, true);
    INFO(show(r.text));
    REQUIRE(r.completed);
    const ParsedOutput out = parse_output(r.text, nlohmann::json::parse(undeclared.dump()), false, "call_");
    REQUIRE(out.tool_calls.size() == 1);
    const ojson n = ojson::parse(out.tool_calls[0].arguments)["n"];
    CHECK((n == 1 || n == 2 || n == 3));
  }
  // a string-or-number parameter whose number side is constrained cannot be kept apart as raw text
  const ojson mixed = J(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{
      "x":{"type":["string","integer"],"maximum":5}}}}}])");
  CHECK_THROWS_WITH(TokenGrammar::tool_call(mixed, std::nullopt, false, false, vocab),
                    Catch::Contains("may be a string or a constrained other type"));
  const ojson extra = J(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","minProperties":1,
      "properties":{"x":{"type":"string"}}}}}])");
  CHECK_THROWS_WITH(TokenGrammar::tool_call(extra, std::nullopt, false, false, vocab), Catch::Contains("minProperties"));
  const ojson typo = J(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
      "properties":{"x":{"type":"string","maxLenght":3}}}}}])");
  CHECK_THROWS_WITH(TokenGrammar::tool_call(typo, std::nullopt, false, false, vocab), Catch::Contains("maxLenght"));
  const ojson unique = J(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
      "properties":{"x":{"type":"array","uniqueItems":true}}}}}])");
  CHECK_THROWS_WITH(TokenGrammar::tool_call(unique, std::nullopt, false, false, vocab), Catch::Contains("uniqueItems"));
}

TEST_CASE("enum and const: values that break a sibling keyword are dropped, anywhere", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  const ojson schema = J(R"({"type":"object","properties":{
      "n":{"type":"integer","enum":[1,7,50,2.5,"7"],"maximum":10},
      "s":{"enum":["ab","abcdef","x"],"maxLength":3,"pattern":"^a"},
      "deep":{"type":"array","items":{"enum":[{"k":[1,{"z":null}]},{"k":[]},true]},"minItems":1,"maxItems":3},
      "c":{"const":{"a":[1,2,{"b":"c"}]}}},"required":["n","s","deep","c"]})");
  std::set<std::string> seen_n;
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    auto g = TokenGrammar::json_schema(schema, vocab);
    const WalkResult r = random_walk(*g, enc, {"}", "]", "\""}, seed * 5, 3000, true);
    INFO(show(r.text));
    REQUIRE(r.completed);
    const ojson v = ojson::parse(r.text);
    seen_n.insert(v["n"].dump());
    CHECK((v["n"] == 1 || v["n"] == 7));
    CHECK(v["s"] == "ab");
    for (const ojson& e : v["deep"]) CHECK((e == J(R"({"k":[1,{"z":null}]})") || e == J(R"({"k":[]})") || e == true));
    CHECK(v["c"] == J(R"({"a":[1,2,{"b":"c"}]})"));
  }
  CHECK(seen_n.size() == 2);
  CHECK(refusal(J(R"({"enum":[20,30],"maximum":10})")).find("admits no value") != std::string::npos);
}

TEST_CASE("allOf and $ref siblings: every part holds", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  const ojson schema = J(R"({"$defs":{"pos":{"type":"integer","minimum":0}},"type":"object","properties":{
      "a":{"allOf":[{"type":"integer","maximum":5},{"maximum":10,"minimum":-3}]},
      "b":{"$ref":"#/$defs/pos","maximum":3},
      "c":{"allOf":[{"type":"string","pattern":"^[a-z]+$"},{"pattern":"x","maxLength":4}]},
      "d":{"allOf":[{"type":"object","properties":{"p":{"type":"integer"}},"additionalProperties":false},
                    {"properties":{"q":{"type":"integer"}}}]}},
      "required":["a","b","c","d"]})");
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    auto g = TokenGrammar::json_schema(schema, vocab);
    const WalkResult r = random_walk(*g, enc, {"}", "0", "x\"", "\""}, seed * 11, 3000, true);
    INFO(show(r.text));
    REQUIRE(r.completed);
    const ojson v = ojson::parse(r.text);
    CHECK(v["a"].get<int64_t>() <= 5);
    CHECK(v["a"].get<int64_t>() >= -3);
    CHECK(v["b"].get<int64_t>() >= 0);
    CHECK(v["b"].get<int64_t>() <= 3);
    const std::string c = v["c"].get<std::string>();
    CHECK(pcre_search("^[a-z]+$", c));
    CHECK(c.find('x') != std::string::npos);
    CHECK(c.size() <= 4);
    CHECK_FALSE(v["d"].contains("q"));  // the first branch forbids it
  }
  CHECK(refusal(J(R"({"allOf":[{"format":"date"},{"format":"email"}]})")).find("allOf combines different values of \"format\"") !=
        std::string::npos);
}

TEST_CASE("oneOf: honoured when the branches exclude each other, refused otherwise", "[text][fixtures]") {
  for (const char* ok : {
           R"({"oneOf":[{"type":"string"},{"type":"integer"},{"type":"null"}]})",
           R"({"oneOf":[{"type":"object","properties":{"kind":{"const":"cat"},"lives":{"type":"integer"}},"required":["kind"]},
                        {"type":"object","properties":{"kind":{"const":"dog"},"bark":{"type":"boolean"}},"required":["kind"]}]})",
           R"({"oneOf":[{"enum":[1,2]},{"enum":[3,4]}]})",
           R"({"type":"object","oneOf":[{"properties":{"a":{"type":"integer"}},"required":["a"]},
                                         {"properties":{"b":{"type":"string"}},"required":["b"]}]})",
       }) {
    INFO(ok);
    CHECK(refusal(J(ok)) == "");
  }
  for (const char* overlapping : {
           R"({"oneOf":[{"type":"integer"},{"type":"number"}]})",
           R"({"oneOf":[{"type":"string"},{"maxLength":3}]})",
           R"({"oneOf":[{"type":"object"},{"type":"object","properties":{"a":{}}}]})",
       }) {
    INFO(overlapping);
    CHECK(refusal(J(overlapping)).find("oneOf branches") != std::string::npos);
  }
}

TEST_CASE("keywords the grammar cannot honour are refused by name, with where they are", "[text][fixtures]") {
  const std::vector<std::pair<const char*, const char*>> refused = {
      {R"({"type":"array","uniqueItems":true})", "\"uniqueItems\""},
      {R"({"type":"object","minProperties":2})", "\"minProperties\""},
      {R"({"type":"object","maxProperties":2})", "\"maxProperties\""},
      {R"({"type":"object","patternProperties":{"^x":{}}})", "\"patternProperties\""},
      {R"({"type":"object","propertyNames":{"maxLength":3}})", "\"propertyNames\""},
      {R"({"type":"object","dependentRequired":{"a":["b"]}})", "\"dependentRequired\""},
      {R"({"type":"array","contains":{"type":"integer"}})", "\"contains\""},
      {R"({"type":"object","unevaluatedProperties":false})", "\"unevaluatedProperties\""},
      {R"({"not":{"type":"string"}})", "\"not\""},
      {R"({"type":"string","maxLenght":3})", "unknown schema keyword \"maxLenght\""},
      {R"({"type":"string","format":"uri"})", "format \"uri\" is not supported"},
      {R"X({"type":"string","pattern":"(?=a)"})X", "lookahead"},
      {R"({"type":"number","multipleOf":0.01})", "multipleOf 0.01"},
      {R"({"type":"object","properties":{"p":{"type":"array","items":{"type":"string","pattern":"\\1"}}}})",
       "at #/properties/p/items: pattern"},
      {R"({"$defs":{"x":{"type":"integer","dependencies":{}}},"type":"object","properties":{"r":{"$ref":"#/$defs/x"}}})",
       "at #/$defs/x: schema keyword \"dependencies\""},
      {R"({"$defs":{"x":{"type":"integer","dependencies":{}}},"type":"object","properties":{"a":{"type":"object",
          "properties":{"b":{"type":"array","items":{"$ref":"#/$defs/x"}}}}}})",
       "at #/$defs/x: schema keyword \"dependencies\""},
  };
  for (const auto& [schema, what] : refused) {
    INFO(schema);
    const std::string m = refusal(J(schema));
    INFO(m);
    CHECK(m.find(what) != std::string::npos);
  }
  // annotations and no-op values are fine
  CHECK(refusal(J(R"({"type":"array","uniqueItems":false,"title":"t","description":"d","x-vendor":1,"examples":[[]],
                     "$comment":"c","deprecated":false,"default":[]})")) == "");
}

TEST_CASE("pattern strings with length limits never reach a dead end", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  const std::vector<std::string> patterns = {"^[a-z]+$", "x", "^[^<>]*$", "^(ab)+$", "^a?b?c?d?$", "é", "^[0-9a-f]{2,}$",
                                             "^.{3}$", "q.*z"};
  const std::vector<std::pair<int, int>> limits = {{0, 1}, {1, 3}, {2, 2}, {3, 7}, {5, -1}, {0, 40}};
  for (const std::string& p : patterns)
    for (const auto& [lo, hi] : limits) {
      ojson schema = {{"type", "string"}, {"pattern", p}, {"minLength", lo}};
      if (hi >= 0) schema["maxLength"] = hi;
      std::unique_ptr<TokenGrammar> g0;
      try {
        g0 = TokenGrammar::json_schema(schema, vocab);
      } catch (const GrammarError& e) {
        INFO(schema.dump() << ": " << e.what());
        CHECK(std::string(e.what()).find("admits no value") != std::string::npos);
        continue;
      }
      for (uint64_t seed = 1; seed <= 6; ++seed) {
        auto g = TokenGrammar::json_schema(schema, vocab);
        const WalkResult r = random_walk(*g, enc, {"\"", "z\"", "ab\"", "x\"", "é\"", "q1z\""}, seed, 2000, true);
        INFO(schema.dump() << ": " << show(r.text));
        REQUIRE(r.completed);
        const std::string s = ojson::parse(r.text).get<std::string>();
        CHECK(pcre_search(p, s));
        CHECK(utf8_chars(s) >= static_cast<size_t>(lo));
        if (hi >= 0) CHECK(utf8_chars(s) <= static_cast<size_t>(hi));
      }
    }
}
