// Plain-text outputs under a regular expression or a choice list (TokenGrammar::regex / ::choice, vLLM's
// guided_regex / guided_choice): random walks over the masks only ever produce texts that match in full
// (checked with the regex automaton and by hand), known texts are accepted and others refused at the right
// token, and what cannot be honoured is a GrammarError.
#include <catch2/catch.hpp>

#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/text/grammar_test_util.h"
#include "tests/text/tokenizer_test_util.h"
#include "text/grammar.h"

using namespace qrig::text;
using namespace qrig::text::testutil;

namespace {

std::shared_ptr<const TokenVocab> tiny_vocab() { return TokenVocab::of(tiny_tokenizer()); }
std::vector<int32_t> enc(const std::string& s) { return tiny_tokenizer().encode(s, false); }

}  // namespace

TEST_CASE("regex grammar: every walk is a full match", "[text][grammar]") {
  struct Case {
    const char* pattern;
    const char* std_pattern;  // the same language for std::regex (ECMAScript, whole-string match)
  };
  for (const Case c : {Case{"[0-9]{3}-[0-9]{4}", "[0-9]{3}-[0-9]{4}"}, Case{"(yes|no|maybe)!?", "(yes|no|maybe)!?"},
                       Case{"[a-c]+x", "[a-c]+x"}, Case{"\\d+(\\.\\d{1,2})?", "\\d+(\\.\\d{1,2})?"}}) {
    const std::regex want(c.std_pattern);
    for (uint64_t seed = 0; seed < 25; ++seed) {
      auto g = TokenGrammar::regex(c.pattern, tiny_vocab());
      WalkResult w = random_walk(*g, enc, {"x", "!", "1"}, seed, 200, false);
      INFO("pattern " << c.pattern << " seed " << seed << " text " << w.text);
      REQUIRE(w.completed);
      CHECK(std::regex_match(w.text, want));
    }
  }
  // Known texts: accepted whole; a text past the match is refused where it leaves it.
  auto g = TokenGrammar::regex("[0-9]{3}-[0-9]{4}", tiny_vocab());
  CHECK(feed(*g, enc("555-1234")) == enc("555-1234").size());
  CHECK(g->complete());
  auto h = TokenGrammar::regex("[0-9]{3}-[0-9]{4}", tiny_vocab());
  const auto bad = enc("555-12345");
  CHECK(feed(*h, bad) < bad.size());
  // Anchors written by the client are harmless; a search pattern is still a full match.
  auto a = TokenGrammar::regex("^ab$", tiny_vocab());
  CHECK(feed(*a, enc("ab")) == enc("ab").size());
  CHECK(a->complete());
  CHECK_THROWS_AS(TokenGrammar::regex("(?=a)b", tiny_vocab()), GrammarError);
  CHECK_THROWS_AS(TokenGrammar::regex("a{2000}", tiny_vocab()), GrammarError);
}

TEST_CASE("choice grammar: the output is exactly one of the strings", "[text][grammar]") {
  const std::vector<std::string> choices = {"positive", "negative", "neutral", "n/a"};
  const std::set<std::string> want(choices.begin(), choices.end());
  std::set<std::string> seen;
  for (uint64_t seed = 0; seed < 60; ++seed) {
    auto g = TokenGrammar::choice(choices, tiny_vocab());
    WalkResult w = random_walk(*g, enc, {}, seed, 100, true);
    INFO("seed " << seed << " text " << w.text);
    REQUIRE(w.completed);
    CHECK(want.count(w.text) == 1);
    seen.insert(w.text);
  }
  CHECK(seen.size() >= 3);  // the walk reaches the different choices
  auto g = TokenGrammar::choice(choices, tiny_vocab());
  const auto text = enc("neutralx");
  CHECK(feed(*g, text) < text.size());
  CHECK_THROWS_AS(TokenGrammar::choice({}, tiny_vocab()), GrammarError);
}
