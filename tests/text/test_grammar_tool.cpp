// Tests of tool-call constrained decoding (text/grammar.h, tool_call): random walks over the tiny vocabulary
// must give Qwen3.5 XML tool calls that text/output_parser.h reads back as calls of a known tool with the
// required arguments, each valid for its parameter schema; masks must equal a token-by-token check; known
// outputs are accepted and broken ones refused at the offending token.
#include <catch2/catch.hpp>

#include <set>
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

// Special tokens written in the text (<tool_call>, </think>) become their single ids, as a model emits them.
std::vector<int32_t> enc(const std::string& s) { return tiny_tokenizer().encode(s, true); }
std::vector<int32_t> enc_plain(const std::string& s) { return tiny_tokenizer().encode(s, false); }

const std::vector<std::string> kToolClosers = {"\n</parameter>\n", "</function>\n</tool_call>", "</think>\n\n",
                                               "\"",  "}", "]", "0", "True", "<parameter=", "\n<tool_call>\n<function=now>\n"};

const ojson kTools = ojson::parse(R"([
  {"type":"function","function":{"name":"get_weather","description":"weather","parameters":{"type":"object",
    "properties":{"location":{"type":"string","description":"city"},
                  "unit":{"type":"string","enum":["celsius","fahrenheit"]},
                  "days":{"type":"integer"}},
    "required":["location"]}}},
  {"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{
    "query":{"type":"string","minLength":2,"maxLength":40},
    "filters":{"type":"object","properties":{"lang":{"type":"string"},"safe":{"type":"boolean"}},"required":["lang"]},
    "limit":{"type":["integer","null"]},
    "exact":{"type":"boolean"},
    "tags":{"type":"array","items":{"type":"string"}},
    "note":{"type":["string","null"]}},
    "required":["query","exact"]}}},
  {"type":"function","function":{"name":"now"}},
  {"function":{"name":"set_mode","parameters":{"type":"object","properties":{"mode":{"const":"fast"},
    "level":{"anyOf":[{"type":"integer"},{"type":"number"}]}},"required":["mode","level"]}}}
])");

const ojson* find_tool(const ojson& tools, const std::string& name) {
  for (const ojson& t : tools)
    if (t["function"]["name"] == name) return &t["function"];
  return nullptr;
}

// Parses `text` back with the output parser; checks it is nothing but calls of known tools with valid
// arguments. Returns the calls.
std::vector<ToolCall> check_calls(const std::string& text, const ojson& tools, bool thinking, bool parallel,
                                  const std::optional<std::string>& forced = std::nullopt) {
  INFO("output: " << show(text));
  const ParsedOutput out = parse_output(text, nlohmann::json(tools), thinking, "call_");
  CHECK(out.content == "");
  REQUIRE(!out.tool_calls.empty());
  if (!parallel) CHECK(out.tool_calls.size() == 1);
  for (const ToolCall& c : out.tool_calls) {
    const ojson* fn = find_tool(tools, c.name);
    REQUIRE(fn);
    if (forced) CHECK(c.name == *forced);
    const ojson args = ojson::parse(c.arguments);
    REQUIRE(args.is_object());
    const ojson params = fn->value("parameters", ojson::object());
    const ojson props = params.value("properties", ojson::object());
    for (const ojson& r : params.value("required", ojson::array())) CHECK(args.contains(r.get<std::string>()));
    for (const auto& [k, v] : args.items()) {
      INFO("argument " << k << " = " << v.dump());
      REQUIRE(props.contains(k));
      CHECK(validate(v, props[k], params) == "");
    }
  }
  return out.tool_calls;
}

}  // namespace

TEST_CASE("tool_call: random walks give calls the output parser reads back", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  for (bool thinking : {false, true})
    for (bool parallel : {false, true})
      for (uint64_t seed = 1; seed <= 20; ++seed) {
        auto g = TokenGrammar::tool_call(kTools, std::nullopt, parallel, thinking, vocab);
        const WalkResult r = random_walk(*g, enc, kToolClosers, seed * 31 + thinking * 7 + parallel, 6000,
                                         /*prefix_free=*/!parallel);
        INFO("thinking " << thinking << " parallel " << parallel << " seed " << seed << ": " << show(r.text));
        REQUIRE(r.completed);
        check_calls(r.text, kTools, thinking, parallel);
      }
}

TEST_CASE("tool_call: a forced function is the only one called", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  for (const char* name : {"search", "now", "set_mode", "get_weather"})
    for (uint64_t seed = 1; seed <= 8; ++seed) {
      auto g = TokenGrammar::tool_call(kTools, std::string(name), false, seed % 2 == 0, vocab);
      const WalkResult r = random_walk(*g, enc, kToolClosers, seed, 6000, true);
      REQUIRE(r.completed);
      check_calls(r.text, kTools, seed % 2 == 0, false, std::string(name));
    }
}

TEST_CASE("tool_call: the mask equals a token-by-token check", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  for (bool thinking : {false, true}) {
    auto g = TokenGrammar::tool_call(kTools, std::nullopt, true, thinking, vocab);
    const WalkResult r = random_walk(*g, enc, kToolClosers, 99 + thinking, 6000, false);
    REQUIRE(r.completed);
    auto h = TokenGrammar::tool_call(kTools, std::nullopt, true, thinking, vocab);
    for (size_t step = 0; step <= r.ids.size(); ++step) {
      const std::vector<int32_t> fast = allowed_ids(*h);
      std::vector<int32_t> brute;
      for (int32_t id = 0; id < vocab->size(); ++id)
        if (h->accepts(id)) brute.push_back(id);
      INFO("after " << step << " tokens of " << show(r.text));
      REQUIRE(fast == brute);
      if (step < r.ids.size()) h->accept(r.ids[step]);
    }
  }
}

TEST_CASE("tool_call: near a length limit the mask still equals a token-by-token check", "[text][fixtures]") {
  // query has maxLength 40: the exit "\n</parameter>" must stay possible, and its characters must not count.
  const auto vocab = tiny_vocab();
  for (size_t len : {0, 1, 2, 30, 38, 39, 40}) {
    const std::string text = "<tool_call>\n<function=search>\n<parameter=query>\n" + std::string(len, 'q') +
                             "\n</parameter>\n<parameter=exact>\nfalse\n</parameter>\n</function>\n</tool_call>";
    auto g = TokenGrammar::tool_call(kTools, std::nullopt, false, false, vocab);
    const auto ids = enc_plain(text);
    for (size_t i = 0; i <= ids.size(); ++i) {
      const std::vector<int32_t> fast = allowed_ids(*g);
      std::vector<int32_t> brute;
      for (int32_t id = 0; id < vocab->size(); ++id)
        if (g->accepts(id)) brute.push_back(id);
      INFO("query of " << len << " chars, after " << i << " tokens");
      REQUIRE(fast == brute);
      if (i == ids.size()) break;
      if (len < 2 && !g->accepts(ids[i])) break;  // minLength 2: refused at the end of the exit (checked below)
      g->accept(ids[i]);
    }
    CHECK(g->complete() == (len >= 2));
  }
}

TEST_CASE("tool_call: known outputs are accepted, with special or plain tokens", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  struct Case {
    bool thinking, parallel;
    std::string text;
  };
  const std::string weather =
      "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis, France\n</parameter>\n"
      "<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>";
  const std::vector<Case> cases = {
      {false, false, weather},
      {false, false,
       "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n<parameter=location>\n"
       "line one\n</paramet\n<b>x</b> <tool_call> & </think>\n\n</parameter>\n</function>\n</tool_call>"},
      {false, false, "<tool_call>\n<function=get_weather>\n<parameter=location>\n\n</parameter>\n</function>\n</tool_call>"},
      {true, false, "I should check the time.\n</think>\n\n<tool_call>\n<function=now>\n</function>\n</tool_call>"},
      {true, false, "</think>\n\n<tool_call>\n<function=now>\n</function>\n</tool_call>"},
      {false, true, weather + "\n" + weather},
      {false, false,
       "<tool_call>\n<function=search>\n<parameter=exact>\nTrue\n</parameter>\n<parameter=filters>\n"
       "{\"lang\": \"en\", \"safe\": false}\n</parameter>\n<parameter=query>\nqrig engine\n</parameter>\n"
       "<parameter=limit>\nnull\n</parameter>\n<parameter=tags>\n[\"a\",\"b\"]\n</parameter>\n"
       "<parameter=note>\nnull\n</parameter>\n</function>\n</tool_call>"},
      {false, false,
       "<tool_call>\n<function=set_mode>\n<parameter=level>\n2.5\n</parameter>\n<parameter=mode>\nfast\n"
       "</parameter>\n</function>\n</tool_call>"},
  };
  for (const Case& c : cases) {
    for (auto* encode : {&enc, &enc_plain}) {
      INFO(show(c.text) << (encode == &enc ? " (special tokens)" : " (plain tokens)"));
      auto g = TokenGrammar::tool_call(kTools, std::nullopt, c.parallel, c.thinking, vocab);
      const auto ids = (*encode)(c.text);
      REQUIRE(feed(*g, ids) == ids.size());
      REQUIRE(g->complete());
    }
    check_calls(c.text, kTools, c.thinking, c.parallel);
  }
  // The values come back as written.
  const auto calls = check_calls(cases[1].text, kTools, false, false);
  CHECK(ojson::parse(calls[0].arguments) ==
        ojson::parse(R"({"days":3,"location":"line one\n</paramet\n<b>x</b> <tool_call> & </think>\n"})"));
}

TEST_CASE("tool_call: broken outputs are refused at the offending token", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  struct Case {
    bool thinking;
    std::optional<std::string> forced;
    std::string text;
    std::string marker;  // the offending byte is at the first occurrence of marker, plus delta
    size_t delta;
  };
  const std::string call = "<tool_call>\n<function=";
  const std::string loc = "<parameter=location>\nParis\n</parameter>\n";
  const std::vector<Case> cases = {
      {false, {}, call + "get_weather>\n</function>\n</tool_call>", "/function", 0},
      {false, {}, call + "get_time>\n</function>\n</tool_call>", "time", 0},
      {false, {}, call + "get_weather>\n" + loc + loc + "</function>\n</tool_call>", "location>\nParis\n</parameter>\n<parameter=location", 40},
      {false, {}, call + "get_weather>\n<parameter=location>\nab</function>x\n</parameter>\n", "</function>x", 10},
      {false, {}, call + "get_weather>\n<parameter=location>\nab<parameter=x\n</parameter>\n", "<parameter=x", 10},
      {false, {}, call + "get_weather>\n" + loc + "<parameter=unit>\nkelvin\n</parameter>\n", "kelvin", 0},
      {false, {}, call + "get_weather>\n" + loc + "<parameter=days>\nthree\n</parameter>\n", "three", 0},
      {false, {}, call + "get_weather>\n<parameter=location>\nParis</parameter>\n", "</parameter>", 11},
      {false, {}, call + "get_weather>\n" + loc + "<parameter=wind>\n1\n</parameter>\n", "wind", 0},
      {false, {}, "Sure! " + call + "now>\n</function>\n</tool_call>", "Sure", 0},
      {false, {}, call + "now>\n</function>\n</tool_call>\n", "</tool_call>\n", 12},
      {true, {}, "ok</think>\n<tool_call>", "<tool_call>", 0},
      {true, {}, "ok</think>\n\nmore", "more", 0},
      {false, {}, call + "search>\n<parameter=exact>\ntrue\n</parameter>\n<parameter=query>\na\n</parameter>\n", "a\n</parameter>", 13},
      {false, {}, call + "search>\n<parameter=exact>\nyes\n</parameter>\n", "yes", 0},
      {false, {}, call + "search>\n<parameter=query>\n" + std::string(40, 'q') + "Q\n</parameter>\n", "Q", 0},
      {false, {}, call + "search>\n<parameter=filters>\n{\"lang\":\"</tool_call>\"}\n</parameter>\n", "</tool_call>\"", 11},
      {false, {}, call + "set_mode>\n<parameter=mode>\nslow\n</parameter>\n", "slow", 0},
      {false, std::string("search"), call + "get_weather>\n", "get_weather", 0},
  };
  for (const Case& c : cases) {
    INFO(show(c.text));
    auto g = TokenGrammar::tool_call(kTools, c.forced, false, c.thinking, vocab);
    const auto ids = enc_plain(c.text);
    const size_t at = c.text.find(c.marker);
    REQUIRE(at != std::string::npos);
    CHECK(feed(*g, ids) == token_at_byte(*vocab, ids, at + c.delta));
  }
}

TEST_CASE("tool_call: more than 32 parameters keep the declared order", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  ojson props = ojson::object();
  for (int i = 0; i < 40; ++i) props["p" + std::to_string(i)] = ojson{{"type", i % 2 ? "integer" : "string"}};
  const ojson tools = ojson::array({{{"type", "function"},
                                     {"function", {{"name", "many"}, {"parameters", {{"type", "object"}, {"properties", props}, {"required", {"p0", "p5"}}}}}}}});
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    auto g = TokenGrammar::tool_call(tools, std::nullopt, false, false, vocab);
    const WalkResult r = random_walk(*g, enc, kToolClosers, seed, 8000, true);
    REQUIRE(r.completed);
    check_calls(r.text, tools, false, false);
  }
  auto g = TokenGrammar::tool_call(tools, std::nullopt, false, false, vocab);
  const std::string out_of_order =
      "<tool_call>\n<function=many>\n<parameter=p0>\nx\n</parameter>\n<parameter=p3>\n3\n</parameter>\n<parameter=p2>\n";
  const auto ids = enc_plain(out_of_order);
  CHECK(feed(*g, ids) == token_at_byte(*vocab, ids, out_of_order.rfind("p2") + 1));
}

TEST_CASE("tool_call: unusable tool sets are rejected", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  auto make = [&](const ojson& tools, std::optional<std::string> forced = std::nullopt) {
    return TokenGrammar::tool_call(tools, forced, false, false, vocab);
  };
  CHECK_THROWS_AS(make(ojson::array()), GrammarError);
  CHECK_THROWS_AS(make(ojson::object()), GrammarError);
  CHECK_THROWS_AS(make(ojson::parse(R"([{"type":"function"}])")), GrammarError);
  CHECK_THROWS_AS(make(ojson::parse(R"([{"type":"retrieval","function":{"name":"x"}}])")), GrammarError);
  CHECK_THROWS_AS(make(ojson::parse(R"([{"function":{"name":""}}])")), GrammarError);
  CHECK_THROWS_AS(make(ojson::parse(R"([{"function":{"name":"a","parameters":[1]}}])")), GrammarError);
  CHECK_THROWS_AS(make(kTools, std::string("missing")), GrammarError);
  CHECK_THROWS_AS(make(ojson::parse(R"([{"function":{"name":"a b>"}}])")), GrammarError);
  CHECK_THROWS_AS(make(ojson::parse(R"([{"function":{"name":"a","parameters":{"properties":{"x>y":{}},"required":["x>y"]}}}])")),
                  GrammarError);
  CHECK_THROWS_AS(make(ojson::parse(R"([{"function":{"name":"a","parameters":{"properties":{"x":{"type":"integer","not":{"const":1}}}}}}])")),
                  GrammarError);
  // An unusable optional parameter name is left out rather than failing the request.
  auto g = make(ojson::parse(R"([{"function":{"name":"a","parameters":{"properties":{"x>y":{},"z":{}}}}}])"));
  const auto ids = enc_plain("<tool_call>\n<function=a>\n<parameter=z>\n1\n</parameter>\n</function>\n</tool_call>");
  CHECK(feed(*g, ids) == ids.size());
  // nlohmann::json tools work the same through the Tokenizer overload.
  auto h = TokenGrammar::tool_call(nlohmann::json(kTools), std::string("now"), false, false, tiny_tokenizer());
  const auto now = enc("<tool_call>\n<function=now>\n</function>\n</tool_call>");
  CHECK(feed(*h, now) == now.size());
  CHECK(h->complete());
}
