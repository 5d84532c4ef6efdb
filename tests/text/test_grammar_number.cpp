// Tests of the numeric-range automata (text/grammar_number.h) by brute force: every integer in a window
// around each bound (and around zero) is accepted exactly when a validator comparing doubles accepts it;
// every decimal with up to three fraction digits near the bounds likewise; long random decimals near a bound
// are accepted only when valid; non-canonical spellings never. Then random walks of whole schemas through
// TokenGrammar, and the refusals.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "tests/text/grammar_test_util.h"
#include "tests/text/tokenizer_test_util.h"
#include "text/grammar.h"
#include "text/grammar_number.h"

using namespace qrig::text;
using namespace qrig::text::grammar;
using namespace qrig::text::testutil;

namespace {

// What ajv checks, with the value and the bounds as doubles.
bool oracle(double x, const ojson& s, bool integer) {
  if (integer && std::floor(x) != x) return false;
  auto has = [&](const char* k) { return s.contains(k) && s[k].is_number(); };
  if (has("minimum") && !(s.value("exclusiveMinimum", ojson(false)) == true ? x > s["minimum"].get<double>() : x >= s["minimum"].get<double>()))
    return false;
  if (has("maximum") && !(s.value("exclusiveMaximum", ojson(false)) == true ? x < s["maximum"].get<double>() : x <= s["maximum"].get<double>()))
    return false;
  if (has("exclusiveMinimum") && !(x > s["exclusiveMinimum"].get<double>())) return false;
  if (has("exclusiveMaximum") && !(x < s["exclusiveMaximum"].get<double>())) return false;
  if (has("multipleOf") && std::fmod(x, s["multipleOf"].get<double>()) != 0) return false;
  return true;
}

std::vector<double> anchors(const ojson& s) {
  std::vector<double> a{0};
  for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
    if (s.contains(k) && s[k].is_number()) a.push_back(s[k].get<double>());
  return a;
}

}  // namespace

TEST_CASE("integer ranges: every integer near the bounds is accepted iff in range", "[text]") {
  const std::vector<const char*> schemas = {
      R"({"maximum":5})",
      R"({"minimum":0,"maximum":100})",
      R"({"minimum":-17,"maximum":-3})",
      R"({"minimum":-250,"maximum":1234})",
      R"({"exclusiveMinimum":0,"exclusiveMaximum":10})",
      R"({"minimum":1.5,"maximum":7.2})",
      R"({"exclusiveMinimum":-2.5,"maximum":99.99})",
      R"({"minimum":10,"exclusiveMinimum":true,"maximum":20,"exclusiveMaximum":true})",
      R"({"minimum":-1000000,"maximum":999999})",
      R"({"minimum":99999,"maximum":100001})",
      R"({"multipleOf":7})",
      R"({"minimum":-50,"maximum":50,"multipleOf":3})",
      R"({"minimum":1,"multipleOf":25})",
      R"({"exclusiveMaximum":-9,"multipleOf":4})",
      R"({"minimum":9999999999999990})",
      R"({"maximum":-9999999999999990})",
      R"({"minimum":5,"maximum":4})",
  };
  for (const char* text : schemas) {
    const ojson s = ojson::parse(text);
    INFO(text);
    const ByteDfa d = *number_dfa(s, true);
    size_t in = 0;
    for (double a : anchors(s))
      for (int64_t x = static_cast<int64_t>(a) - 130; x <= static_cast<int64_t>(a) + 130; ++x) {
        if (std::llabs(x) > 9999999999999999) continue;
        INFO(x);
        const bool want = oracle(static_cast<double>(x), s, true);
        REQUIRE(d.matches(std::to_string(x)) == want);
        in += want;
      }
    if (std::string(text) != R"({"minimum":5,"maximum":4})") CHECK(in > 0);
    for (const char* bad : {"-0", "00", "01", "+1", "1.0", "1e2", "", "-", " 1", "1 "}) CHECK_FALSE(d.matches(bad));
  }
}

TEST_CASE("number ranges: decimals near the bounds are accepted iff a double validator accepts them", "[text]") {
  const std::vector<const char*> schemas = {
      R"({"minimum":0.1,"maximum":0.3})",
      R"({"minimum":-2.5,"maximum":2.5})",
      R"({"exclusiveMinimum":0,"exclusiveMaximum":1})",
      R"({"minimum":-1.125,"exclusiveMaximum":-0.001})",
      R"({"maximum":5})",
      R"({"minimum":100.25})",
      R"({"exclusiveMinimum":-0.7,"maximum":0})",
      R"({"minimum":3.14159,"maximum":3.15})",
      R"({"minimum":0,"maximum":0})",
  };
  std::mt19937_64 rng(3);
  for (const char* text : schemas) {
    const ojson s = ojson::parse(text);
    INFO(text);
    const ByteDfa d = *number_dfa(s, false);
    size_t in = 0;
    for (double a : anchors(s)) {
      const auto base = static_cast<int64_t>(std::llround(a * 1000));
      for (int64_t k = base - 2500; k <= base + 2500; ++k) {
        // k/1000 written with 0 to 3 fraction digits where exact, e.g. 1.5 as "1.5", "1.50", "1.500"
        const int64_t mag = std::llabs(k);
        const std::string sign = k < 0 ? "-" : "";
        const std::string ip = std::to_string(mag / 1000);
        char frac[8];
        std::snprintf(frac, sizeof frac, "%03lld", static_cast<long long>(mag % 1000));
        std::vector<std::string> forms{sign + ip + "." + frac};
        if (mag % 10 == 0) forms.push_back(sign + ip + "." + std::string(frac, 2));
        if (mag % 100 == 0) forms.push_back(sign + ip + "." + std::string(frac, 1));
        if (mag % 1000 == 0) forms.push_back(sign + ip);
        for (const std::string& f : forms) {
          if (f == "-0" || f == "-0.0" || f == "-0.00" || f == "-0.000") {
            CHECK_FALSE(d.matches(f));
            continue;
          }
          INFO(f);
          const bool want = oracle(std::strtod(f.c_str(), nullptr), s, false);
          REQUIRE(d.matches(f) == want);
          in += want;
        }
      }
      // long decimals right at the bound: never accepted unless valid
      for (int i = 0; i < 3000; ++i) {
        char buf[64];
        const double x = a + (static_cast<double>(rng() % 2001) - 1000) * 1e-15;
        std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(rng() % 17), x);
        std::string f = buf;
        if (f.find_first_not_of("-0.") == std::string::npos) continue;
        INFO(f);
        if (d.matches(f)) REQUIRE(oracle(std::strtod(f.c_str(), nullptr), s, false));
      }
    }
    CHECK(in > 0);
    for (const char* bad : {"-0", "00.5", "1.", ".5", "+1", "1e2", "1E-2", ""}) CHECK_FALSE(d.matches(bad));
  }
}

TEST_CASE("numeric keywords: what is refused and why", "[text]") {
  auto refused = [](const char* text, const char* what) {
    INFO(text);
    try {
      (void)number_dfa(ojson::parse(text), false);
      FAIL("accepted");
    } catch (const GrammarError& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(what) != std::string::npos);
    }
  };
  refused(R"({"multipleOf":0.01})", "multipleOf 0.01 is not supported");
  refused(R"({"multipleOf":5000})", "at most 1000");
  refused(R"({"multipleOf":0})", "multipleOf must be a number > 0");
  refused(R"({"minimum":"5"})", "minimum must be a number");
  refused(R"({"maximum":9007199254740993})", "not exactly representable");
  refused(R"({"minimum":1e17})", "no number of at most 16 integer digits");
  refused(R"({"exclusiveMinimum":true})", "exclusiveMinimum: true needs minimum");
  CHECK_FALSE(number_dfa(ojson::parse(R"({"type":"number"})"), false).has_value());
  // type number with an integer multipleOf: integers
  const ByteDfa d = *number_dfa(ojson::parse(R"({"multipleOf":2,"maximum":10})"), false);
  CHECK(d.matches("10"));
  CHECK(d.matches("-4"));
  CHECK_FALSE(d.matches("12"));
  CHECK_FALSE(d.matches("3"));
  CHECK_FALSE(d.matches("4.0"));
}

TEST_CASE("json_schema with ranges: random walks stay in range", "[text][fixtures]") {
  const auto vocab = TokenVocab::of(tiny_tokenizer());
  auto enc = [](const std::string& s) { return tiny_tokenizer().encode(s, false); };
  const ojson schema = ojson::parse(R"({"type":"object","properties":{
      "small":{"type":"integer","maximum":5},
      "age":{"type":"integer","minimum":0,"maximum":130},
      "neg":{"type":"integer","minimum":-40,"exclusiveMaximum":-3,"multipleOf":3},
      "ratio":{"type":"number","minimum":0,"maximum":1},
      "temp":{"type":"number","exclusiveMinimum":-273.15,"maximum":-200.5},
      "either":{"type":["integer","null"],"minimum":1000}},
      "required":["small","age","neg","ratio","temp","either"]})");
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    auto g = TokenGrammar::json_schema(schema, vocab);
    const WalkResult r = random_walk(*g, enc, {"}", "0", "1", ",", "\"", "null"}, seed * 31, 3000, true);
    INFO(show(r.text));
    REQUIRE(r.completed);
    const ojson v = ojson::parse(r.text);
    CHECK(v["small"].get<int64_t>() <= 5);
    CHECK(v["age"].get<int64_t>() >= 0);
    CHECK(v["age"].get<int64_t>() <= 130);
    CHECK(v["neg"].get<int64_t>() >= -40);
    CHECK(v["neg"].get<int64_t>() < -3);
    CHECK(v["neg"].get<int64_t>() % 3 == 0);
    CHECK(v["ratio"].get<double>() >= 0);
    CHECK(v["ratio"].get<double>() <= 1);
    CHECK(v["temp"].get<double>() > -273.15);
    CHECK(v["temp"].get<double>() <= -200.5);
    if (!v["either"].is_null()) CHECK(v["either"].get<int64_t>() >= 1000);
  }
  // the issue's case: maximum 5 with a long number refused at the second digit
  auto g = TokenGrammar::json_schema(ojson::parse(R"({"type":"integer","maximum":5})"), vocab);
  CHECK(feed(*g, enc("756380")) < enc("756380").size());
  auto g2 = TokenGrammar::json_schema(ojson::parse(R"({"type":"integer","maximum":5})"), vocab);
  CHECK(feed(*g2, enc("-756380")) == enc("-756380").size());
  CHECK(g2->complete());
  auto g3 = TokenGrammar::json_schema(ojson::parse(R"({"type":"integer","maximum":5})"), vocab);
  CHECK(feed(*g3, enc("5")) == enc("5").size());
  CHECK(g3->complete());
}
