// Finite automata over bytes for constrained decoding: the JSON-schema keywords whose valid values form a
// regular language (`pattern`, `format`, numeric ranges and multipleOf, string lengths next to a pattern) are
// compiled to a minimal deterministic automaton here, then either emitted as grammar rules (numbers:
// dfa_rule) or turned into a lexer with a cached token set per state (strings: grammar_lexer.h,
// string_lexer). Written here rather than taken from a library: the packaged regex engines (PCRE2, RE2,
// Hyperscan) match text but expose no automaton state that can be stepped byte by byte and copied, which
// is what a token mask needs.
//
// ByteNfa: Thompson-style, with epsilon edges and the two position assertions a JSON-Schema pattern can
// hold (^ = start of the text, $ = end of the text). Code point sets become UTF-8 byte sequences
// (add_code_points), so every automaton built from them accepts only valid UTF-8.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/grammar_error.h"
#include "text/grammar_rules.h"

namespace qrig::text::grammar {

// Inclusive code point ranges, sorted and disjoint after normalise().
struct CodePointSet {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  void add(uint32_t lo, uint32_t hi) { ranges.emplace_back(lo, hi); }
  void normalise();
  CodePointSet complement() const;  // within U+0000..U+10FFFF, surrogates excluded
};

struct ByteNfa {
  enum class EdgeKind : uint8_t { Eps, Begin, End, Bytes };
  struct Edge {
    EdgeKind kind;
    uint8_t lo, hi;  // Bytes
    uint32_t to;
  };
  std::vector<std::vector<Edge>> out;  // per state
  uint32_t start = 0, accept = 0;

  uint32_t add_state();
  void eps(uint32_t a, uint32_t b) { out[a].push_back(Edge{EdgeKind::Eps, 0, 0, b}); }
  void bytes(uint32_t a, uint32_t b, uint8_t lo, uint8_t hi) { out[a].push_back(Edge{EdgeKind::Bytes, lo, hi, b}); }
  // Paths from a to b spelling the UTF-8 encodings of exactly the code points in `set` (normalised).
  void add_code_points(uint32_t a, uint32_t b, const CodePointSet& set);
  // The literal bytes from a to b.
  void literal(uint32_t a, uint32_t b, std::string_view text);
  size_t size() const { return out.size(); }
};

struct ByteDfa {
  static constexpr int32_t kNone = -1;
  std::vector<int32_t> next;  // size() * 256; kNone = no transition
  std::vector<bool> accept;   // state 0 is the start

  size_t size() const { return accept.size(); }
  int32_t step(int32_t s, uint8_t b) const { return next[static_cast<size_t>(s) * 256 + b]; }
  bool matches(std::string_view text) const;
  int32_t add_state(bool acc);
};

// Subset construction (the NFA's assertions honoured), then minimisation and removal of states that cannot
// reach acceptance. Throws GrammarError naming `what` when more than max_states states are needed.
ByteDfa determinize(const ByteNfa& nfa, const std::string& what, size_t max_states = 20000);
// Minimal equivalent automaton without dead states (state 0 stays the start; an empty language gives one
// non-accepting state without transitions).
ByteDfa minimize(const ByteDfa& d);
// Strings both accept (minimised).
ByteDfa intersect(const ByteDfa& a, const ByteDfa& b, const std::string& what, size_t max_states = 20000);
// Strings of `d` with between min_chars and max_chars UTF-8 characters (minimised).
ByteDfa limit_chars(const ByteDfa& d, uint32_t min_chars, uint32_t max_chars, const std::string& what,
                    size_t max_states = 20000);
bool is_empty(const ByteDfa& d);
// Whether character-count limits can be left to counting (grammar_rules.h LexInst) instead of
// limit_chars without a dead end: after every complete character except at the start the text is a word,
// and from every state one more character leads to such a point. (Then every length is reachable.)
bool counts_safely(const ByteDfa& d);

// A rule matching exactly the strings of `d` (one rule per state; right-linear, so the machine needs no
// stack frames for it). A DFA without strings gives a rule without alternatives.
uint32_t dfa_rule(GrammarBuilder& b, const ByteDfa& d);

}  // namespace qrig::text::grammar
