// Tests of text/stop: streaming stop strings (held-back partial matches, earliest-ending match, UTF-8
// safety) and the property that any split of the text gives the same result as the whole text.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "text/stop.h"

using qrig::text::StopMatcher;

namespace {

struct Run {
  std::string text;
  bool stopped = false;
  std::string matched;
  std::vector<std::string> outputs;
};

Run run(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopMatcher m(stops);
  Run r;
  for (const std::string& p : pieces) {
    auto res = m.feed(p);
    r.outputs.push_back(res.text);
    r.text += res.text;
    if (res.stopped) {
      r.stopped = true;
      r.matched = m.matched();
      return r;
    }
  }
  r.outputs.push_back(m.flush());
  r.text += r.outputs.back();
  return r;
}

// Reference on the whole text: the occurrence that ends first, then the one that starts first.
Run whole(const std::vector<std::string>& stops, const std::string& text) {
  Run r;
  size_t best_end = std::string::npos, best_start = 0;
  for (const std::string& s : stops) {
    for (size_t pos = text.find(s); pos != std::string::npos; pos = text.find(s, pos + 1)) {
      size_t end = pos + s.size();
      if (end < best_end || (end == best_end && pos < best_start)) {
        best_end = end;
        best_start = pos;
        r.matched = s;
      }
    }
  }
  r.stopped = best_end != std::string::npos;
  r.text = r.stopped ? text.substr(0, best_start) : text;
  return r;
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

std::vector<std::string> random_split(const std::string& s, std::mt19937& gen) {
  std::vector<std::string> pieces;
  size_t i = 0;
  while (i < s.size()) {
    size_t n = 1 + gen() % 6;
    pieces.push_back(s.substr(i, n));
    i += n;
  }
  if (gen() % 4 == 0) pieces.insert(pieces.begin() + long(gen() % (pieces.size() + 1)), "");
  return pieces;
}

}  // namespace

TEST_CASE("stop string in one piece: text before it is emitted, the stop and the rest are not", "[text]") {
  auto r = run({"END"}, {"Hello END world"});
  CHECK(r.stopped);
  CHECK(r.text == "Hello ");
  CHECK(r.matched == "END");
}

TEST_CASE("stop string split over pieces is held back and never shown", "[text]") {
  auto r = run({"END"}, {"Hel", "lo E", "N", "D more"});
  CHECK(r.stopped);
  CHECK(r.text == "Hello ");
  CHECK(r.outputs == std::vector<std::string>{"Hel", "lo ", "", ""});
}

TEST_CASE("a held partial match is released when it turns out not to be a stop", "[text]") {
  auto r = run({"END"}, {"abc E", "Nx", " EN"});
  CHECK_FALSE(r.stopped);
  CHECK(r.outputs == std::vector<std::string>{"abc ", "ENx", " ", "EN"});  // the last "EN" comes from flush
  CHECK(r.text == "abc ENx EN");
}

TEST_CASE("several stops: the one complete first wins, ties go to the longer", "[text]") {
  auto a = run({"abcd", "bc"}, {"xabcd"});
  CHECK(a.text == "xa");
  CHECK(a.matched == "bc");
  auto b = run({"b", "ab"}, {"xab"});
  CHECK(b.text == "x");
  CHECK(b.matched == "ab");
  auto c = run({"abcd", "bc"}, {"xab", "cd"});  // same answer when split
  CHECK(c.text == "xa");
  CHECK(c.matched == "bc");
}

TEST_CASE("no stop strings: text passes through, split UTF-8 characters are held", "[text]") {
  auto r = run({}, {"caf\xC3", "\xA9 au lait \xF0\x9F", "\x99\x82", "!"});
  CHECK(r.outputs == std::vector<std::string>{"caf", "\xC3\xA9 au lait ", "\xF0\x9F\x99\x82", "!", ""});
  CHECK_FALSE(r.stopped);
}

TEST_CASE("stop strings with multi-byte characters split inside a character", "[text]") {
  const std::string stop = "\xE2\x80\x94STOP";  // em dash + STOP
  auto r = run({stop}, {"a\xE2", "\x80", "\x94S", "TO", "P tail"});
  CHECK(r.stopped);
  CHECK(r.text == "a");
  for (const auto& o : r.outputs) CHECK(valid_utf8(o));
  auto n = run({stop}, {"a\xE2", "\x80", "\x94S", "x"});
  CHECK_FALSE(n.stopped);
  CHECK(n.text == "a\xE2\x80\x94Sx");
}

TEST_CASE("misuse and bad input are reported", "[text]") {
  CHECK_THROWS_AS(StopMatcher({"ok", ""}), std::invalid_argument);
  StopMatcher m({"x"});
  CHECK(m.feed("abx").stopped);
  CHECK(m.stopped());
  CHECK_THROWS_AS(m.feed("more"), std::logic_error);
  CHECK(m.flush().empty());
  StopMatcher f({"x"});
  CHECK(f.flush().empty());
  CHECK_THROWS_AS(f.feed("a"), std::logic_error);
}

TEST_CASE("any split of the text gives the whole-text result", "[text]") {
  std::mt19937 gen(2024);
  const std::vector<std::vector<std::string>> stop_sets = {
      {"ab"}, {"aab", "b"}, {"abcab", "ca"}, {"a", "aaa"}, {"\n\n", "ba\n"}, {"\xC3\xA9" "a", "b\xC3\xA9"}, {}};
  const std::vector<std::string> alphabet = {"a", "b", "c", "\n", "\xC3\xA9", "\xE6\x97\xA5"};
  for (int t = 0; t < 400; ++t) {
    std::string text;
    size_t len = gen() % 30;
    for (size_t i = 0; i < len; ++i) text += alphabet[gen() % alphabet.size()];
    const auto& stops = stop_sets[size_t(t) % stop_sets.size()];
    Run want = whole(stops, text);
    for (int s = 0; s < 20; ++s) {
      auto pieces = random_split(text, gen);
      Run got = run(stops, pieces);
      INFO("text '" << text << "' split " << s);
      REQUIRE(got.text == want.text);
      REQUIRE(got.stopped == want.stopped);
      REQUIRE(got.matched == want.matched);
      for (const auto& o : got.outputs) REQUIRE(valid_utf8(o));
    }
  }
}
