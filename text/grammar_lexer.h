// Lexers of constrained decoding: small byte-level DFAs for the long free-text stretches of a grammar (a JSON
// string body, a raw tool-call parameter value, the reasoning before "</think>"). They exist as separate
// automata, not grammar rules, for speed: a lexer state is one integer, a byte is one table lookup, and, since
// the set of tokens a lexer state accepts does not depend on the rest of the grammar, that set is computed
// once per vocabulary and cached (grammar_vocab.h), so a mask inside a long string costs a bitset copy.
//
// A lexer is a base DFA (valid UTF-8 text, or the body of a JSON string after its opening quote) times an
// Aho-Corasick automaton over a few ASCII patterns, each either an exit (the lexeme ends when it completes,
// e.g. "\n</parameter>") or a reject (the text may never contain it, e.g. "</tool_call>"). When several
// patterns end at the same byte the longest decides, so "</parameter>" can be rejected while
// "\n</parameter>" is the exit. The only accepting state is the final one, which has no transitions: a
// lexeme ends exactly where its base DFA (the JSON closing quote) or its exit pattern says.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/grammar_error.h"

namespace qrig::text::grammar {

enum class LexBase : uint8_t {
  Utf8Text,         // any valid UTF-8 (control characters included); ends only through an exit pattern
  JsonString,       // a JSON string body: no raw control characters, escapes checked (surrogate pairs
                    // included), ends at the unescaped closing quote
  JsonStringPlain,  // the same without escapes (a backslash is rejected); used for undeclared object keys
  Dfa,              // a table built elsewhere (string_lexer below), not from a LexerDef
};

struct LexPattern {
  std::string text;  // non-empty ASCII
  bool exit = false;  // true: the lexeme ends here; false: the text must never contain it
};

struct LexerDef {
  LexBase base = LexBase::Utf8Text;
  std::vector<LexPattern> patterns;
  // A string that identifies the lexer: equal signatures give identical state numberings (the token-set
  // cache of grammar_vocab.h is keyed by it).
  std::string signature() const;
};

class Lexer {
 public:
  // Transition entries: bit 15 set when the byte starts a new character (counted by min/max length),
  // the low 15 bits the next state; kDead when the byte is not allowed.
  static constexpr uint16_t kDead = 0x7FFF;
  static constexpr uint16_t kCharStart = 0x8000;

  // Throws GrammarError for an unusable definition: a Utf8Text lexer without exactly one exit pattern,
  // a JSON lexer with an exit pattern, empty or non-ASCII patterns.
  explicit Lexer(const LexerDef& def);
  // A prebuilt table (base Dfa): n_states * 256 entries as next() returns them, pending per state, the final
  // state. The signature must identify the table (equal signatures, equal tables).
  Lexer(std::string signature, std::vector<uint16_t> table, std::vector<uint16_t> pending, uint16_t final_state);

  uint16_t next(uint16_t state, uint8_t byte) const { return table_[static_cast<size_t>(state) * 256 + byte]; }
  bool is_final(uint16_t state) const { return state == final_; }
  // Characters at the end of the text that may still turn out to belong to the exit pattern (the longest
  // prefix of it that the text ends with); the final state gives the whole pattern. Subtracted from the
  // character count, so that the exit pattern does not count towards a length limit.
  uint16_t pending_chars(uint16_t state) const { return pending_[state]; }
  uint16_t n_states() const { return static_cast<uint16_t>(pending_.size()); }
  const std::string& signature() const { return signature_; }
  LexBase base() const { return base_; }
  // The state after `bytes` from `state` (kDead if a byte is not allowed or the lexeme ends early).
  uint16_t run(uint16_t state, std::string_view bytes) const;

 private:
  LexBase base_;
  std::string signature_;
  std::vector<uint16_t> table_;    // n_states * 256
  std::vector<uint16_t> pending_;  // per state
  uint16_t final_ = kDead;
};

// Aho-Corasick automaton with a complete goto table over a few ASCII patterns. action: what the longest
// pattern ending at a node says; pending: the length of the longest exit-pattern prefix the text ends with.
struct PatternMatcher {
  enum Action : uint8_t { None, Exit, Reject };
  std::vector<std::array<uint16_t, 256>> go;
  std::vector<Action> action;
  std::vector<uint16_t> pending;
  explicit PatternMatcher(const std::vector<LexPattern>& patterns);
};

struct ByteDfa;

// Lexers for strings whose characters must form a word of `value` (a pattern, a format, with lengths folded
// in; grammar_dfa.h):
//   Json: the body of a JSON string after its opening quote, ending at the closing quote, whose decoded
//     characters spell a word of `value`. Characters are written raw (UTF-8) or as the short escapes
//     (\" \\ \/ \b \f \n \r \t) or, for control characters, as \u00XX; no other \u escapes. tool_safe:
//     the written bytes never contain a tool-call tag (grammar_json.h's tool_call_tags()).
//   RawToolValue: a raw tool-call parameter value (grammar_tool.cpp) ending with "\n</parameter>": the text
//     before it is a word of `value` and contains no tool-call tag.
// `key` identifies `value` (it becomes part of the signature). nullptr when no string can be written.
enum class StringLexerMode : uint8_t { Json, JsonToolSafe, RawToolValue };
std::shared_ptr<const Lexer> string_lexer(const ByteDfa& value, StringLexerMode mode, const std::string& key);

}  // namespace qrig::text::grammar
