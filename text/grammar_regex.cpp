// pattern_dfa / format_dfa (grammar_regex.h): a recursive-descent parser of the ECMA-262 subset into a small
// syntax tree, Thompson construction of a ByteNfa from it (search semantics: any text around the match), then
// grammar_dfa.h's subset construction. Formats are written as such expressions.
#include "text/grammar_regex.h"

#include <memory>

namespace qrig::text::grammar {

namespace {

constexpr uint32_t kMaxRepeat = 1000;
constexpr size_t kMaxNfaStates = 200000;

struct Node {
  enum Kind { Empty, Set, Concat, Alt, Repeat, Begin, End } kind = Empty;
  CodePointSet set;
  std::vector<std::unique_ptr<Node>> kids;
  uint32_t min = 0, max = 0;  // Repeat; max UINT32_MAX = unbounded
};
using NodeP = std::unique_ptr<Node>;

NodeP make(Node::Kind k) {
  auto n = std::make_unique<Node>();
  n->kind = k;
  return n;
}

CodePointSet digits() {
  CodePointSet s;
  s.add('0', '9');
  return s;
}
CodePointSet word() {
  CodePointSet s;
  s.add('0', '9');
  s.add('A', 'Z');
  s.add('a', 'z');
  s.add('_', '_');
  return s;
}
CodePointSet spaces() {  // ECMA-262 WhiteSpace and LineTerminator
  CodePointSet s;
  for (uint32_t c : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0xA0u, 0x1680u, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu,
                     0x3000u, 0xFEFFu})
    s.add(c, c);
  s.add(0x2000, 0x200A);
  return s;
}
CodePointSet any_char() {
  CodePointSet s;
  s.add(0, 0x10FFFF);  // surrogates never become bytes (ByteNfa::add_code_points skips them)
  return s;
}

class Parser {
 public:
  explicit Parser(std::string_view src) : src_(src) {
    for (size_t i = 0; i < src.size();) {
      const auto c = static_cast<unsigned char>(src[i]);
      const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
      if (len == 0 || i + static_cast<size_t>(len) > src.size()) fail("is not valid UTF-8");
      uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
      for (int k = 1; k < len; ++k) {
        const auto d = static_cast<unsigned char>(src[i + static_cast<size_t>(k)]);
        if ((d & 0xC0) != 0x80) fail("is not valid UTF-8");
        cp = (cp << 6) | (d & 0x3F);
      }
      cps_.push_back(cp);
      i += static_cast<size_t>(len);
    }
  }

  NodeP parse() {
    NodeP n = disjunction();
    if (pos_ != cps_.size()) fail(cps_[pos_] == ')' ? "has an unmatched ')'" : "cannot be parsed");
    return n;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    std::string shown(src_.substr(0, 80));
    if (src_.size() > 80) shown += "...";
    throw GrammarError("pattern \"" + shown + "\" " + why);
  }
  [[noreturn]] void unsupported(const std::string& feature) const {
    fail("uses " + feature + ", which constrained decoding cannot enforce");
  }
  bool more() const { return pos_ < cps_.size(); }
  uint32_t peek(size_t k = 0) const { return pos_ + k < cps_.size() ? cps_[pos_ + k] : UINT32_MAX; }
  bool eat(uint32_t c) {
    if (peek() != c) return false;
    ++pos_;
    return true;
  }

  NodeP disjunction() {
    NodeP first = alternative();
    if (peek() != '|') return first;
    NodeP alt = make(Node::Alt);
    alt->kids.push_back(std::move(first));
    while (eat('|')) alt->kids.push_back(alternative());
    return alt;
  }

  NodeP alternative() {
    NodeP seq = make(Node::Concat);
    while (more() && peek() != '|' && peek() != ')') {
      NodeP atom = term();
      if (atom) seq->kids.push_back(quantified(std::move(atom)));
    }
    return seq;
  }

  // Reads a decimal number at pos_ (no sign); false if there is none.
  bool number(uint32_t& out) {
    size_t k = pos_;
    uint64_t v = 0;
    while (k < cps_.size() && cps_[k] >= '0' && cps_[k] <= '9') {
      v = std::min<uint64_t>(v * 10 + (cps_[k] - '0'), uint64_t{1} << 40);
      ++k;
    }
    if (k == pos_) return false;
    pos_ = k;
    out = static_cast<uint32_t>(std::min<uint64_t>(v, UINT32_MAX - 1));
    return true;
  }

  // {n}, {n,}, {n,m} at pos_ (which holds '{'); false (pos_ unchanged) when it is not a quantifier.
  bool brace(uint32_t& lo, uint32_t& hi) {
    const size_t save = pos_;
    ++pos_;
    if (!number(lo)) {
      pos_ = save;
      return false;
    }
    hi = lo;
    if (eat(',')) {
      hi = UINT32_MAX;
      if (peek() != '}' && !number(hi)) {
        pos_ = save;
        return false;
      }
    }
    if (!eat('}')) {
      pos_ = save;
      return false;
    }
    return true;
  }

  NodeP quantified(NodeP atom) {
    for (;;) {
      uint32_t lo, hi;
      const uint32_t c = peek();
      if (c == '*') lo = 0, hi = UINT32_MAX, ++pos_;
      else if (c == '+') lo = 1, hi = UINT32_MAX, ++pos_;
      else if (c == '?') lo = 0, hi = 1, ++pos_;
      else if (c == '{' && brace(lo, hi)) {
      } else return atom;
      if (hi != UINT32_MAX && lo > hi) fail("has a quantifier {n,m} with n > m");
      if (lo > kMaxRepeat || (hi != UINT32_MAX && hi > kMaxRepeat))
        unsupported("a quantifier bound above " + std::to_string(kMaxRepeat));
      if (atom->kind == Node::Begin || atom->kind == Node::End) fail("quantifies an anchor");
      eat('?');  // lazy: the same set of strings
      NodeP r = make(Node::Repeat);
      r->min = lo;
      r->max = hi;
      r->kids.push_back(std::move(atom));
      atom = std::move(r);
    }
  }

  NodeP set_node(CodePointSet s) {
    NodeP n = make(Node::Set);
    s.normalise();
    n->set = std::move(s);
    return n;
  }

  NodeP term() {
    const uint32_t c = peek();
    switch (c) {
      case '^': ++pos_; return make(Node::Begin);
      case '$': ++pos_; return make(Node::End);
      case '.': {
        ++pos_;
        CodePointSet s;
        for (uint32_t t : {0x0Au, 0x0Du, 0x2028u, 0x2029u}) s.add(t, t);
        return set_node(s.complement());
      }
      case '(': return group();
      case '[': return set_node(char_class());
      case '\\': {
        ++pos_;
        CodePointSet s;
        atom_escape(s, false);
        return set_node(std::move(s));
      }
      case '*': case '+': case '?': fail("has a quantifier with nothing to repeat");
      case '{': {
        uint32_t lo, hi;
        if (brace(lo, hi)) fail("has a quantifier with nothing to repeat");
        ++pos_;
        CodePointSet s;
        s.add(c, c);
        return set_node(s);
      }
      default: {
        ++pos_;
        CodePointSet s;
        s.add(c, c);
        return set_node(s);
      }
    }
  }

  NodeP group() {
    ++pos_;  // '('
    if (eat('?')) {
      if (eat(':')) {
      } else if (peek() == '=' || peek() == '!') {
        unsupported("a lookahead (?=...) / (?!...)");
      } else if (peek() == '<' && (peek(1) == '=' || peek(1) == '!')) {
        unsupported("a lookbehind (?<=...) / (?<!...)");
      } else if (eat('<')) {
        while (more() && peek() != '>') ++pos_;
        if (!eat('>')) fail("has an unterminated group name");
      } else {
        unsupported("an inline flag or group modifier (?...)");
      }
    }
    NodeP inner = disjunction();
    if (!eat(')')) fail("has an unterminated group");
    return inner;
  }

  uint32_t hex(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      const uint32_t c = peek();
      int d = c >= '0' && c <= '9' ? int(c - '0') : c >= 'a' && c <= 'f' ? int(c - 'a' + 10) : c >= 'A' && c <= 'F' ? int(c - 'A' + 10) : -1;
      if (d < 0) fail("has a malformed \\x / \\u escape");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // After a backslash: adds what the escape matches to s. in_class: inside [...] (\b is a backspace).
  void atom_escape(CodePointSet& s, bool in_class) {
    if (!more()) fail("ends with a backslash");
    const uint32_t c = cps_[pos_++];
    auto one = [&](uint32_t v) { s.add(v, v); };
    auto many = [&](CodePointSet x) {
      for (const auto& r : x.ranges) s.add(r.first, r.second);
    };
    switch (c) {
      case 'd': many(digits()); return;
      case 'D': many(digits().complement()); return;
      case 'w': many(word()); return;
      case 'W': many(word().complement()); return;
      case 's': many(spaces()); return;
      case 'S': {
        CodePointSet sp = spaces();
        sp.normalise();
        many(sp.complement());
        return;
      }
      case 't': one(0x09); return;
      case 'n': one(0x0A); return;
      case 'v': one(0x0B); return;
      case 'f': one(0x0C); return;
      case 'r': one(0x0D); return;
      case '0':
        if (peek() >= '0' && peek() <= '9') unsupported("an octal escape or backreference");
        one(0);
        return;
      case 'c': {
        const uint32_t l = peek();
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z'))) fail("has a malformed \\c escape");
        ++pos_;
        one(l % 32);
        return;
      }
      case 'x': one(hex(2)); return;
      case 'u': {
        if (eat('{')) {
          uint32_t v = 0;
          size_t n = 0;
          while (more() && peek() != '}') {
            v = v * 16 + hex(1);
            if (++n > 6 || v > 0x10FFFF) fail("has a \\u{...} escape beyond U+10FFFF");
          }
          if (!eat('}') || n == 0) fail("has a malformed \\u{...} escape");
          one(v);
          return;
        }
        uint32_t v = hex(4);
        if (v >= 0xD800 && v <= 0xDBFF && peek() == '\\' && peek(1) == 'u') {
          const size_t save = pos_;
          pos_ += 2;
          const uint32_t lo = hex(4);
          if (lo >= 0xDC00 && lo <= 0xDFFF) v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
          else pos_ = save;
        }
        if (v >= 0xD800 && v <= 0xDFFF) unsupported("a lone surrogate escape");
        one(v);
        return;
      }
      case 'b':
        if (in_class) {
          one(0x08);
          return;
        }
        unsupported("a word boundary \\b");
      case 'B': unsupported("a word boundary \\B");
      case 'p': case 'P': unsupported("a Unicode property escape \\p{...}");
      case 'k': unsupported("a backreference \\k<name>");
      default: break;
    }
    if (c >= '1' && c <= '9') unsupported("a backreference \\" + std::string(1, static_cast<char>(c)));
    if (c < 0x80 && std::string_view("^$\\.*+?()[]{}|/-").find(static_cast<char>(c)) != std::string_view::npos) {
      one(c);
      return;
    }
    fail("has an invalid escape \\" + std::string(1, c < 0x80 ? static_cast<char>(c) : '?'));
  }

  // One class atom: a single code point (returned) or, for \d \w \s..., a set (added to s, returns UINT32_MAX).
  uint32_t class_atom(CodePointSet& s) {
    if (!more()) fail("has an unterminated character class");
    if (eat('\\')) {
      CodePointSet x;
      atom_escape(x, true);
      x.normalise();
      if (x.ranges.size() == 1 && x.ranges[0].first == x.ranges[0].second) return x.ranges[0].first;
      for (const auto& r : x.ranges) s.add(r.first, r.second);
      return UINT32_MAX;
    }
    return cps_[pos_++];
  }

  CodePointSet char_class() {
    ++pos_;  // '['
    const bool negate = eat('^');
    CodePointSet s;
    while (more() && peek() != ']') {
      const uint32_t a = class_atom(s);
      if (peek() == '-' && peek(1) != ']' && peek(1) != UINT32_MAX) {
        ++pos_;
        const uint32_t b = class_atom(s);
        if (a == UINT32_MAX || b == UINT32_MAX) fail("has a class range with a class escape as an end");
        if (a > b) fail("has a class range out of order");
        s.add(a, b);
      } else if (a != UINT32_MAX) {
        s.add(a, a);
      }
    }
    if (!eat(']')) fail("has an unterminated character class");
    s.normalise();
    return negate ? s.complement() : s;
  }

  std::string_view src_;
  std::vector<uint32_t> cps_;
  size_t pos_ = 0;
};

class Builder {
 public:
  explicit Builder(ByteNfa& n, const std::string& what) : n_(n), what_(what) {}

  void build(const Node& node, uint32_t a, uint32_t b) {
    if (n_.size() > kMaxNfaStates) throw GrammarError(what_ + " is too large an expression");
    switch (node.kind) {
      case Node::Empty: n_.eps(a, b); return;
      case Node::Set: n_.add_code_points(a, b, node.set); return;
      case Node::Begin: n_.out[a].push_back(ByteNfa::Edge{ByteNfa::EdgeKind::Begin, 0, 0, b}); return;
      case Node::End: n_.out[a].push_back(ByteNfa::Edge{ByteNfa::EdgeKind::End, 0, 0, b}); return;
      case Node::Alt:
        for (const auto& k : node.kids) build(*k, a, b);
        return;
      case Node::Concat: {
        uint32_t cur = a;
        for (size_t i = 0; i < node.kids.size(); ++i) {
          const uint32_t nxt = i + 1 == node.kids.size() ? b : n_.add_state();
          build(*node.kids[i], cur, nxt);
          cur = nxt;
        }
        if (node.kids.empty()) n_.eps(a, b);
        return;
      }
      case Node::Repeat: {
        const Node& k = *node.kids[0];
        uint32_t cur = a;
        for (uint32_t i = 0; i < node.min; ++i) {
          const uint32_t nxt = n_.add_state();
          build(k, cur, nxt);
          cur = nxt;
        }
        if (node.max == UINT32_MAX) {
          const uint32_t loop = n_.add_state(), back = n_.add_state();
          n_.eps(cur, loop);
          build(k, loop, back);
          n_.eps(back, loop);
          n_.eps(loop, b);
          return;
        }
        for (uint32_t i = node.min; i < node.max; ++i) {
          const uint32_t nxt = n_.add_state();
          n_.eps(cur, b);
          build(k, cur, nxt);
          cur = nxt;
        }
        n_.eps(cur, b);
        return;
      }
    }
  }

 private:
  ByteNfa& n_;
  const std::string& what_;
};

ByteDfa compile(std::string_view pattern, const std::string& what) {
  const NodeP tree = Parser(pattern).parse();
  ByteNfa n;
  const uint32_t s0 = n.add_state(), r0 = n.add_state(), r1 = n.add_state(), acc = n.add_state();
  const CodePointSet any = any_char();
  n.add_code_points(s0, s0, any);  // a search: any text before the match...
  n.eps(s0, r0);
  Builder(n, what).build(*tree, r0, r1);
  n.eps(r1, acc);
  n.add_code_points(acc, acc, any);  // ...and after it
  n.start = s0;
  n.accept = acc;
  return determinize(n, what);
}

std::string brief(std::string_view p) {
  return p.size() > 80 ? std::string(p.substr(0, 77)) + "..." : std::string(p);
}

}  // namespace

ByteDfa pattern_dfa(std::string_view pattern) { return compile(pattern, "pattern \"" + brief(pattern) + "\""); }

const std::vector<std::string>& supported_formats() {
  static const std::vector<std::string> names{"date", "time", "date-time", "uuid", "email", "ipv4"};
  return names;
}

ByteDfa format_dfa(const std::string& format) {
  static const std::string kLeap = R"((\d\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00))";
  static const std::string kDate = R"((\d{4}-(0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|\d{4}-(0[469]|11)-(0[1-9]|[12]\d|30))"
                                   R"(|\d{4}-02-(0[1-9]|1\d|2[0-8])|)" + kLeap + "-02-29)";
  static const std::string kTime = R"((([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)))";
  static const std::string kOctet = R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
  static const std::string kAtom = R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)";
  static const std::string kLabel = R"([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)";
  std::string re;
  if (format == "date") re = "^" + kDate + "$";
  else if (format == "time") re = "^" + kTime + "$";
  else if (format == "date-time") re = "^" + kDate + "T" + kTime + "$";
  else if (format == "uuid") re = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
  else if (format == "email") re = "^" + kAtom + R"((\.)" + kAtom + ")*@(" + kLabel + R"(\.)+)" + kLabel + "$";
  else if (format == "ipv4") re = "^(" + kOctet + R"(\.){3})" + kOctet + "$";
  else {
    std::string names;
    for (const std::string& n : supported_formats()) names += (names.empty() ? "" : ", ") + n;
    throw GrammarError("format \"" + brief(format) + "\" is not supported (supported: " + names + ")");
  }
  return compile(re, "format \"" + format + "\"");
}

}  // namespace qrig::text::grammar
