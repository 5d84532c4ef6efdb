// The vocabulary as constrained decoding sees it: each token's bytes, which ids may never be produced as text
// (control tokens, padding) and which end the generation, laid out as a byte trie in depth-first order so a
// grammar can compute its token mask in one walk that shares the work of common prefixes and skips whole
// subtrees at the first byte the grammar refuses.
//
// Built once per tokenizer (about 0.1 s for a 248k vocabulary) and shared by every grammar: TokenVocab::of()
// caches it per Tokenizer. It also caches, per lexer state (grammar_lexer.h), the set of tokens that stay
// inside the lexeme and the few that may end it, which is what makes a mask inside a long string cheap.
// Thread-safe: grammars of concurrent requests share one TokenVocab.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/grammar_error.h"

namespace qrig::text {

class Tokenizer;

namespace grammar {
class Lexer;
}

class TokenVocab {
 public:
  // token_bytes[id]: the bytes the token stands for ("" = never produced); is_control[id]: never produced as
  // text; eog: the end-of-generation ids (allowed only where the grammar is complete, whatever their type).
  // Throws GrammarError on inconsistent sizes or eog ids out of range.
  TokenVocab(std::vector<std::string> token_bytes, std::vector<bool> is_control, std::vector<int32_t> eog);

  // Ids 0 .. n_real()-1 with their bytes (decode), CONTROL / UNUSED types excluded - except the Qwen tags
  // <tool_call>, </tool_call>, <think>, </think>, which are text even where a GGUF marks them CONTROL (the
  // model writes them as single tokens) - and eog_ids() as the end.
  // Cached per tokenizer, keyed by its vocabulary's address and a fingerprint (every token's length and type,
  // the bytes of every 8th token), so a new tokenizer at an old address is not confused with it. The
  // fingerprint costs about 1 ms per call for 150k tokens: a server should keep the shared_ptr.
  static std::shared_ptr<const TokenVocab> of(const Tokenizer& tok);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  // May appear as text: not control, not end-of-generation, non-empty bytes.
  bool is_text(int32_t id) const { return text_[static_cast<size_t>(id)]; }
  bool is_eog(int32_t id) const { return eog_flag_[static_cast<size_t>(id)]; }
  const std::vector<int32_t>& eog_ids() const { return eog_; }
  // The longest token, in bytes.
  size_t max_token_bytes() const { return max_len_; }
  size_t n_words() const { return (bytes_.size() + 63) / 64; }

  // Trie in depth-first (pre-)order; node 0 is the root (empty prefix). The subtree of node i is
  // [i, end); its children follow it directly. Only text tokens are in the trie.
  struct Node {
    uint32_t end;        // one past the last node of the subtree
    uint32_t tok_begin;  // tokens whose bytes end here: trie_tokens()[tok_begin, tok_begin + n_tok)
    uint32_t n_tok;
    uint16_t depth;  // bytes from the root
    uint8_t byte;    // the byte on the edge from the parent
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& trie_tokens() const { return trie_tokens_; }

  // Tokens relative to one lexer state: `inside` (bitset over ids, 64 per word) = those the lexer consumes
  // entirely without ending; `exits` = those whose bytes end the lexeme somewhere (what follows must be
  // checked against the rest of the grammar). Character-count limits are not applied here. Computed on
  // first use, then cached (within a memory bound, see kCacheBytes).
  struct LexTokens {
    std::vector<uint64_t> inside;
    std::vector<int32_t> exits;
    // The exits again, grouped by the bytes that follow the end of the lexeme: without a length limit
    // the lexeme part is the same for all, so one check of the suffix decides the whole group.
    struct ExitGroup {
      std::string suffix;
      std::vector<int32_t> ids;
    };
    std::vector<ExitGroup> exit_groups;
  };
  std::shared_ptr<const LexTokens> lex_tokens(const grammar::Lexer& lexer, uint16_t state) const;
  // For length-limited lexemes near their limit: per token id (meaningful for `inside` tokens), the largest
  // value of (characters started so far - lexer pending_chars) over the token's character starts, i.e. the
  // token fits iff count + peak <= max. Saturates at +-32767; padded to n_words() * 64 entries. Computed on
  // first use, then cached.
  std::shared_ptr<const std::vector<int16_t>> lex_peaks(const grammar::Lexer& lexer, uint16_t state) const;

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> text_;
  std::vector<bool> eog_flag_;
  std::vector<int32_t> eog_;
  size_t max_len_ = 0;
  std::vector<Node> nodes_;
  std::vector<int32_t> trie_tokens_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::string, std::shared_ptr<const LexTokens>> lex_cache_;
  mutable std::unordered_map<std::string, std::shared_ptr<const std::vector<int16_t>>> peak_cache_;
  // Both caches together hold at most kCacheBytes; the oldest entries go first (grammars keep the sets they
  // use alive through their own shared_ptr). Patterns in schemas make lexers per request, so the caches
  // would otherwise grow with every new pattern a client sends.
  static constexpr size_t kCacheBytes = size_t{192} << 20;
  mutable std::deque<std::pair<std::string, size_t>> cache_order_;  // (key, bytes); key prefixed L/P
  mutable size_t cache_bytes_ = 0;
  void remember(const std::string& key, size_t bytes) const;  // mutex_ held
};

}  // namespace qrig::text
