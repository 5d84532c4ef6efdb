// Builds the lexer tables of grammar_lexer.h: the base DFA (UTF-8 / JSON string body) run in product with an
// Aho-Corasick automaton of the patterns, states numbered in breadth-first order so that equal definitions
// give equal numberings.
#include "text/grammar_lexer.h"

#include <array>
#include <deque>
#include <map>
#include <utility>

namespace qrig::text::grammar {

namespace {

// Base DFA states. S0 is a character boundary; C1..F4 are inside a UTF-8 sequence (F0/F4/E0/ED restrict the
// first continuation byte so that only valid scalar values pass); ESC..L3 walk a JSON escape, including a
// \uD800-\uDBFF high surrogate that must be followed by a \uDC00-\uDFFF escape.
enum BaseState : uint8_t { S0, C1, C2, C3, E0, ED, F0, F4, ESC, U0, U1, U1D, U2, U3, H2, H3, LBS, LU, L0, L1, L2, L3, BFinal };
constexpr uint8_t kBaseDead = 0xFF;

struct BaseStep {
  uint8_t next = kBaseDead;
  bool char_start = false;
};

bool is_hex(uint8_t b) { return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }
bool in(uint8_t b, uint8_t lo, uint8_t hi) { return b >= lo && b <= hi; }

BaseStep base_step(LexBase base, uint8_t s, uint8_t b) {
  auto to = [](uint8_t n, bool start = false) { return BaseStep{n, start}; };
  const bool json = base != LexBase::Utf8Text;
  switch (s) {
    case S0:
      if (b < 0x80) {
        if (!json) return to(S0, true);
        if (b == '"') return to(BFinal);
        if (b < 0x20) return {};
        if (b == '\\') return base == LexBase::JsonString ? to(ESC, true) : BaseStep{};
        return to(S0, true);
      }
      if (in(b, 0xC2, 0xDF)) return to(C1, true);
      if (b == 0xE0) return to(E0, true);
      if (b == 0xED) return to(ED, true);
      if (in(b, 0xE1, 0xEF)) return to(C2, true);
      if (b == 0xF0) return to(F0, true);
      if (in(b, 0xF1, 0xF3)) return to(C3, true);
      if (b == 0xF4) return to(F4, true);
      return {};
    case C1: return in(b, 0x80, 0xBF) ? to(S0) : BaseStep{};
    case C2: return in(b, 0x80, 0xBF) ? to(C1) : BaseStep{};
    case C3: return in(b, 0x80, 0xBF) ? to(C2) : BaseStep{};
    case E0: return in(b, 0xA0, 0xBF) ? to(C1) : BaseStep{};
    case ED: return in(b, 0x80, 0x9F) ? to(C1) : BaseStep{};
    case F0: return in(b, 0x90, 0xBF) ? to(C2) : BaseStep{};
    case F4: return in(b, 0x80, 0x8F) ? to(C2) : BaseStep{};
    case ESC:
      if (b == 'u') return to(U0);
      for (char c : std::string_view("\"\\/bfnrt"))
        if (b == static_cast<uint8_t>(c)) return to(S0);
      return {};
    case U0: return b == 'd' || b == 'D' ? to(U1D) : is_hex(b) ? to(U1) : BaseStep{};
    case U1: return is_hex(b) ? to(U2) : BaseStep{};
    case U1D:
      if (in(b, '0', '7')) return to(U2);
      if (in(b, '8', '9') || in(b, 'a', 'b') || in(b, 'A', 'B')) return to(H2);
      return {};  // \uDC00-\uDFFF alone: a lone low surrogate, which JSON parsers reject
    case U2: return is_hex(b) ? to(U3) : BaseStep{};
    case U3: return is_hex(b) ? to(S0) : BaseStep{};
    case H2: return is_hex(b) ? to(H3) : BaseStep{};
    case H3: return is_hex(b) ? to(LBS) : BaseStep{};
    case LBS: return b == '\\' ? to(LU) : BaseStep{};
    case LU: return b == 'u' ? to(L0) : BaseStep{};
    case L0: return b == 'd' || b == 'D' ? to(L1) : BaseStep{};
    case L1: return in(b, 'c', 'f') || in(b, 'C', 'F') ? to(L2) : BaseStep{};
    case L2: return is_hex(b) ? to(L3) : BaseStep{};
    case L3: return is_hex(b) ? to(S0) : BaseStep{};
    default: return {};
  }
}

}  // namespace

PatternMatcher::PatternMatcher(const std::vector<LexPattern>& patterns) {
  std::vector<int> depth{0}, own(1, -1);
  std::vector<std::array<int, 256>> child(1);
  child[0].fill(-1);
  std::vector<bool> on_exit_path{true};
  for (size_t p = 0; p < patterns.size(); ++p) {
    int n = 0;
    for (unsigned char c : patterns[p].text) {
      if (child[n][c] < 0) {
        child[n][c] = static_cast<int>(child.size());
        child.emplace_back().fill(-1);
        depth.push_back(depth[n] + 1);
        own.push_back(-1);
        on_exit_path.push_back(false);
      }
      n = child[n][c];
      if (patterns[p].exit) on_exit_path[n] = true;
    }
    if (own[n] >= 0) throw GrammarError("lexer pattern given twice: " + patterns[p].text);
    own[n] = static_cast<int>(p);
  }
  const size_t n_nodes = child.size();
  go.assign(n_nodes, {});
  action.assign(n_nodes, None);
  pending.assign(n_nodes, 0);
  std::vector<int> fail(n_nodes, 0);
  std::deque<int> queue;
  for (int c = 0; c < 256; ++c) {
    const int k = child[0][c];
    go[0][c] = static_cast<uint16_t>(k < 0 ? 0 : k);
    if (k >= 0) queue.push_back(k);
  }
  auto settle = [&](int n) {
    if (own[n] >= 0) action[n] = patterns[own[n]].exit ? Exit : Reject;
    else action[n] = action[fail[n]];
    pending[n] = on_exit_path[n] ? static_cast<uint16_t>(depth[n]) : pending[fail[n]];
  };
  while (!queue.empty()) {
    const int n = queue.front();
    queue.pop_front();
    settle(n);
    for (int c = 0; c < 256; ++c) {
      const int k = child[n][c];
      if (k < 0) {
        go[n][c] = go[fail[n]][c];
      } else {
        fail[k] = n == 0 ? 0 : go[fail[n]][c];
        go[n][c] = static_cast<uint16_t>(k);
        queue.push_back(k);
      }
    }
  }
}

std::string LexerDef::signature() const {
  if (base == LexBase::Dfa) throw GrammarError("a Dfa lexer is built by string_lexer, not from a LexerDef");
  std::string s = base == LexBase::Utf8Text ? "text" : base == LexBase::JsonString ? "json" : "json-plain";
  for (const LexPattern& p : patterns) {
    s += p.exit ? "|exit:" : "|reject:";
    s += std::to_string(p.text.size()) + ":" + p.text;
  }
  return s;
}

Lexer::Lexer(const LexerDef& def) : base_(def.base), signature_(def.signature()) {
  size_t exits = 0;
  for (const LexPattern& p : def.patterns) {
    if (p.text.empty()) throw GrammarError("empty lexer pattern");
    for (unsigned char c : p.text)
      if (c >= 0x80) throw GrammarError("lexer patterns must be ASCII: " + p.text);
    exits += p.exit;
  }
  if (def.base == LexBase::Utf8Text && exits != 1)
    throw GrammarError("a text lexer needs exactly one exit pattern");
  if (def.base != LexBase::Utf8Text && exits != 0) throw GrammarError("a JSON string lexer ends at its quote");
  const PatternMatcher pm(def.patterns);
  uint16_t exit_len = 0;
  for (const LexPattern& p : def.patterns)
    if (p.exit) exit_len = static_cast<uint16_t>(p.text.size());

  // Product states (base, matcher node) in breadth-first order from (S0, root); the final state is one
  // state of its own, numbered when first reached.
  std::map<std::pair<uint8_t, uint16_t>, uint16_t> ids;
  std::vector<std::pair<uint8_t, uint16_t>> states;
  auto id_of = [&](uint8_t b, uint16_t m) {
    auto [it, fresh] = ids.emplace(std::make_pair(b, m), static_cast<uint16_t>(states.size()));
    if (fresh) {
      if (states.size() >= kDead) throw GrammarError("lexer too large");
      states.emplace_back(b, m);
    }
    return it->second;
  };
  id_of(S0, 0);
  for (size_t i = 0; i < states.size(); ++i) {
    table_.resize(states.size() * 256, kDead);
    const auto [b, m] = states[i];
    if (b == BFinal) {
      final_ = static_cast<uint16_t>(i);
      continue;
    }
    for (int c = 0; c < 256; ++c) {
      const BaseStep st = base_step(def.base, b, static_cast<uint8_t>(c));
      if (st.next == kBaseDead) continue;
      uint16_t next;
      if (st.next == BFinal) {
        next = id_of(BFinal, 0);
      } else {
        const uint16_t m2 = pm.go[m][c];
        if (pm.action[m2] == PatternMatcher::Reject) continue;
        next = pm.action[m2] == PatternMatcher::Exit ? id_of(BFinal, 0) : id_of(st.next, m2);
      }
      table_[i * 256 + c] = static_cast<uint16_t>(next | (st.char_start ? kCharStart : 0));
    }
  }
  table_.resize(states.size() * 256, kDead);
  pending_.resize(states.size());
  for (size_t i = 0; i < states.size(); ++i)
    pending_[i] = states[i].first == BFinal ? exit_len : pm.pending[states[i].second];
  if (final_ == kDead) throw GrammarError("lexer can never end: " + signature_);
}

Lexer::Lexer(std::string signature, std::vector<uint16_t> table, std::vector<uint16_t> pending, uint16_t final_state)
    : base_(LexBase::Dfa), signature_(std::move(signature)), table_(std::move(table)), pending_(std::move(pending)),
      final_(final_state) {
  if (pending_.empty() || pending_.size() >= kDead || table_.size() != pending_.size() * 256 || final_ >= pending_.size())
    throw GrammarError("malformed lexer table: " + signature_);
}

uint16_t Lexer::run(uint16_t state, std::string_view bytes) const {
  for (unsigned char c : bytes) {
    if (state == kDead || is_final(state)) return kDead;
    const uint16_t e = next(state, c);
    state = e == kDead ? kDead : static_cast<uint16_t>(e & ~kCharStart);
  }
  return state;
}

}  // namespace qrig::text::grammar
