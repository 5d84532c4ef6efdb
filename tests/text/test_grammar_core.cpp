// Tests of the pieces under constrained decoding: the vocabulary trie (text/grammar_vocab.h), the lexers
// (text/grammar_lexer.h) and the rule builder / machine (text/grammar_rules.h, text/grammar.h) on hand-made
// grammars and vocabularies.
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/text/grammar_test_util.h"
#include "tests/text/tokenizer_test_util.h"
#include "text/grammar.h"
#include "text/grammar_lexer.h"
#include "text/grammar_rules.h"

using namespace qrig::text;
using namespace qrig::text::grammar;
using namespace qrig::text::testutil;

namespace {

// A vocabulary of the given texts (ids in order); `control` and `eog` by text.
std::shared_ptr<const TokenVocab> make_vocab(const std::vector<std::string>& texts, const std::vector<std::string>& control = {},
                                             const std::vector<std::string>& eog = {}) {
  std::vector<bool> is_control;
  std::vector<int32_t> eog_ids;
  for (size_t i = 0; i < texts.size(); ++i) {
    is_control.push_back(std::find(control.begin(), control.end(), texts[i]) != control.end());
    if (std::find(eog.begin(), eog.end(), texts[i]) != eog.end()) eog_ids.push_back(static_cast<int32_t>(i));
  }
  return std::make_shared<const TokenVocab>(texts, is_control, eog_ids);
}

enum class End { Dead, Final, Inside };
End run_lexer(const Lexer& lx, const std::string& s) {
  const uint16_t st = lx.run(0, s);
  if (st == Lexer::kDead) return End::Dead;
  return lx.is_final(st) ? End::Final : End::Inside;
}

}  // namespace

TEST_CASE("grammar vocab: the trie holds every text token once, in depth-first order", "[text][fixtures]") {
  const std::vector<std::string> texts = {"a", "ab", "abc", "b", "ba", "", "<c>", "<e>", "ab", "\xff\x00z", "abd"};
  const auto v = make_vocab(texts, {"<c>"}, {"<e>"});
  CHECK(v->size() == 11);
  CHECK(v->is_text(0));
  CHECK_FALSE(v->is_text(5));  // empty
  CHECK_FALSE(v->is_text(6));  // control
  CHECK_FALSE(v->is_text(7));  // end of generation
  CHECK(v->is_eog(7));
  CHECK(v->eog_ids() == std::vector<int32_t>{7});
  CHECK(v->max_token_bytes() == 3);
  const auto& nodes = v->nodes();
  std::vector<std::string> path(nodes.size());
  std::vector<std::string> prefix{""};
  std::multiset<int32_t> seen;
  for (size_t i = 1; i < nodes.size(); ++i) {
    const auto& n = nodes[i];
    REQUIRE(n.depth >= 1);
    REQUIRE(n.depth <= prefix.size());
    prefix.resize(n.depth);
    prefix.push_back(prefix.back() + static_cast<char>(n.byte));
    path[i] = prefix.back();
    // the subtree ends at the next node that is not deeper
    size_t j = i + 1;
    while (j < nodes.size() && nodes[j].depth > n.depth) ++j;
    CHECK(n.end == j);
    for (uint32_t k = 0; k < n.n_tok; ++k) {
      const int32_t id = v->trie_tokens()[n.tok_begin + k];
      CHECK(v->bytes(id) == path[i]);
      seen.insert(id);
    }
  }
  CHECK(seen == std::multiset<int32_t>{0, 1, 2, 3, 4, 8, 9, 10});
  CHECK(nodes[0].end == nodes.size());

  CHECK_THROWS_AS(TokenVocab({"a", "b"}, {false}, {}), GrammarError);
  CHECK_THROWS_AS(TokenVocab({"a", "b"}, {false, false}, {2}), GrammarError);
  CHECK_THROWS_AS(TokenVocab({}, {}, {}), GrammarError);
  CHECK(TokenVocab::of(tiny_tokenizer()) == TokenVocab::of(tiny_tokenizer()));  // cached
}

TEST_CASE("grammar lexer: JSON string bodies", "[text]") {
  const Lexer js(LexerDef{LexBase::JsonString, {}});
  for (const char* ok : {"\"", "abc\"", "a\\\"b\"", "\\\\\\/\\b\\f\\n\\r\\t\"", "\\u00e9\"", "\\uD83D\\uDE00\"",
                         "\xc3\xa9\"", "\xe6\x97\xa5\"", "\xf0\x9f\x98\x80\"", "\xf4\x8f\xbf\xbf\"", "\x7f\""}) {
    INFO(show(std::string(ok)));
    CHECK(run_lexer(js, ok) == End::Final);
  }
  for (const char* dead : {"\\x", "\\ud83d\"", "\\ud83dx", "\\udc00", "\t", "\n", "\xc0\x80", "\xed\xa0\x80",
                           "\xf4\x90", "\xf5", "\x80", "\xe0\x80", "\\u12g", "\"x"}) {
    INFO(show(std::string(dead)));
    CHECK(run_lexer(js, dead) == End::Dead);
  }
  CHECK(run_lexer(js, "abc\\u00") == End::Inside);
  const Lexer plain(LexerDef{LexBase::JsonStringPlain, {}});
  CHECK(run_lexer(plain, "ab\"") == End::Final);
  CHECK(run_lexer(plain, "a\\n") == End::Dead);
  // Characters: every start is flagged once; an escape (or a surrogate pair) is one character.
  auto chars = [&](const std::string& s) {
    int n = 0;
    uint16_t st = 0;
    for (unsigned char c : s) {
      const uint16_t e = js.next(st, c);
      REQUIRE(e != Lexer::kDead);
      n += (e & Lexer::kCharStart) ? 1 : 0;
      st = e & ~Lexer::kCharStart;
    }
    return n;
  };
  CHECK(chars("ab\xc3\xa9\\n\\uD83D\\uDE00\"") == 5);
}

TEST_CASE("grammar lexer: text with exit and reject patterns", "[text]") {
  LexerDef def{LexBase::Utf8Text, {{"\n</parameter>", true}, {"</parameter>", false}, {"</tool_call>", false}}};
  const Lexer raw(def);
  CHECK(run_lexer(raw, "x\n</parameter>") == End::Final);
  CHECK(run_lexer(raw, "\n</parameter>") == End::Final);
  CHECK(run_lexer(raw, "x</parameter>") == End::Dead);
  CHECK(run_lexer(raw, "a</tool_call") == End::Inside);
  CHECK(run_lexer(raw, "a</tool_call>") == End::Dead);
  CHECK(run_lexer(raw, "\n</param\n</parameter>") == End::Final);
  CHECK(run_lexer(raw, "\xff") == End::Dead);  // valid UTF-8 only
  CHECK(run_lexer(raw, "\x01\t\r\xe6\x97\xa5") == End::Inside);
  CHECK(raw.pending_chars(raw.run(0, "ab\n</para")) == 7);
  CHECK(raw.pending_chars(raw.run(0, "ab\n</parx")) == 0);
  CHECK(raw.pending_chars(raw.run(0, "x\n</parameter>")) == 13);
  const Lexer again(def);
  CHECK(again.signature() == raw.signature());
  CHECK(again.n_states() == raw.n_states());
  CHECK_THROWS_AS(Lexer(LexerDef{LexBase::Utf8Text, {}}), GrammarError);
  CHECK_THROWS_AS(Lexer(LexerDef{LexBase::Utf8Text, {{"a", true}, {"b", true}}}), GrammarError);
  CHECK_THROWS_AS(Lexer(LexerDef{LexBase::JsonString, {{"a", true}}}), GrammarError);
  CHECK_THROWS_AS(Lexer(LexerDef{LexBase::Utf8Text, {{"", true}}}), GrammarError);
  CHECK_THROWS_AS(Lexer(LexerDef{LexBase::Utf8Text, {{"\xc3\xa9", true}}}), GrammarError);
}

TEST_CASE("grammar rules: impossible alternatives are pruned, left recursion rejected", "[text]") {
  const auto v = make_vocab({"x", "y", "z", "xy", "<e>"}, {}, {"<e>"});
  {
    // A := "x" B | "y";  B := "z" B  (never finishes)
    GrammarBuilder b;
    const uint32_t a = b.new_rule(), bb = b.new_rule();
    std::vector<Item> ax, ay, bz;
    b.lit(ax, "x");
    ax.push_back(GrammarBuilder::call(bb));
    b.lit(ay, "y");
    b.lit(bz, "z");
    bz.push_back(GrammarBuilder::call(bb));
    b.add_alt(a, ax);
    b.add_alt(a, ay);
    b.add_alt(bb, bz);
    TokenGrammar g(b.finish(a), v);
    CHECK(allowed_ids(g) == std::vector<int32_t>{1});
    g.accept(1);
    CHECK(allowed_ids(g) == std::vector<int32_t>{4});
  }
  {
    GrammarBuilder b;
    const uint32_t a = b.new_rule();
    std::vector<Item> ax;
    b.lit(ax, "x");
    ax.push_back(GrammarBuilder::call(a));
    b.add_alt(a, ax);
    CHECK_THROWS_AS(b.finish(a), GrammarError);  // admits nothing
  }
  {
    GrammarBuilder b;  // A := B "x" | "y";  B := A | eps  -> A calls itself without consuming
    const uint32_t a = b.new_rule(), bb = b.new_rule();
    std::vector<Item> abx{GrammarBuilder::call(bb)}, ay;
    b.lit(abx, "x");
    b.lit(ay, "y");
    b.add_alt(a, abx);
    b.add_alt(a, ay);
    b.add_alt(bb, {GrammarBuilder::call(a)});
    b.add_alt(bb, {});
    CHECK_THROWS_AS(b.finish(a), GrammarError);
  }
}

TEST_CASE("grammar rules: a permutation group takes each member at most once", "[text]") {
  const auto v = make_vocab({"a", "b", "c", "<e>"}, {}, {"<e>"});
  auto make = [&] {
    GrammarBuilder b;
    PermGroup p;
    for (const char* m : {"a", "b", "c"}) {
      std::vector<Item> seq;
      b.lit(seq, m);
      p.members.push_back(b.rule_of({seq}));
    }
    p.required = 0b101;  // a and c
    const uint32_t root = b.rule_of({{b.perm(p)}});
    return std::make_unique<TokenGrammar>(b.finish(root), v);
  };
  auto ids = [](const std::string& s) {
    std::vector<int32_t> out;
    for (char c : s) out.push_back(c - 'a');
    return out;
  };
  for (const char* ok : {"ac", "ca", "abc", "acb", "bac", "bca", "cab", "cba"}) {
    auto g = make();
    INFO(ok);
    CHECK(feed(*g, ids(ok)) == std::string(ok).size());
    CHECK(g->complete());
  }
  for (const auto& [bad, at] : std::vector<std::pair<std::string, size_t>>{{"aa", 1}, {"cbb", 2}, {"abca", 3}}) {
    auto g = make();
    INFO(bad);
    CHECK(feed(*g, ids(bad)) == at);
  }
  auto g = make();
  CHECK(feed(*g, ids("ab")) == 2);
  CHECK_FALSE(g->complete());
  CHECK(allowed_ids(*g) == std::vector<int32_t>{2});
}

TEST_CASE("grammar: exponential ambiguity is stopped with an error, not a blow-up", "[text][fixtures]") {
  const auto vocab = TokenVocab::of(tiny_tokenizer());
  // Two identical branches at every nesting level: the parses double with each '['.
  const ojson schema = ojson::parse(R"({"$defs":{"n":{"anyOf":[{"type":"array","items":{"$ref":"#/$defs/n"}},
      {"type":"array","items":{"$ref":"#/$defs/n"}}]}},"$ref":"#/$defs/n"})");
  auto g = TokenGrammar::json_schema(schema, vocab);
  const auto open = tiny_tokenizer().encode("[", false);
  REQUIRE(open.size() == 1);
  bool stopped = false;
  for (int depth = 0; depth < 40 && !stopped; ++depth) {
    try {
      g->accept(open[0]);
    } catch (const GrammarError& e) {
      stopped = true;
      CHECK(std::string(e.what()).find("ambiguous") != std::string::npos);
    }
  }
  CHECK(stopped);
  // Moderate ambiguity (anyOf of objects sharing a prefix) is fine.
  const ojson two = ojson::parse(R"({"anyOf":[{"type":"object","properties":{"k":{"type":"integer"}},"required":["k"]},
      {"type":"object","properties":{"k":{"type":"string"}},"required":["k"]}]})");
  for (const char* doc : {R"({"k":1})", R"({"k":"1"})"}) {
    auto h = TokenGrammar::json_schema(two, vocab);
    const auto ids = tiny_tokenizer().encode(doc, false);
    CHECK(feed(*h, ids) == ids.size());
    CHECK(h->complete());
  }
}
