// Tests of text/output_parser in streaming use: held-back partial tags released or consumed at piece
// boundaries, tool call deltas, UTF-8 split inside characters, and the property that the deltas of any
// split of any output concatenate to the whole-text parse.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "text/output_parser.h"

using nlohmann::json;
using qrig::text::apply_delta;
using qrig::text::Delta;
using qrig::text::OutputStreamParser;
using qrig::text::parse_output;
using qrig::text::ParsedOutput;

namespace {

json tools() {
  return json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {
        "cmd": {"type": "string"}, "opts": {"type": "object"}, "n": {"type": "number"}}}}}
  ])");
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

struct Streamed {
  ParsedOutput out;
  std::vector<Delta> deltas;
};

// Feeds the pieces, checks the delta invariants on the way, and folds the deltas.
Streamed stream(const std::vector<std::string>& pieces, bool thinking, const json& t = tools(),
                bool check_utf8 = true) {
  OutputStreamParser p(t, thinking, "call_s_");
  Streamed s;
  auto take = [&](std::vector<Delta> ds) {
    for (Delta& d : ds) {
      if (d.kind == Delta::Kind::reasoning || d.kind == Delta::Kind::content) {
        REQUIRE_FALSE(d.text.empty());
        if (check_utf8) REQUIRE(valid_utf8(d.text));
      }
      apply_delta(s.out, d);
      s.deltas.push_back(std::move(d));
    }
  };
  for (const std::string& piece : pieces) take(p.feed(piece));
  take(p.finish());
  return s;
}

std::vector<std::string> random_split(const std::string& s, std::mt19937& gen, size_t max_piece) {
  std::vector<std::string> pieces;
  size_t i = 0;
  while (i < s.size()) {
    size_t n = 1 + gen() % max_piece;
    pieces.push_back(s.substr(i, n));
    i += n;
  }
  return pieces;
}

std::vector<std::string> bytes(const std::string& s) {
  std::vector<std::string> v;
  for (char c : s) v.push_back(std::string(1, c));
  return v;
}

const std::string kWeather =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nS\xC3\xA3o Paulo\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
const std::string kRun =
    "<tool_call>\n<function=run>\n<parameter=cmd>\nls -la </tmp>\n</parameter>\n<parameter=opts>\n"
    "{\"cwd\": \"/\", \"env\": [1, 2]}\n</parameter>\n<parameter=n>\n2.5\n</parameter>\n</function>\n</tool_call>";

// Hand-written outputs covering every feature, each parsed with thinking on and off.
std::vector<std::string> corpus() {
  return {
      "",
      "Hello, world!",
      "Let me think about \xE6\x97\xA5\xE6\x9C\xAC.\nMore.\n</think>\n\nAnswer: 42 \xF0\x9F\x99\x82",
      "<think>\nstarted with a tag\n</think>\n\ncontent",
      "unfinished reasoning with a partial close </thi",
      "unfinished reasoning\n\n",
      "plan\n</think>\n\n" + kWeather,
      "plan\n</think>\n\nI will call.\n\n" + kWeather + "\n" + kRun + "\n",
      kWeather + kRun,
      "thinking about " + kWeather + " without closing",
      "text <tool_c not a tag </tool_call> <tool_call without close",
      "x\n</think>\n\n<tool_call>\n<function=nope>\n</function>\n</tool_call>\n" + kRun,
      "x\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</function>\n</tool_call>after",
      "x\n</think>\n\nbefore\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nunclosed at the end\n",
      "\n\n\n</think>\n\n\n\nafter many newlines\n\n\n",
      "a </think> b </think> c <think> d",
      "<<<>>></<//think>></tool_call><tool_call>\n\n\n",
  };
}

// Random outputs built from tag fragments, text, newlines and multi-byte characters.
std::string random_output(std::mt19937& gen) {
  static const std::vector<std::string> parts = {
      "</think>", "<think>", "\n", "\n\n", "hello", " ", "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x99\x82",
      "<tool_call>", "</tool_call>", "<function=get_weather>", "<function=run>", "<function=nope>", "</function>",
      "<parameter=city>", "<parameter=days>", "<parameter=opts>", "</parameter>", "Paris", "42", "{\"a\": 1}",
      "<tool_c", "</thi", "<", ">", "=", kWeather, kRun, "\n" + kWeather + "\n"};
  std::string s;
  const size_t n = gen() % 25;
  for (size_t i = 0; i < n; ++i) s += parts[gen() % parts.size()];
  return s;
}

}  // namespace

TEST_CASE("stream: a partial </think> is held, then consumed", "[text]") {
  OutputStreamParser p(tools(), true, "c_");
  auto d1 = p.feed("abc\n</thi");
  REQUIRE(d1.size() == 1);
  CHECK(d1[0].kind == Delta::Kind::reasoning);
  CHECK(d1[0].text == "abc");
  auto d2 = p.feed("nk>\n\nxyz");
  REQUIRE(d2.size() == 1);
  CHECK(d2[0].kind == Delta::Kind::content);
  CHECK(d2[0].text == "xyz");
  CHECK(p.finish().empty());
  CHECK_THROWS_AS(p.feed("more"), std::logic_error);
  CHECK_THROWS_AS(p.finish(), std::logic_error);
}

TEST_CASE("stream: a held partial tag is released when it is not a tag", "[text]") {
  OutputStreamParser p(tools(), true, "c_");
  CHECK(p.feed("abc</thi").at(0).text == "abc");
  auto d = p.feed("s is not a tag");
  REQUIRE(d.size() == 1);
  CHECK(d[0].kind == Delta::Kind::reasoning);
  CHECK(d[0].text == "</this is not a tag");

  OutputStreamParser c(tools(), false, "c_");
  CHECK(c.feed("Hi <tool_c").at(0).text == "Hi ");
  auto e = c.feed("ookie\n");
  REQUIRE(e.size() == 1);
  CHECK(e[0].text == "<tool_cookie");  // the newline may still precede a call: held
  auto f = c.finish();
  REQUIRE(f.size() == 1);
  CHECK(f[0].text == "\n");
}

TEST_CASE("stream: a tool call is announced complete, start then argument fragments", "[text]") {
  OutputStreamParser p(tools(), false, "call_x_");
  std::vector<Delta> all;
  for (const std::string& piece : {std::string("Checking.\n\n<tool_"), std::string("call>\n<function=get_weather>\n"),
                                   std::string("<parameter=city>\nParis\n</parameter>\n<parameter=days>\n"),
                                   std::string("4\n</parameter>\n</function>\n</tool_call>")}) {
    auto d = p.feed(piece);
    all.insert(all.end(), d.begin(), d.end());
  }
  auto f = p.finish();
  all.insert(all.end(), f.begin(), f.end());
  REQUIRE(all.size() >= 3);
  CHECK(all[0].kind == Delta::Kind::content);
  CHECK(all[0].text == "Checking.");
  CHECK(all[1].kind == Delta::Kind::tool_call_start);
  CHECK(all[1].index == 0);
  CHECK(all[1].id == "call_x_0");
  CHECK(all[1].name == "get_weather");
  std::string args;
  for (size_t i = 2; i < all.size(); ++i) {
    CHECK(all[i].kind == Delta::Kind::tool_call_arguments);
    CHECK(all[i].index == 0);
    args += all[i].text;
  }
  CHECK(args == R"({"city":"Paris","days":4})");
}

TEST_CASE("stream: apply_delta rejects out-of-sequence tool call indices", "[text]") {
  ParsedOutput out;
  Delta args;
  args.kind = Delta::Kind::tool_call_arguments;
  args.index = 0;
  CHECK_THROWS_AS(apply_delta(out, args), std::invalid_argument);
  Delta start;
  start.kind = Delta::Kind::tool_call_start;
  start.index = 1;
  CHECK_THROWS_AS(apply_delta(out, start), std::invalid_argument);
}

TEST_CASE("stream: UTF-8 characters split inside pieces never reach a delta half-done", "[text]") {
  const std::string text = "temp\xC3\xA9rature \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82\n</think>\n\n"
                           "r\xC3\xA9ponse \xF0\x9F\x98\x80" + kWeather;
  for (bool thinking : {true, false}) {
    const ParsedOutput want = parse_output(text, tools(), thinking, "call_s_");
    for (size_t cut = 0; cut <= text.size(); ++cut) {  // every two-piece split
      INFO("cut " << cut);
      REQUIRE(stream({text.substr(0, cut), text.substr(cut)}, thinking).out == want);
    }
    REQUIRE(stream(bytes(text), thinking).out == want);  // one byte at a time
  }
}

TEST_CASE("stream: deltas of any split equal the whole parse (hand-written outputs)", "[text]") {
  std::mt19937 gen(7);
  for (const std::string& text : corpus()) {
    for (bool thinking : {true, false}) {
      const ParsedOutput want = parse_output(text, tools(), thinking, "call_s_");
      for (const auto& t : want.tool_calls) REQUIRE(json::parse(t.arguments).is_object());
      INFO("text: " << text << "\nthinking: " << thinking);
      REQUIRE(stream({text}, thinking).out == want);
      REQUIRE(stream(bytes(text), thinking).out == want);
      for (int s = 0; s < 200; ++s) REQUIRE(stream(random_split(text, gen, 1 + s % 12), thinking).out == want);
      REQUIRE(stream(bytes(text), thinking, json::array()).out == parse_output(text, json::array(), thinking, "call_s_"));
    }
  }
}

TEST_CASE("stream: deltas of any split equal the whole parse (random outputs)", "[text]") {
  std::mt19937 gen(99);
  for (int t = 0; t < 1500; ++t) {
    const std::string text = random_output(gen);
    const bool thinking = t % 2 == 0;
    const ParsedOutput want = parse_output(text, tools(), thinking, "call_s_");
    for (const auto& c : want.tool_calls) REQUIRE(json::parse(c.arguments).is_object());
    INFO("text: " << text << "\nthinking: " << thinking);
    for (int s = 0; s < 10; ++s) REQUIRE(stream(random_split(text, gen, 1 + s * 3), thinking).out == want);
  }
}

TEST_CASE("stream: arbitrary bytes (invalid UTF-8 too) never crash and stay split-invariant", "[text]") {
  std::mt19937 gen(5);
  const std::string alphabet = std::string("<>/=\n_") + "\xC3\xA9\xE6\xF0\x80\xFF" + "abtcfinkolpr";
  for (int t = 0; t < 1500; ++t) {
    std::string text = random_output(gen);
    const size_t extra = gen() % 40;
    for (size_t i = 0; i < extra; ++i)
      text.insert(gen() % (text.size() + 1), 1, alphabet[gen() % alphabet.size()]);
    const bool thinking = t % 2 == 1;
    const ParsedOutput want = parse_output(text, tools(), thinking, "call_s_");
    for (const auto& c : want.tool_calls) REQUIRE(json::parse(c.arguments).is_object());
    for (int s = 0; s < 5; ++s)
      REQUIRE(stream(random_split(text, gen, 1 + s * 4), thinking, tools(), false).out == want);
  }
}

TEST_CASE("stream: the expected fields for the hand-written outputs", "[text]") {
  auto r = parse_output("plan\n</think>\n\nI will call.\n\n" + kWeather + "\n" + kRun + "\n", tools(), true, "id");
  CHECK(r.reasoning_content == "plan");
  CHECK(r.content == "I will call.");
  REQUIRE(r.tool_calls.size() == 2);
  CHECK(json::parse(r.tool_calls[0].arguments) == json::parse("{\"city\":\"S\xC3\xA3o Paulo\",\"days\":3}"));
  CHECK(r.tool_calls[1].arguments == R"({"cmd":"ls -la </tmp>","opts":{"cwd":"/","env":[1,2]},"n":2.5})");
  CHECK(r.tool_calls[1].id == "id1");
  auto text = parse_output("text <tool_c not a tag </tool_call> <tool_call without close", tools(), false, "id");
  CHECK(text.content == "text <tool_c not a tag </tool_call> <tool_call without close");
  auto nl = parse_output("\n\n\n</think>\n\n\n\nafter many newlines\n\n\n", tools(), true, "id");
  CHECK(nl.reasoning_content.empty());
  CHECK(nl.content == "after many newlines\n\n\n");
}

TEST_CASE("stream: a long tool call fed in small pieces stays linear", "[text]") {
  std::string value;
  while (value.size() < 400000) value += "<div>x</div>\n";
  const std::string text = "<tool_call>\n<function=run>\n<parameter=cmd>\n" + value +
                           "\n</parameter>\n</function>\n</tool_call>";
  OutputStreamParser p(tools(), false, "id");
  ParsedOutput out;
  const auto t0 = std::clock();
  for (size_t i = 0; i < text.size(); i += 4)
    for (const Delta& d : p.feed(std::string_view(text).substr(i, 4))) apply_delta(out, d);
  for (const Delta& d : p.finish()) apply_delta(out, d);
  const double seconds = double(std::clock() - t0) / CLOCKS_PER_SEC;
  REQUIRE(out.tool_calls.size() == 1);
  CHECK(json::parse(out.tool_calls[0].arguments)["cmd"] == value);
  CHECK(out.content.empty());
  CHECK(seconds < 3.0);  // a rescan of the whole block per piece would take minutes
}
