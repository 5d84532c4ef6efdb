// Tests of JSON constrained decoding (text/grammar.h, json_schema): random walks over the tiny vocabulary
// must produce compact JSON that validates against the schema, masks must equal a brute-force check of every
// token, known documents must be accepted and broken ones refused at the offending token, and schemas the
// grammar cannot honour must be rejected with GrammarError.
#include <catch2/catch.hpp>

#include <memory>
#include <random>
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

const std::vector<std::string> kJsonClosers = {"\"", "}", "]", "0", "null", "1", "\"\"", "true", ",", "{}"};

ojson J(const char* text) { return ojson::parse(text); }

// The schemas the walks cover, with what each exercises.
const std::vector<std::pair<const char*, const char*>> kSchemas = {
    {"person: required/optional, nested array",
     R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
        "tags":{"type":"array","items":{"type":"string"}}},"required":["name","age"]})"},
    {"nested objects, array bounds",
     R"({"type":"object","properties":{"points":{"type":"array","minItems":1,"maxItems":3,
        "items":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}},"required":["x","y"]}}},
        "required":["points"]})"},
    {"enum and const",
     R"({"type":"object","properties":{"color":{"enum":["red","green","blue"]},"k":{"const":42},
        "u":{"enum":["ä","日本",null,1.5]}},"required":["color","k","u"]})"},
    {"anyOf of scalars", R"({"anyOf":[{"type":"string","maxLength":5},{"type":"integer"},{"type":"null"}]})"},
    {"recursive $ref",
     R"({"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},
        "children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["value"]}},
        "$ref":"#/$defs/node"})"},
    {"additionalProperties schema",
     R"({"type":"object","properties":{"id":{"type":"integer"}},"additionalProperties":{"type":"boolean"}})"},
    {"string lengths", R"({"type":"object","properties":{"code":{"type":"string","minLength":3,"maxLength":6}},"required":["code"]})"},
    {"type array", R"({"type":["number","string","null"]})"},
    {"prefixItems, no more items", R"({"type":"array","prefixItems":[{"type":"boolean"},{"type":"number"}],"items":false})"},
    {"oneOf with merged siblings",
     R"({"type":"object","oneOf":[{"properties":{"a":{"type":"integer"}},"required":["a"]},
        {"properties":{"b":{"type":"string"}},"required":["b"]}]})"},
    {"allOf merge",
     R"({"allOf":[{"type":"object","properties":{"x":{"type":"number"}},"required":["x"]},
        {"properties":{"y":{"type":"boolean"}},"required":["y"]}]})"},
    {"pydantic style definitions",
     R"({"definitions":{"Item":{"title":"Item","type":"object","properties":{"sku":{"type":"string"},"qty":{"type":"integer"}},
        "required":["sku","qty"]}},"type":"object","properties":{"items":{"type":"array","items":{"$ref":"#/definitions/Item"}},
        "note":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null}},"required":["items"]})"},
    {"nullable and free values",
     R"({"type":"object","properties":{"n":{"type":"integer","nullable":true},"any":{},"arr":{"type":"array"}},
        "required":["n","any","arr"]})"},
    {"awkward names", R"({"type":"object","properties":{"a\"b":{"type":"boolean"},"ü":{"type":"null"},"":{"type":"integer"}},
        "required":["a\"b","ü",""]})"},
    {"minItems beyond prefix", R"({"type":"array","prefixItems":[{"const":"x"}],"items":{"type":"integer"},"minItems":3})"},
};

}  // namespace

TEST_CASE("json_object: random walks give compact JSON objects", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    auto g = TokenGrammar::json_schema(ojson(nullptr), vocab);
    const WalkResult r = random_walk(*g, enc, kJsonClosers, seed, 4000, /*prefix_free=*/true);
    INFO("seed " << seed << ": " << show(r.text));
    REQUIRE(r.completed);
    const ojson v = ojson::parse(r.text);
    CHECK(v.is_object());
    CHECK(compact_json(r.text));
  }
  // {} means the same
  auto g = TokenGrammar::json_schema(ojson::object(), vocab);
  CHECK(feed(*g, enc("[1]")) == 0);
}

TEST_CASE("json_schema: random walks validate against the schema", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  for (const auto& [what, text] : kSchemas) {
    const ojson schema = J(text);
    for (uint64_t seed = 1; seed <= 25; ++seed) {
      auto g = TokenGrammar::json_schema(schema, vocab);
      const WalkResult r = random_walk(*g, enc, kJsonClosers, seed * 7919, 4000, /*prefix_free=*/false);
      INFO(what << ", seed " << seed << ": " << show(r.text));
      REQUIRE(r.completed);
      ojson v;
      REQUIRE_NOTHROW(v = ojson::parse(r.text));
      CHECK(validate(v, schema, schema) == "");
      CHECK(compact_json(r.text));
    }
  }
}

TEST_CASE("json_schema with reasoning: free text up to </think>, then the JSON", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  const ojson schema = J(kSchemas[0].second);
  std::vector<std::string> closers = kJsonClosers;
  closers.push_back("</think>\n\n");
  for (uint64_t seed = 1; seed <= 15; ++seed) {
    auto g = TokenGrammar::json_schema(schema, vocab, /*thinking=*/true);
    const WalkResult r = random_walk(*g, [](const std::string& s) { return tiny_tokenizer().encode(s, true); },
                                     closers, seed, 4000, true);
    INFO(show(r.text));
    REQUIRE(r.completed);
    const ParsedOutput out = parse_output(r.text, nullptr, true, "call_");
    CHECK(validate(ojson::parse(out.content), schema, schema) == "");
    CHECK(r.text.find("</think>\n\n{") != std::string::npos);
  }
  auto g = TokenGrammar::json_schema(schema, vocab, true);
  const auto ids = enc("Let me answer {\"x\"}.\n</think>\n\n{\"name\":\"a\",\"age\":1}");
  CHECK(feed(*g, ids) == ids.size());
  CHECK(g->complete());
  auto h = TokenGrammar::json_schema(schema, vocab, true);
  const auto bad = enc("</think>\n{");
  CHECK(feed(*h, bad) == token_at_byte(*vocab, bad, 9));
}

namespace {

// A random schema of the supported subset (depth-limited).
ojson random_schema(std::mt19937_64& rng, int depth) {
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const char* names[] = {"a", "b", "id", "idx", "name", "x y", "\xc3\xa9", "q\"uote"};
  const size_t kind = depth >= 3 ? 2 + pick(6) : pick(10);
  ojson s = ojson::object();
  switch (kind) {
    case 0: {
      s["type"] = "object";
      ojson props = ojson::object(), req = ojson::array();
      for (size_t i = 0, n = pick(4); i < n; ++i) {
        const std::string k = names[pick(8)];
        props[k] = random_schema(rng, depth + 1);
        if (pick(2)) req.push_back(k);
      }
      if (!props.empty() || pick(2)) s["properties"] = props;
      if (!req.empty()) s["required"] = req;
      switch (pick(4)) {
        case 0: s["additionalProperties"] = false; break;
        case 1: s["additionalProperties"] = true; break;
        case 2: s["additionalProperties"] = random_schema(rng, depth + 1); break;
        default: break;
      }
      break;
    }
    case 1:
      s["type"] = "array";
      if (pick(3)) s["items"] = random_schema(rng, depth + 1);
      if (pick(2)) s["minItems"] = pick(3);
      if (pick(2)) s["maxItems"] = 1 + pick(4);
      if (pick(4) == 0) s["prefixItems"] = ojson::array({random_schema(rng, depth + 1)});
      break;
    case 2:
      s["type"] = "string";
      if (pick(2)) s["minLength"] = pick(3);
      if (pick(2)) s["maxLength"] = 1 + pick(8);
      break;
    case 3: s["type"] = pick(2) ? "integer" : "number"; break;
    case 4: s["type"] = pick(2) ? "boolean" : "null"; break;
    case 5: s["enum"] = ojson::array({"x", 1, nullptr, ojson::array({1}), ojson{{"k", "v"}}, 2.5, "\u65e5"}); break;
    case 6: s["const"] = ojson{{"c", ojson::array({true, "s"})}}; break;
    case 7: s["type"] = ojson::array({"string", "integer", "null"}); break;
    case 8: s["anyOf"] = ojson::array({random_schema(rng, depth + 1), random_schema(rng, depth + 1)}); break;
    default: s = random_schema(rng, depth + 1); s["nullable"] = true; break;
  }
  return s;
}

}  // namespace

TEST_CASE("json_schema: random schemas compile (or are refused cleanly) and their walks validate", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  std::mt19937_64 rng(77);
  int compiled = 0;
  for (int i = 0; i < 300; ++i) {
    const ojson schema = random_schema(rng, 0);
    INFO("schema " << schema.dump());
    std::unique_ptr<TokenGrammar> probe;
    try {
      probe = TokenGrammar::json_schema(schema, vocab);
    } catch (const GrammarError&) {
      continue;
    }
    ++compiled;
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      auto g = TokenGrammar::json_schema(schema, vocab);
      const WalkResult r = random_walk(*g, enc, kJsonClosers, seed + 1000 * static_cast<uint64_t>(i), 3000, false);
      INFO("seed " << seed << ": " << show(r.text));
      REQUIRE(r.completed);
      ojson v;
      REQUIRE_NOTHROW(v = ojson::parse(r.text));
      // Plain JSON Schema semantics (absent additionalProperties allows extras); the grammar is stricter.
      CHECK(validate(v, schema, schema, "$", false) == "");
      CHECK(compact_json(r.text));
    }
  }
  CHECK(compiled > 250);
}

TEST_CASE("json_schema: the mask equals a token-by-token brute force", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  for (size_t si : {0, 3, 5, 6, 13}) {
    const ojson schema = J(kSchemas[si].second);
    auto g = TokenGrammar::json_schema(schema, vocab);
    const WalkResult r = random_walk(*g, enc, kJsonClosers, 1234 + si, 4000, false);
    REQUIRE(r.completed);
    // Replay the walk; at every step compare the mask with accepts() of every id (a byte-by-byte run of
    // the token, not the trie walk or the cached lexeme sets), and at a few steps with a fresh grammar.
    auto h = TokenGrammar::json_schema(schema, vocab);
    for (size_t step = 0; step <= r.ids.size(); ++step) {
      const std::vector<int32_t> fast = allowed_ids(*h);
      std::vector<int32_t> brute;
      for (int32_t id = 0; id < vocab->size(); ++id)
        if (h->accepts(id)) brute.push_back(id);
      INFO(kSchemas[si].first << " after " << step << " tokens: " << show(r.text));
      REQUIRE(fast == brute);
      if (step % 16 == 3) {
        std::vector<int32_t> fresh;
        for (int32_t id = 0; id < vocab->size(); ++id) {
          auto probe = TokenGrammar::json_schema(schema, vocab);
          for (size_t k = 0; k < step; ++k) probe->accept(r.ids[k]);
          try {
            probe->accept(id);
            fresh.push_back(id);
          } catch (const GrammarError&) {
          }
        }
        REQUIRE(fast == fresh);
      }
      if (step < r.ids.size()) h->accept(r.ids[step]);
    }
  }
}

TEST_CASE("json_schema: valid documents are accepted token by token", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  const std::vector<std::pair<size_t, std::string>> docs = {
      {0, R"({"name":"Bob","age":42})"},
      {0, R"({"name": "Bob", "age": -7, "tags": ["a", "b\n\"c\"", "\u00e9\ud83d\ude00"]})"},
      {0, "{\n\"name\"\n:\n\"x\"\n,\n\"age\"\n:\n0\n}"},
      {1, R"({"points":[{"x":1.5e3,"y":-0.25},{"x":0,"y":1E-2}]})"},
      {2, R"({"color":"green","k":42,"u":"日本"})"},
      {2, R"({"color":"red","k":42,"u":null})"},
      {3, R"("abcde")"},
      {3, R"(123)"},
      {3, R"(null)"},
      {4, R"({"value":1,"children":[{"value":2},{"value":3,"children":[]}]})"},
      {5, R"({"id":7,"idx":true,"x":false})"},
      {5, R"({"i":true})"},
      {5, R"({})"},
      {6, R"({"code":"日本語"})"},
      {7, R"(-12.5)"},
      {8, R"([true,3])"},
      {8, R"([])"},
      {9, R"({"b":"x"})"},
      {10, R"({"x":1,"y":false})"},
      {11, R"({"items":[{"sku":"A-1","qty":2}],"note":null})"},
      {12, R"({"n":null,"any":{"q":[1,{"r":"s"}]},"arr":[1,"2",null]})"},
      {13, R"({"a\"b":true,"ü":null,"":5})"},
      {14, R"(["x",1,2,3])"},
  };
  for (const auto& [si, doc] : docs) {
    INFO(kSchemas[si].first << ": " << doc);
    const ojson schema = J(kSchemas[si].second);
    REQUIRE(validate(ojson::parse(doc), schema, schema) == "");  // the test's own claim
    auto g = TokenGrammar::json_schema(schema, vocab);
    const auto ids = enc(doc);
    REQUIRE(feed(*g, ids) == ids.size());
    REQUIRE(g->complete());
    g->accept(vocab->eog_ids().front());
    CHECK(g->finished());
    CHECK(allowed_ids(*g) == vocab->eog_ids());
  }
}

TEST_CASE("json_schema: broken documents are refused at the offending token", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  struct Case {
    size_t schema;
    std::string doc;
    std::string bad;  // the offending bytes start at the first occurrence of this
  };
  const std::vector<Case> cases = {
      {0, R"({"name":"Bob","age":"x"})", "\"x"},
      {0, R"({"age":3,"name":"a"})", "age"},
      {0, R"({"name":"Bob"})", "}"},
      {0, R"({"name":"x","age":01})", "1}"},
      {0, R"({"name":"x","age":1.5})", ".5"},
      {0, R"({"name":  "x","age":1})", " \"x"},
      {0, "{\"name\":\"a\tb\",\"age\":1}", "\tb"},
      {0, R"({"name":"a\xb","age":1})", "xb"},
      {0, R"({"name":"\udc00","age":1})", "c00"},
      {0, R"({"name":"\ud800x","age":1})", "x\""},
      {0, R"({"name":"x","age":1,"tags":[],"more":1})", ",\"more"},
      {0, R"({"name":"x","age":12345678901234567})", "7}"},
      {0, R"( {"name":"x","age":1})", " {"},
      {2, R"({"color":"purple","k":42,"u":null})", "purple"},
      {2, R"({"color":"red","k":43,"u":null})", "3,"},
      {4, R"({"value":1,"children":[{"value":2},{"value":3},{"value":4}]})", ",{\"value\":4"},
      {5, R"({"id":true})", "true"},
      {5, R"({"id":1,"id":true})", "\":true"},
      {6, R"({"code":"ab"})", "\"}"},
      {6, R"({"code":"abcdefg"})", "g\""},
      {8, R"([true,3,4])", ",4"},
      {8, R"([3])", "3]"},
      {10, R"({"x":1})", "}"},
      {14, R"(["x",1])", "]"},
      {3, R"(123456)", ""},  // complete: nothing refused (control case for the helper)
  };
  for (const Case& c : cases) {
    INFO(kSchemas[c.schema].first << ": " << c.doc);
    const ojson schema = J(kSchemas[c.schema].second);
    auto g = TokenGrammar::json_schema(schema, vocab);
    const auto ids = enc(c.doc);
    const size_t refused = feed(*g, ids);
    if (c.bad.empty()) {
      CHECK(refused == ids.size());
      continue;
    }
    const size_t at = c.doc.find(c.bad);
    REQUIRE(at != std::string::npos);
    CHECK(refused == token_at_byte(*vocab, ids, at));
    // The refused token left the state unchanged: the mask still excludes it and the prefix goes on.
    if (refused < ids.size()) {
      std::vector<bool> mask;
      g->allowed(mask);
      CHECK_FALSE(mask[static_cast<size_t>(ids[refused])]);
    }
  }
}

TEST_CASE("json_schema: invalid UTF-8 bytes are refused inside strings", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  auto byte_token = [&](unsigned char b) {
    for (int32_t id = 0; id < vocab->size(); ++id)
      if (vocab->is_text(id) && vocab->bytes(id) == std::string(1, static_cast<char>(b))) return id;
    FAIL("no single-byte token for " << int(b));
    return -1;
  };
  const ojson schema = J(R"({"type":"string"})");
  for (const std::vector<unsigned char>& bad : std::vector<std::vector<unsigned char>>{
           {0xC3, 0x28}, {0xC0}, {0xF5}, {0xE0, 0x80}, {0xED, 0xA0}, {0xF4, 0x90}, {0x80}}) {
    auto g = TokenGrammar::json_schema(schema, vocab);
    g->accept(byte_token('"'));
    for (size_t i = 0; i + 1 < bad.size(); ++i) g->accept(byte_token(bad[i]));
    CHECK_THROWS_AS(g->accept(byte_token(bad.back())), GrammarError);
  }
  auto g = TokenGrammar::json_schema(schema, vocab);
  for (unsigned b : {0x22u, 0xF0u, 0x9Fu, 0x98u, 0x80u, 0x22u}) g->accept(byte_token(static_cast<unsigned char>(b)));
  CHECK(g->complete());
}

TEST_CASE("json_schema: schemas that cannot be honoured are rejected", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  for (const char* bad : {
           R"({"not":{"type":"string"}})",
           R"({"if":{"type":"string"},"then":{"maxLength":3}})",
           R"({"$ref":"https://example.com/schema.json"})",
           R"({"$ref":"#/$defs/missing"})",
           R"({"type":"text"})",
           R"({"type":"string","minLength":5,"maxLength":2})",
           R"({"type":"array","minItems":3,"maxItems":1})",
           R"({"type":"array","maxItems":100000})",
           R"({"enum":[]})",
           R"({"type":"object","properties":{"a":false},"required":["a"]})",
           R"({"type":"object","properties":{"a":{"enum":[]}},"required":["a"]})",
           R"({"type":"object","required":["z"],"additionalProperties":false})",
           R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})",
           R"({"anyOf":[{"$ref":"#"},{"$ref":"#"}]})",
           R"({"type":"string","minLength":-1})",
           R"({"type":"string","enum":[1,2]})",
           R"(false)",
           R"(7)",
       }) {
    INFO(bad);
    CHECK_THROWS_AS(TokenGrammar::json_schema(J(bad), vocab), GrammarError);
  }
  // nlohmann::json (sorted keys) is accepted too; members then come in alphabetical order.
  auto g = TokenGrammar::json_schema(nlohmann::json::parse(R"({"type":"object","properties":{"b":{"type":"integer"},
      "a":{"type":"integer"}},"required":["a","b"]})"), tiny_tokenizer());
  const auto ids = enc(R"({"a":1,"b":2})");
  CHECK(feed(*g, ids) == ids.size());
  CHECK(g->complete());
}

TEST_CASE("json_schema: misuse of accept is an error, not a crash", "[text][fixtures]") {
  const auto vocab = tiny_vocab();
  auto g = TokenGrammar::json_schema(J(R"({"type":"boolean"})"), vocab);
  CHECK_THROWS_AS(g->accept(-1), GrammarError);
  CHECK_THROWS_AS(g->accept(vocab->size()), GrammarError);
  CHECK_THROWS_AS(g->accept(vocab->eog_ids().front()), GrammarError);  // not complete yet
  const auto im_start = tiny_tokenizer().find_token("<|im_start|>");
  REQUIRE(im_start);
  CHECK_THROWS_AS(g->accept(*im_start), GrammarError);  // control token
  const auto ids = enc("true");
  REQUIRE(feed(*g, ids) == ids.size());
  const auto more = enc("e");
  CHECK_THROWS_AS(g->accept(more.front()), GrammarError);
  g->accept(vocab->eog_ids().back());
  CHECK_THROWS_AS(g->accept(vocab->eog_ids().back()), GrammarError);  // after the end
}
