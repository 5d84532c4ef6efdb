// The pushdown machine behind TokenGrammar (grammar.h): threads over the flattened grammar of
// grammar_rules.h, the token mask (cached lexeme token sets + one trie walk), accept() and the state
// canonicalisation after each token.
#include "text/grammar.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "text/grammar_rules.h"

namespace qrig::text {

using grammar::ElemKind;
using grammar::Lexer;

namespace {

constexpr uint32_t kEmpty = UINT32_MAX;  // the empty stack
constexpr uint32_t kDone = UINT32_MAX;   // position of a thread that finished the grammar
constexpr size_t kMaxThreads = 512;      // committed threads (ambiguity guard)
constexpr size_t kMaxLevelThreads = 1 << 16;

// A position in the grammar: an element (Bytes, Lex or Perm...) with its lexer state or "seen" mask
// (sub), the characters a counted lexeme has produced, and a stack of return frames.
struct Thread {
  uint32_t stack;
  uint32_t pos;
  uint32_t sub;
  uint32_t count;
  bool operator==(const Thread&) const = default;
  auto key() const { return std::tie(pos, sub, count, stack); }
};

struct Frame {
  uint32_t parent;
  uint32_t ret_pos;
  uint32_t ret_sub;
};

std::string show_bytes(const std::string& s) {
  std::string r;
  for (unsigned char c : s) {
    if (c == '\n') r += "\\n";
    else if (c == '"' || c == '\\') r += std::string("\\") + static_cast<char>(c);
    else if (c < 0x20 || c >= 0x7F) r += "\\x" + std::string(1, "0123456789abcdef"[c >> 4]) + "0123456789abcdef"[c & 15];
    else r += static_cast<char>(c);
  }
  return "\"" + r + "\"";
}

}  // namespace

struct TokenGrammar::Impl {
  grammar::Grammar g;
  std::shared_ptr<const TokenVocab> vocab;
  std::vector<Thread> threads;  // the committed state
  bool finished = false;
  // Frames of the committed threads come first; scratch frames pushed while computing a mask or a token are
  // appended after them and dropped again.
  mutable std::vector<Frame> frames;
  size_t committed_frames = 0;
  mutable std::vector<std::vector<Thread>> levels;  // per trie depth
  mutable std::vector<size_t> marks;                // frames in use at each depth
  mutable std::vector<Thread> tmp_a, tmp_b;
  mutable std::vector<uint64_t> bits;
  // Per lexer, per state: the vocabulary's cached token sets (looked up once per grammar).
  mutable std::vector<std::vector<std::shared_ptr<const TokenVocab::LexTokens>>> lex_memo;
  mutable std::vector<std::vector<std::shared_ptr<const std::vector<int16_t>>>> peak_memo;

  uint32_t push(uint32_t stack, uint32_t ret_pos, uint32_t ret_sub) const {
    frames.push_back(Frame{stack, ret_pos, ret_sub});
    return static_cast<uint32_t>(frames.size() - 1);
  }

  // Epsilon closure: from element `pos` (with `sub` for a Perm re-entered after a member), follow calls,
  // returns and skips until elements that consume a byte; append those threads to out.
  void enter(uint32_t stack, uint32_t pos, uint32_t sub, std::vector<Thread>& out) const {
    for (;;) {
      const grammar::Elem e = g.elems[pos];
      switch (e.kind) {
        case ElemKind::Bytes: out.push_back(Thread{stack, pos, 0, 0}); return;
        case ElemKind::Lex: out.push_back(Thread{stack, pos, g.lex_insts[e.arg].start, 0}); return;
        case ElemKind::Call: {
          const auto& alts = g.rules[e.arg];
          if (alts.empty()) return;
          // A call in tail position returns straight to the caller's caller: no frame.
          const uint32_t st = g.elems[pos + 1].kind == ElemKind::End ? stack : push(stack, pos + 1, 0);
          for (size_t i = 0; i + 1 < alts.size(); ++i) enter(st, alts[i], 0, out);
          stack = st;
          pos = alts.back();
          sub = 0;
          continue;
        }
        case ElemKind::Perm: {
          const grammar::PermGroup& pg = g.perms[e.arg];
          for (size_t i = 0; i < pg.members.size(); ++i) {
            if ((sub >> i) & 1) continue;
            const uint32_t st = push(stack, pos, sub | (uint32_t{1} << i));
            for (uint32_t alt : g.rules[pg.members[i]]) enter(st, alt, 0, out);
          }
          if ((sub & pg.required) != pg.required) return;
          ++pos;
          sub = 0;
          continue;
        }
        case ElemKind::End: {
          if (stack == kEmpty) {
            out.push_back(Thread{kEmpty, kDone, 0, 0});
            return;
          }
          const Frame f = frames[stack];
          stack = f.parent;
          pos = f.ret_pos;
          sub = f.ret_sub;
          continue;
        }
      }
    }
  }

  // One byte for one thread.
  void step(const Thread& t, uint8_t byte, std::vector<Thread>& out) const {
    if (t.pos == kDone) return;
    const grammar::Elem e = g.elems[t.pos];
    if (e.kind == ElemKind::Bytes) {
      if (grammar::has(g.sets[e.arg], byte)) enter(t.stack, t.pos + 1, 0, out);
      return;
    }
    // Lex (threads never rest on other kinds)
    const grammar::LexInst& li = g.lex_insts[e.arg];
    const Lexer& lx = *g.lexers[li.lexer];
    const uint16_t entry = lx.next(static_cast<uint16_t>(t.sub), byte);
    if (entry == Lexer::kDead) return;
    const auto s = static_cast<uint16_t>(entry & ~Lexer::kCharStart);
    const bool counted = li.min_chars != 0 || li.max_chars != UINT32_MAX;
    const uint32_t count = t.count + (counted && (entry & Lexer::kCharStart) ? 1 : 0);
    if (counted) {
      // Characters of the text proper: those that may still be the exit pattern do not count.
      const uint64_t chars = count - std::min<uint32_t>(count, lx.pending_chars(s));
      if (chars > li.max_chars) return;
      if (lx.is_final(s) && chars < li.min_chars) return;
    }
    if (lx.is_final(s)) enter(t.stack, t.pos + 1, 0, out);
    else out.push_back(Thread{t.stack, t.pos, s, count});
  }

  static void dedupe(std::vector<Thread>& v) {
    if (v.size() < 2) return;
    if (v.size() == 2) {
      if (v[0] == v[1]) v.pop_back();
      return;
    }
    std::sort(v.begin(), v.end(), [](const Thread& a, const Thread& b) { return a.key() < b.key(); });
    v.erase(std::unique(v.begin(), v.end()), v.end());
  }

  // Advances `cur` (never tmp_b itself) over `bytes`. Returns the index of the byte that killed every
  // thread, or bytes.size() when some thread survived.
  size_t run(std::vector<Thread>& cur, const std::string& bytes) const {
    std::vector<Thread>& next = tmp_b;
    for (size_t k = 0; k < bytes.size(); ++k) {
      next.clear();
      for (const Thread& t : cur) step(t, static_cast<uint8_t>(bytes[k]), next);
      dedupe(next);
      if (next.size() > kMaxLevelThreads) throw GrammarError("grammar too ambiguous (thread limit)");
      if (next.empty()) return k;
      cur.swap(next);
    }
    return bytes.size();
  }

  const TokenVocab::LexTokens& lex_tokens(uint32_t lexer, uint16_t state) const {
    if (lex_memo.size() != g.lexers.size()) lex_memo.resize(g.lexers.size());
    auto& per = lex_memo[lexer];
    if (per.size() <= state) per.resize(static_cast<size_t>(state) + 1);
    if (!per[state]) per[state] = vocab->lex_tokens(*g.lexers[lexer], state);
    return *per[state];
  }

  const std::vector<int16_t>& lex_peaks(uint32_t lexer, uint16_t state) const {
    if (peak_memo.size() != g.lexers.size()) peak_memo.resize(g.lexers.size());
    auto& per = peak_memo[lexer];
    if (per.size() <= state) per.resize(static_cast<size_t>(state) + 1);
    if (!per[state]) per[state] = vocab->lex_peaks(*g.lexers[lexer], state);
    return *per[state];
  }

  void set_bit(uint32_t id) const { bits[id >> 6] |= uint64_t{1} << (id & 63); }
  bool get_bit(uint32_t id) const { return (bits[id >> 6] >> (id & 63)) & 1; }

  void compute_mask() const {
    bits.assign(vocab->n_words(), 0);
    if (finished) {
      for (int32_t id : vocab->eog_ids()) set_bit(static_cast<uint32_t>(id));
      return;
    }
    bool done = false;
    std::vector<Thread>& roots = levels.at(0);
    roots.clear();
    for (const Thread& t : threads) {
      if (t.pos == kDone) {
        done = true;
        continue;
      }
      const grammar::Elem e = g.elems[t.pos];
      if (e.kind == ElemKind::Lex) {
        // Tokens that stay inside the lexeme do not depend on the rest of the grammar (cached per lexer
        // state); with a length limit within reach of one token, each also needs its character peak.
        const grammar::LexInst& li = g.lex_insts[e.arg];
        const auto state = static_cast<uint16_t>(t.sub);
        const TokenVocab::LexTokens& lt = lex_tokens(li.lexer, state);
        if (li.max_chars == UINT32_MAX || uint64_t{t.count} + vocab->max_token_bytes() <= li.max_chars) {
          for (size_t w = 0; w < bits.size(); ++w) bits[w] |= lt.inside[w];
        } else {
          const std::vector<int16_t>& peak = lex_peaks(li.lexer, state);
          const int64_t room = int64_t{li.max_chars} - int64_t{t.count};
          const int16_t* p = peak.data();  // padded to whole words
          for (size_t w = 0; w < bits.size(); ++w, p += 64) {
            uint64_t fits = 0;
            for (unsigned k = 0; k < 64; ++k) fits |= static_cast<uint64_t>(p[k] <= room) << k;
            bits[w] |= lt.inside[w] & fits;
          }
        }
        if (li.min_chars == 0 && li.max_chars == UINT32_MAX) {
          // Uncounted: every exit token reaches the same state where the lexeme ends; only its suffix differs.
          for (const auto& group : lt.exit_groups) {
            std::vector<Thread>& cur = tmp_a;
            cur.clear();
            enter(t.stack, t.pos + 1, 0, cur);
            if (!cur.empty() && run(cur, group.suffix) == group.suffix.size())
              for (int32_t id : group.ids) set_bit(static_cast<uint32_t>(id));
            frames.resize(committed_frames);
          }
        } else {
          for (int32_t id : lt.exits) {
            if (get_bit(static_cast<uint32_t>(id))) continue;
            std::vector<Thread>& cur = tmp_a;
            cur.assign(1, t);
            if (run(cur, vocab->bytes(id)) == vocab->bytes(id).size()) set_bit(static_cast<uint32_t>(id));
            frames.resize(committed_frames);
          }
        }
        continue;
      }
      roots.push_back(t);
    }
    if (!roots.empty()) walk();
    if (done)
      for (int32_t id : vocab->eog_ids()) set_bit(static_cast<uint32_t>(id));
  }

  // Depth-first over the trie from levels[0]: level d holds the threads after the first d bytes of the
  // current node's path; a node whose level is empty is skipped with its subtree.
  void walk() const {
    const auto& nodes = vocab->nodes();
    const auto& toks = vocab->trie_tokens();
    marks[0] = frames.size();
    for (size_t i = 1; i < nodes.size();) {
      const TokenVocab::Node& nd = nodes[i];
      const size_t d = nd.depth;
      frames.resize(marks[d - 1]);
      std::vector<Thread>& out = levels[d];
      out.clear();
      for (const Thread& t : levels[d - 1]) step(t, nd.byte, out);
      if (out.empty()) {
        i = nd.end;
        continue;
      }
      dedupe(out);
      if (out.size() > kMaxLevelThreads) throw GrammarError("grammar too ambiguous (thread limit)");
      marks[d] = frames.size();
      for (uint32_t k = 0; k < nd.n_tok; ++k) set_bit(static_cast<uint32_t>(toks[nd.tok_begin + k]));
      ++i;
    }
    frames.resize(committed_frames);
  }

  // Makes `cur` the committed state: identical threads merged (comparing whole stacks), frames rebuilt
  // compactly with shared prefixes.
  void commit(const std::vector<Thread>& cur) {
    using Stack = std::vector<std::pair<uint32_t, uint32_t>>;  // (ret_pos, ret_sub), bottom first
    std::map<std::tuple<uint32_t, uint32_t, uint32_t, Stack>, bool> unique;
    for (const Thread& t : cur) {
      Stack st;
      for (uint32_t f = t.stack; f != kEmpty; f = frames[f].parent) st.emplace_back(frames[f].ret_pos, frames[f].ret_sub);
      std::reverse(st.begin(), st.end());
      unique.emplace(std::make_tuple(t.pos, t.sub, t.count, std::move(st)), true);
    }
    if (unique.size() > kMaxThreads)
      throw GrammarError("grammar too ambiguous: " + std::to_string(unique.size()) + " parses at once");
    std::vector<Frame> fresh;
    std::map<std::tuple<uint32_t, uint32_t, uint32_t>, uint32_t> ids;
    std::vector<Thread> next;
    for (const auto& [k, unused] : unique) {
      uint32_t parent = kEmpty;
      for (const auto& [ret_pos, ret_sub] : std::get<3>(k)) {
        auto [it, is_new] = ids.emplace(std::make_tuple(parent, ret_pos, ret_sub), static_cast<uint32_t>(fresh.size()));
        if (is_new) fresh.push_back(Frame{parent, ret_pos, ret_sub});
        parent = it->second;
      }
      next.push_back(Thread{parent, std::get<0>(k), std::get<1>(k), std::get<2>(k)});
    }
    frames = std::move(fresh);
    committed_frames = frames.size();
    threads = std::move(next);
  }
};

TokenGrammar::TokenGrammar(grammar::Grammar&& g, std::shared_ptr<const TokenVocab> vocab) : impl_(std::make_unique<Impl>()) {
  if (!vocab) throw GrammarError("TokenGrammar needs a vocabulary");
  impl_->g = std::move(g);
  impl_->vocab = std::move(vocab);
  impl_->levels.resize(impl_->vocab->max_token_bytes() + 1);
  impl_->marks.resize(impl_->vocab->max_token_bytes() + 1);
  std::vector<Thread> start;
  impl_->enter(kEmpty, 0, 0, start);
  impl_->commit(start);
}

TokenGrammar::~TokenGrammar() = default;

void TokenGrammar::allowed_bits(std::vector<uint64_t>& words) const {
  impl_->compute_mask();
  words = impl_->bits;
}

void TokenGrammar::allowed(std::vector<bool>& mask) const {
  impl_->compute_mask();
  const auto& bits = impl_->bits;
  mask.assign(static_cast<size_t>(impl_->vocab->size()), false);
  for (size_t w = 0; w < bits.size(); ++w)
    for (uint64_t v = bits[w]; v; v &= v - 1) mask[w * 64 + static_cast<size_t>(__builtin_ctzll(v))] = true;
}

bool TokenGrammar::accepts(int32_t token) const {
  const Impl& m = *impl_;
  if (m.finished || token < 0 || token >= m.vocab->size()) return false;
  if (m.vocab->is_eog(token)) return complete();
  if (!m.vocab->is_text(token)) return false;
  std::vector<Thread> cur = m.threads;
  const size_t ok = m.run(cur, m.vocab->bytes(token));
  m.frames.resize(m.committed_frames);
  return ok == m.vocab->bytes(token).size();
}

void TokenGrammar::accept(int32_t token) {
  Impl& m = *impl_;
  if (m.finished) throw GrammarError("token " + std::to_string(token) + " after the end of generation");
  if (token < 0 || token >= m.vocab->size())
    throw GrammarError("token id " + std::to_string(token) + " is outside the vocabulary");
  if (m.vocab->is_eog(token)) {
    if (!complete()) throw GrammarError("end of generation (token " + std::to_string(token) + ") before the output is complete");
    m.finished = true;
    return;
  }
  if (!m.vocab->is_text(token))
    throw GrammarError("token " + std::to_string(token) + " is a control token and never allowed here");
  const std::string& bytes = m.vocab->bytes(token);
  std::vector<Thread> cur = m.threads;
  size_t failed;
  try {
    failed = m.run(cur, bytes);
  } catch (...) {
    m.frames.resize(m.committed_frames);
    throw;
  }
  if (failed != bytes.size()) {
    m.frames.resize(m.committed_frames);
    throw GrammarError("token " + std::to_string(token) + " " + show_bytes(bytes) + " is not allowed here (byte " +
                       std::to_string(failed) + " breaks the grammar)");
  }
  try {
    m.commit(cur);
  } catch (...) {
    m.frames.resize(m.committed_frames);
    throw;
  }
}

bool TokenGrammar::complete() const {
  if (impl_->finished) return true;
  for (const Thread& t : impl_->threads)
    if (t.pos == kDone) return true;
  return false;
}

bool TokenGrammar::finished() const { return impl_->finished; }

const TokenVocab& TokenGrammar::vocab() const { return *impl_->vocab; }

}  // namespace qrig::text
