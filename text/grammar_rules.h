// The grammar form that constrained decoding interprets: rules of alternatives, each alternative a sequence of
// items (one byte out of a set, a call of another rule, a lexeme, or a permutation group), flattened into one
// element array that the machine of grammar.cpp walks with a stack. The JSON-schema and tool-call compilers
// (grammar_json.cpp, grammar_tool.cpp) write rules through GrammarBuilder, which then checks and cleans the
// result: alternatives that can never finish are removed (so every prefix the machine accepts can still be
// completed and a mask is never empty before the end), and left recursion is rejected (it would loop).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/grammar_error.h"
#include "text/grammar_lexer.h"

namespace qrig::text::grammar {

using ByteSet = std::array<uint64_t, 4>;
inline bool has(const ByteSet& s, uint8_t b) { return (s[b >> 6] >> (b & 63)) & 1; }
inline void add(ByteSet& s, uint8_t b) { s[b >> 6] |= uint64_t{1} << (b & 63); }
ByteSet byte_set(std::string_view chars);

enum class ElemKind : uint8_t {
  End,    // end of an alternative: return to the caller
  Bytes,  // one byte of sets[arg]
  Call,   // rules[arg]
  Lex,    // a lexeme of lex_insts[arg]
  Perm,   // perms[arg]: its members in any order, each at most once, the required ones all present
};

struct Elem {
  ElemKind kind;
  uint32_t arg;
};

struct LexInst {
  uint32_t lexer;  // index into Grammar::lexers
  uint32_t min_chars = 0;
  uint32_t max_chars = UINT32_MAX;  // UINT32_MAX = unbounded
  uint16_t start = 0;               // lexer state to start in
};

struct PermGroup {
  std::vector<uint32_t> members;  // rule ids; member i is bit i of the thread's "seen" mask (at most 32)
  uint32_t required = 0;          // mask of members that must appear
};

struct Grammar {
  std::vector<Elem> elems;  // elems[0] = Call(root), elems[1] = End
  std::vector<std::vector<uint32_t>> rules;  // per rule: the element index where each alternative starts
  std::vector<ByteSet> sets;
  std::vector<std::shared_ptr<const Lexer>> lexers;
  std::vector<LexInst> lex_insts;
  std::vector<PermGroup> perms;
};

struct Item {
  ElemKind kind;
  uint32_t arg;
};

class GrammarBuilder {
 public:
  uint32_t new_rule();
  // Adds an alternative (an empty one matches the empty string).
  void add_alt(uint32_t rule, std::vector<Item> items);
  // A rule with one alternative per element of `alts`.
  uint32_t rule_of(std::vector<std::vector<Item>> alts);
  size_t n_rules() const { return alts_.size(); }

  // Items; literal bytes become one Bytes item each.
  void lit(std::vector<Item>& seq, std::string_view bytes);
  Item set(const ByteSet& s);
  static Item call(uint32_t rule) { return Item{ElemKind::Call, rule}; }
  // A lexeme of `def` starting in lexer state `start` (0 = its beginning; see Lexer::run).
  Item lex(const LexerDef& def, uint32_t min_chars = 0, uint32_t max_chars = UINT32_MAX, uint16_t start = 0);
  // A lexeme of a prebuilt lexer (string_lexer, grammar_lexer.h), registered by its signature.
  Item lex(std::shared_ptr<const Lexer> lexer, uint32_t min_chars = 0, uint32_t max_chars = UINT32_MAX, uint16_t start = 0);
  Item perm(PermGroup group);
  // The lexer of a definition (built once per builder).
  const Lexer& lexer(const LexerDef& def);

  // Prunes alternatives that cannot finish, checks for left recursion, lays the elements out. Throws
  // GrammarError when the root cannot finish at all ("admits no value") or a rule is left-recursive.
  Grammar finish(uint32_t root);

 private:
  std::vector<std::vector<std::vector<Item>>> alts_;
  std::vector<ByteSet> sets_;
  std::map<ByteSet, uint32_t> set_ids_;
  std::vector<std::shared_ptr<const Lexer>> lexers_;
  std::map<std::string, uint32_t> lexer_ids_;
  std::vector<LexInst> lex_insts_;
  std::vector<PermGroup> perms_;
};

// Qwen reasoning before the answer, for prompts that end inside <think>: any valid UTF-8 text up to and
// including the first "</think>", then "\n\n" (appended to seq).
void append_reasoning(GrammarBuilder& b, std::vector<Item>& seq);

}  // namespace qrig::text::grammar
