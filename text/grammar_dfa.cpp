// ByteNfa / ByteDfa (grammar_dfa.h): UTF-8 expansion of code point sets, subset construction with the ^ / $
// assertions, Moore minimisation over byte classes, products (intersection, character-count limits), and
// the emission of a DFA as right-linear grammar rules.
#include "text/grammar_dfa.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace qrig::text::grammar {

void CodePointSet::normalise() {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (const auto& [lo, hi] : ranges) {
    if (lo > hi) continue;
    if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
    else out.emplace_back(lo, hi);
  }
  ranges = std::move(out);
}

CodePointSet CodePointSet::complement() const {
  CodePointSet s = *this;
  s.normalise();
  CodePointSet out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : s.ranges) {
    if (lo > next) out.add(next, lo - 1);
    next = hi + 1;
  }
  if (next <= 0x10FFFF) out.add(next, 0x10FFFF);
  out.normalise();
  return out;
}

uint32_t ByteNfa::add_state() {
  out.emplace_back();
  return static_cast<uint32_t>(out.size() - 1);
}

void ByteNfa::literal(uint32_t a, uint32_t b, std::string_view text) {
  if (text.empty()) {
    eps(a, b);
    return;
  }
  uint32_t cur = a;
  for (size_t i = 0; i < text.size(); ++i) {
    const uint32_t nxt = i + 1 == text.size() ? b : add_state();
    const auto c = static_cast<uint8_t>(text[i]);
    bytes(cur, nxt, c, c);
    cur = nxt;
  }
}

namespace {

int utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void utf8_encode(uint32_t cp, uint8_t* out) {
  switch (utf8_len(cp)) {
    case 1: out[0] = static_cast<uint8_t>(cp); break;
    case 2:
      out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
      out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    case 3:
      out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    default:
      out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  }
}

// lo..hi share one encoded length; split until every piece is a product of byte ranges (the classic
// utf8-ranges split), then chain the ranges.
void utf8_piece(ByteNfa& n, uint32_t a, uint32_t b, uint32_t lo, uint32_t hi) {
  const int len = utf8_len(lo);
  for (int i = 1; i < len; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_piece(n, a, b, lo, lo | m);
        utf8_piece(n, a, b, (lo | m) + 1, hi);
        return;
      }
      if ((hi & m) != m) {
        utf8_piece(n, a, b, lo, (hi & ~m) - 1);
        utf8_piece(n, a, b, hi & ~m, hi);
        return;
      }
    }
  }
  uint8_t el[4], eh[4];
  utf8_encode(lo, el);
  utf8_encode(hi, eh);
  uint32_t cur = a;
  for (int i = 0; i < len; ++i) {
    const uint32_t nxt = i + 1 == len ? b : n.add_state();
    n.bytes(cur, nxt, el[i], eh[i]);
    cur = nxt;
  }
}

}  // namespace

void ByteNfa::add_code_points(uint32_t a, uint32_t b, const CodePointSet& set) {
  static constexpr std::pair<uint32_t, uint32_t> kPieces[] = {
      {0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, 0x10FFFF}};
  for (const auto& [lo, hi] : set.ranges)
    for (const auto& [plo, phi] : kPieces) {
      const uint32_t l = std::max(lo, plo), h = std::min(hi, phi);
      if (l <= h) utf8_piece(*this, a, b, l, h);
    }
}

bool ByteDfa::matches(std::string_view text) const {
  if (accept.empty()) return false;
  int32_t s = 0;
  for (unsigned char c : text) {
    s = step(s, c);
    if (s == kNone) return false;
  }
  return accept[static_cast<size_t>(s)];
}

int32_t ByteDfa::add_state(bool acc) {
  accept.push_back(acc);
  next.resize(accept.size() * 256, kNone);
  return static_cast<int32_t>(accept.size() - 1);
}

bool is_empty(const ByteDfa& d) {
  for (bool a : d.accept)
    if (a) return false;
  return true;
}

ByteDfa determinize(const ByteNfa& nfa, const std::string& what, size_t max_states) {
  using Set = std::vector<uint32_t>;
  std::vector<uint8_t> mark(nfa.size(), 0);
  // Epsilon closure; `begin`: the position is the start of the text (^ holds); `end`: also follow $ (used
  // only to decide acceptance).
  auto closure = [&](const Set& seed, bool begin, bool end) {
    Set out;
    std::vector<uint32_t> stack(seed.begin(), seed.end());
    for (uint32_t s : seed) mark[s] = 1;
    out = seed;
    while (!stack.empty()) {
      const uint32_t s = stack.back();
      stack.pop_back();
      for (const ByteNfa::Edge& e : nfa.out[s]) {
        const bool follow = e.kind == ByteNfa::EdgeKind::Eps || (begin && e.kind == ByteNfa::EdgeKind::Begin) ||
                            (end && e.kind == ByteNfa::EdgeKind::End);
        if (follow && !mark[e.to]) {
          mark[e.to] = 1;
          out.push_back(e.to);
          stack.push_back(e.to);
        }
      }
    }
    for (uint32_t s : out) mark[s] = 0;
    std::sort(out.begin(), out.end());
    return out;
  };
  ByteDfa d;
  std::map<Set, int32_t> ids;
  std::vector<Set> sets;
  std::vector<bool> at_begin;
  auto id_of = [&](const Set& s, bool begin) {
    auto [it, fresh] = ids.emplace(s, static_cast<int32_t>(sets.size()));
    if (fresh) {
      if (sets.size() >= max_states)
        throw GrammarError(what + " needs more than " + std::to_string(max_states) + " automaton states");
      sets.push_back(s);
      at_begin.push_back(begin);
      const Set fin = closure(s, begin, true);
      d.add_state(std::binary_search(fin.begin(), fin.end(), nfa.accept));
    }
    return it->second;
  };
  // The start set is the only one where ^ holds; it is kept apart from equal sets reached later.
  ids.clear();
  sets.push_back(closure({nfa.start}, true, false));
  at_begin.push_back(true);
  {
    const Set fin = closure({nfa.start}, true, true);
    d.add_state(std::binary_search(fin.begin(), fin.end(), nfa.accept));
  }
  std::vector<Set> targets(256);
  for (size_t i = 0; i < sets.size(); ++i) {
    for (Set& t : targets) t.clear();
    const Set cur = sets[i];
    for (uint32_t s : cur)
      for (const ByteNfa::Edge& e : nfa.out[s])
        if (e.kind == ByteNfa::EdgeKind::Bytes)
          for (int c = e.lo; c <= e.hi; ++c) targets[static_cast<size_t>(c)].push_back(e.to);
    std::map<Set, int32_t> local;
    for (int c = 0; c < 256; ++c) {
      Set& t = targets[static_cast<size_t>(c)];
      if (t.empty()) continue;
      std::sort(t.begin(), t.end());
      t.erase(std::unique(t.begin(), t.end()), t.end());
      auto it = local.find(t);
      if (it == local.end()) it = local.emplace(t, id_of(closure(t, false, false), false)).first;
      d.next[i * 256 + static_cast<size_t>(c)] = it->second;
    }
  }
  return minimize(d);
}

ByteDfa minimize(const ByteDfa& d) {
  const size_t n = d.size();
  // Useful states: reachable from the start and able to reach acceptance.
  std::vector<bool> reach(n, false), live(n, false);
  if (n == 0) {
    ByteDfa e;
    e.add_state(false);
    return e;
  }
  std::vector<int32_t> stack{0};
  reach[0] = true;
  std::vector<std::vector<int32_t>> rev(n);
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (int c = 0; c < 256; ++c) {
      const int32_t t = d.step(s, static_cast<uint8_t>(c));
      if (t == ByteDfa::kNone) continue;
      if (c == 0 || d.step(s, static_cast<uint8_t>(c - 1)) != t) rev[static_cast<size_t>(t)].push_back(s);
      if (!reach[static_cast<size_t>(t)]) {
        reach[static_cast<size_t>(t)] = true;
        stack.push_back(t);
      }
    }
  }
  for (size_t s = 0; s < n; ++s)
    if (reach[s] && d.accept[s]) {
      live[s] = true;
      stack.push_back(static_cast<int32_t>(s));
    }
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (int32_t p : rev[static_cast<size_t>(s)])
      if (!live[static_cast<size_t>(p)]) {
        live[static_cast<size_t>(p)] = true;
        stack.push_back(p);
      }
  }
  if (!live[0]) {
    ByteDfa e;
    e.add_state(false);
    return e;
  }
  auto nxt = [&](size_t s, int c) {
    const int32_t t = d.step(static_cast<int32_t>(s), static_cast<uint8_t>(c));
    return t != ByteDfa::kNone && live[static_cast<size_t>(t)] ? t : ByteDfa::kNone;
  };
  std::vector<size_t> states;
  for (size_t s = 0; s < n; ++s)
    if (live[s]) states.push_back(s);
  // Byte classes: bytes whose columns agree on every live state.
  std::vector<int> byte_class(256, -1);
  std::vector<int> reps;
  {
    std::map<std::vector<int32_t>, int> cols;
    for (int c = 0; c < 256; ++c) {
      std::vector<int32_t> col;
      col.reserve(states.size());
      for (size_t s : states) col.push_back(nxt(s, c));
      auto [it, fresh] = cols.emplace(std::move(col), static_cast<int>(reps.size()));
      if (fresh) reps.push_back(c);
      byte_class[static_cast<size_t>(c)] = it->second;
    }
  }
  // Moore refinement.
  std::vector<int32_t> cls(n, -1);
  for (size_t s : states) cls[s] = d.accept[s] ? 1 : 0;
  size_t n_classes = 0;
  for (;;) {
    std::map<std::vector<int32_t>, int32_t> sig;
    std::vector<int32_t> fresh(n, -1);
    for (size_t s : states) {
      std::vector<int32_t> k;
      k.reserve(reps.size() + 1);
      k.push_back(cls[s]);
      for (int c : reps) {
        const int32_t t = nxt(s, c);
        k.push_back(t == ByteDfa::kNone ? -1 : cls[static_cast<size_t>(t)]);
      }
      fresh[s] = sig.emplace(std::move(k), static_cast<int32_t>(sig.size())).first->second;
    }
    const bool stable = sig.size() == n_classes;
    n_classes = sig.size();
    cls = std::move(fresh);
    if (stable) break;
  }
  // Renumber in breadth-first order from the start.
  ByteDfa out;
  std::vector<int32_t> id(n_classes, -1);
  std::vector<size_t> rep_of(n_classes);
  for (size_t s : states) rep_of[static_cast<size_t>(cls[s])] = s;
  std::vector<size_t> order{static_cast<size_t>(cls[0])};
  id[static_cast<size_t>(cls[0])] = out.add_state(d.accept[0]);
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t s = rep_of[order[i]];
    for (int c = 0; c < 256; ++c) {
      const int32_t t = nxt(s, c);
      if (t == ByteDfa::kNone) continue;
      const auto k = static_cast<size_t>(cls[static_cast<size_t>(t)]);
      if (id[k] < 0) {
        id[k] = out.add_state(d.accept[static_cast<size_t>(t)]);
        order.push_back(k);
      }
      out.next[i * 256 + static_cast<size_t>(c)] = id[k];
    }
  }
  return out;
}

ByteDfa intersect(const ByteDfa& a, const ByteDfa& b, const std::string& what, size_t max_states) {
  ByteDfa d;
  std::unordered_map<uint64_t, int32_t> ids;
  std::vector<std::pair<int32_t, int32_t>> pairs;
  auto id_of = [&](int32_t x, int32_t y) {
    const uint64_t key = (static_cast<uint64_t>(x) << 32) | static_cast<uint32_t>(y);
    auto [it, fresh] = ids.emplace(key, static_cast<int32_t>(pairs.size()));
    if (fresh) {
      if (pairs.size() >= max_states)
        throw GrammarError(what + " needs more than " + std::to_string(max_states) + " automaton states");
      pairs.emplace_back(x, y);
      d.add_state(a.accept[static_cast<size_t>(x)] && b.accept[static_cast<size_t>(y)]);
    }
    return it->second;
  };
  id_of(0, 0);
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto [x, y] = pairs[i];
    for (int c = 0; c < 256; ++c) {
      const int32_t tx = a.step(x, static_cast<uint8_t>(c)), ty = b.step(y, static_cast<uint8_t>(c));
      if (tx == ByteDfa::kNone || ty == ByteDfa::kNone) continue;
      const int32_t t = id_of(tx, ty);
      d.next[i * 256 + static_cast<size_t>(c)] = t;
    }
  }
  return minimize(d);
}

bool counts_safely(const ByteDfa& d) {
  // need[s]: continuation bytes still owed by the character in progress (-1 = not reached yet)
  std::vector<int> need(d.size(), -1);
  need[0] = 0;
  std::vector<int32_t> stack{0};
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (int c = 0; c < 256; ++c) {
      const int32_t t = d.step(s, static_cast<uint8_t>(c));
      if (t == ByteDfa::kNone) continue;
      const int owed = need[static_cast<size_t>(s)];
      const int n = owed > 0 ? owed - 1 : c < 0x80 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
      if (need[static_cast<size_t>(t)] == -1) {
        need[static_cast<size_t>(t)] = n;
        stack.push_back(t);
      } else if (need[static_cast<size_t>(t)] != n) {
        return false;
      }
    }
  }
  bool start_reentered = false;  // then the start state stands for later positions too
  for (size_t s = 0; s < d.size(); ++s)
    for (int c = 0; c < 256; ++c) start_reentered = start_reentered || d.step(static_cast<int32_t>(s), static_cast<uint8_t>(c)) == 0;
  for (size_t s = 0; s < d.size(); ++s) {
    if (need[s] != 0) continue;
    if ((s != 0 || start_reentered) && !d.accept[s]) return false;
    // one more character back to a boundary
    std::vector<int32_t> frontier{static_cast<int32_t>(s)};
    bool back = false;
    for (int depth = 0; depth < 4 && !back && !frontier.empty(); ++depth) {
      std::vector<int32_t> next;
      for (int32_t f : frontier)
        for (int c = 0; c < 256 && !back; ++c) {
          const int32_t t = d.step(f, static_cast<uint8_t>(c));
          if (t == ByteDfa::kNone) continue;
          if (need[static_cast<size_t>(t)] == 0) back = true;
          else next.push_back(t);
        }
      std::sort(next.begin(), next.end());
      next.erase(std::unique(next.begin(), next.end()), next.end());
      frontier = std::move(next);
    }
    if (!back) return false;
  }
  return true;
}

ByteDfa limit_chars(const ByteDfa& a, uint32_t min_chars, uint32_t max_chars, const std::string& what,
                    size_t max_states) {
  const bool bounded = max_chars != UINT32_MAX;
  const uint32_t cap = bounded ? max_chars : min_chars;  // counts saturate here without a maximum
  ByteDfa d;
  if (static_cast<uint64_t>(a.size()) * (uint64_t{cap} + 1) > uint64_t{64} * max_states)
    throw GrammarError(what + " needs more than " + std::to_string(max_states) + " automaton states");
  std::vector<int32_t> ids(a.size() * (static_cast<size_t>(cap) + 1), -1);
  std::vector<std::pair<int32_t, uint32_t>> states;
  auto id_of = [&](int32_t s, uint32_t k) {
    int32_t& id = ids[static_cast<size_t>(s) * (static_cast<size_t>(cap) + 1) + k];
    if (id < 0) {
      if (states.size() >= max_states)
        throw GrammarError(what + " needs more than " + std::to_string(max_states) + " automaton states");
      id = static_cast<int32_t>(states.size());
      states.emplace_back(s, k);
      d.add_state(a.accept[static_cast<size_t>(s)] && k >= min_chars && k <= max_chars);
    }
    return id;
  };
  id_of(0, 0);
  for (size_t i = 0; i < states.size(); ++i) {
    const auto [s, k] = states[i];
    for (int c = 0; c < 256; ++c) {
      const int32_t t = a.step(s, static_cast<uint8_t>(c));
      if (t == ByteDfa::kNone) continue;
      uint32_t k2 = k;
      if (c < 0x80 || c > 0xBF) {  // a character starts
        if (bounded && k == max_chars) continue;
        k2 = std::min(k + 1, cap);
      }
      d.next[i * 256 + static_cast<size_t>(c)] = id_of(t, k2);
    }
  }
  return minimize(d);
}

uint32_t dfa_rule(GrammarBuilder& b, const ByteDfa& d) {
  std::vector<uint32_t> rule(d.size());
  for (size_t s = 0; s < d.size(); ++s) rule[s] = b.new_rule();
  for (size_t s = 0; s < d.size(); ++s) {
    std::map<int32_t, ByteSet> by_target;
    for (int c = 0; c < 256; ++c) {
      const int32_t t = d.step(static_cast<int32_t>(s), static_cast<uint8_t>(c));
      if (t != ByteDfa::kNone) add(by_target[t], static_cast<uint8_t>(c));
    }
    for (const auto& [t, set] : by_target) b.add_alt(rule[s], {b.set(set), GrammarBuilder::call(rule[static_cast<size_t>(t)])});
    if (d.accept[s]) b.add_alt(rule[s], {});
  }
  return rule[0];
}

}  // namespace qrig::text::grammar
