// IR printing and parsing. The text form, one statement per line:
//   graph NAME {
//     input %tokens : i32[T]
//     state %gdn.0 : f32[4,128,128]
//     attrs {argmax_kernel="argmax_f32_t1024"}
//     %x0 = embed(%tokens) {weight="token_embd.weight", layer=-1} : f32[T,256]
//     %a, %b = matmul_stack(%n) {weights=["w.a","w.b"]} : f32[T,64], f32[T,32]
//     kv_write(%k, %v, %pos) {k_cache="k.3", v_cache="v.3"}
//     output %logits
//   }
// Attribute values: integers, floats (always printed with a '.', an exponent or as nan/inf, so they parse back
// as floats), strings in double quotes (\" \\ \n escaped), lists of integers or of strings in brackets.
#include "ir/ir.h"

#include <cctype>
#include <charconv>
#include <cstring>

#include <fmt/format.h>

namespace qrig::ir {

namespace {

std::string float_string(double v) {
  std::string s = fmt::format("{}", v);  // shortest representation that round-trips
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // keep it a float when parsed back
  return s;
}

std::string quote(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') { o += "\\n"; continue; }
    o += c;
  }
  return o + "\"";
}

std::string attr_string(const AttrValue& v) {
  if (auto p = std::get_if<int64_t>(&v)) return std::to_string(*p);
  if (auto p = std::get_if<double>(&v)) return float_string(*p);
  if (auto p = std::get_if<std::string>(&v)) return quote(*p);
  std::string s = "[";
  if (auto p = std::get_if<std::vector<int64_t>>(&v)) {
    for (size_t k = 0; k < p->size(); ++k) s += (k ? "," : "") + std::to_string((*p)[k]);
  } else {
    const auto& l = std::get<std::vector<std::string>>(v);
    for (size_t k = 0; k < l.size(); ++k) s += (k ? "," : "") + quote(l[k]);
  }
  return s + "]";
}

}  // namespace

std::string print(const Graph& g) {
  std::string o = "graph " + g.name + " {\n";
  for (const Input& in : g.inputs) o += "  input %" + in.name + " : " + type_string(in.type) + "\n";
  for (const State& st : g.states) o += "  state %" + st.name + " : " + type_string(st.type) + "\n";
  if (!g.attrs.empty()) {
    o += "  attrs {";
    for (size_t k = 0; k < g.attrs.size(); ++k)
      o += (k ? ", " : "") + g.attrs[k].first + "=" + attr_string(g.attrs[k].second);
    o += "}\n";
  }
  for (const Op& op : g.ops) {
    o += "  " + op.describe();
    if (!op.attrs.empty()) {
      o += " {";
      for (size_t k = 0; k < op.attrs.size(); ++k)
        o += (k ? ", " : "") + op.attrs[k].first + "=" + attr_string(op.attrs[k].second);
      o += "}";
    }
    for (size_t k = 0; k < op.types.size(); ++k) o += (k ? ", " : " : ") + type_string(op.types[k]);
    o += "\n";
  }
  for (const std::string& out : g.outputs) o += "  output %" + out + "\n";
  return o + "}\n";
}

namespace {

struct Lexer {
  std::string_view s;
  size_t pos = 0;
  int line;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(fmt::format("IR line {}, column {}: {}", line, pos + 1, what));
  }
  void ws() {
    while (pos < s.size() && (s[pos] == ' ' || s[pos] == '\t' || s[pos] == '\r')) ++pos;
  }
  bool eat(char c) {
    ws();
    if (pos < s.size() && s[pos] == c) { ++pos; return true; }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(fmt::format("expected '{}'", c));
  }
  bool at_end() { ws(); return pos >= s.size(); }
  static bool ident_char(char c) {
    return std::isalnum((unsigned char)c) || c == '_' || c == '.' || c == '-';
  }
  std::string ident(const char* what) {
    ws();
    size_t b = pos;
    while (pos < s.size() && ident_char(s[pos])) ++pos;
    if (b == pos) fail(fmt::format("expected {}", what));
    return std::string(s.substr(b, pos - b));
  }
  std::string value_name() {
    expect('%');
    return ident("value name");
  }
  int64_t integer() {
    ws();
    int64_t v = 0;
    auto r = std::from_chars(s.data() + pos, s.data() + s.size(), v);
    if (r.ec != std::errc()) fail("expected an integer");
    pos = (size_t)(r.ptr - s.data());
    return v;
  }
  Type type() {
    std::string dt = ident("dtype");
    Type t;
    if (dt == "f32") t.dtype = DType::f32;
    else if (dt == "f16") t.dtype = DType::f16;
    else if (dt == "i32") t.dtype = DType::i32;
    else if (dt == "q8") t.dtype = DType::q8;
    else if (dt == "t4") t.dtype = DType::t4;
    else if (dt == "t3") t.dtype = DType::t3;
    else fail("unknown dtype '" + dt + "'");
    expect('[');
    if (!eat(']')) {
      do {
        ws();
        if (pos < s.size() && s[pos] == 'T') { ++pos; t.shape.push_back(kTokens); }
        else if (pos < s.size() && s[pos] == 'R') { ++pos; t.shape.push_back(kRows); }
        else if (pos < s.size() && s[pos] == 'C') { ++pos; t.shape.push_back(kContext); }
        else {
          int64_t d = integer();
          if (d <= 0) fail("dimension must be positive");
          t.shape.push_back(d);
        }
      } while (eat(','));
      expect(']');
    }
    return t;
  }
  OpKind kind() {
    const std::string k = ident("op kind");
    const OpSchema* sc = find_schema(k);
    if (!sc) fail(fmt::format("unknown op kind '{}'", k));
    return sc->kind;
  }
  // "(%a, %b) {key=value, ...}" after an op kind.
  void call(Op& op) {
    expect('(');
    if (!eat(')')) {
      do op.args.push_back(value_name()); while (eat(','));
      expect(')');
    }
    if (eat('{')) {
      do {
        std::string k = ident("attribute name");
        expect('=');
        op.attrs.emplace_back(k, attr_value());
      } while (eat(','));
      expect('}');
    }
  }
  std::string quoted() {
    ++pos;  // the opening quote
    std::string v;
    while (true) {
      if (pos >= s.size()) fail("unterminated string");
      char d = s[pos++];
      if (d == '"') break;
      if (d == '\\') {
        if (pos >= s.size()) fail("unterminated escape");
        char e = s[pos++];
        v += e == 'n' ? '\n' : e;
      } else {
        v += d;
      }
    }
    return v;
  }
  AttrValue attr_value() {
    ws();
    if (pos >= s.size()) fail("an attribute value");
    char c = s[pos];
    if (c == '"') return quoted();
    if (c == '[') {
      ++pos;
      if (eat(']')) return std::vector<int64_t>{};
      ws();
      if (pos < s.size() && s[pos] == '"') {
        std::vector<std::string> l;
        do {
          ws();
          if (pos >= s.size() || s[pos] != '"') fail("expected a string in a string list");
          l.push_back(quoted());
        } while (eat(','));
        expect(']');
        return l;
      }
      std::vector<int64_t> l;
      do l.push_back(integer()); while (eat(','));
      expect(']');
      return l;
    }
    size_t b = pos;
    while (pos < s.size() && (std::isalnum((unsigned char)s[pos]) || std::strchr("+-.", s[pos]))) ++pos;
    std::string tok(s.substr(b, pos - b));
    if (tok.empty()) fail("expected an attribute value");
    bool is_float = tok.find_first_of(".eEn") != std::string::npos;
    if (!is_float) {
      int64_t v;
      auto r = std::from_chars(tok.data(), tok.data() + tok.size(), v);
      if (r.ec != std::errc() || r.ptr != tok.data() + tok.size()) fail("bad integer '" + tok + "'");
      return v;
    }
    double v;
    auto r = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    if (r.ec != std::errc() || r.ptr != tok.data() + tok.size()) fail("bad number '" + tok + "'");
    return v;
  }
};

}  // namespace

Graph parse(std::string_view text) {
  Graph g;
  bool open = false, closed = false;
  int line_no = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(start, nl - start);
    start = nl + 1;
    ++line_no;
    Lexer lx{line, 0, line_no};
    if (lx.at_end() || line[lx.pos] == '#') continue;
    if (closed) lx.fail("text after the closing '}'");
    if (!open) {
      if (lx.ident("'graph'") != "graph") lx.fail("expected 'graph NAME {'");
      g.name = lx.ident("graph name");
      lx.expect('{');
      if (!lx.at_end()) lx.fail("unexpected text after '{'");
      open = true;
      continue;
    }
    if (lx.eat('}')) {
      if (!lx.at_end()) lx.fail("unexpected text after '}'");
      closed = true;
      continue;
    }
    lx.ws();
    if (line[lx.pos] == '%') {  // %r[, %r2...] = kind(...) {...} : type[, type...]
      Op op;
      do op.results.push_back(lx.value_name()); while (lx.eat(','));
      lx.expect('=');
      op.kind = lx.kind();
      lx.call(op);
      lx.expect(':');
      do op.types.push_back(lx.type()); while (lx.eat(','));
      if (op.types.size() != op.results.size())
        lx.fail(fmt::format("{} results but {} types", op.results.size(), op.types.size()));
      if (!lx.at_end()) lx.fail("unexpected text at end of op");
      g.ops.push_back(std::move(op));
      continue;
    }
    const size_t word_at = lx.pos;
    std::string word = lx.ident("statement");
    if (word == "input" || word == "state") {
      std::string name = lx.value_name();
      lx.expect(':');
      Type t = lx.type();
      if (!lx.at_end()) lx.fail("unexpected text at end of line");
      if (word == "input") g.inputs.push_back({name, t});
      else g.states.push_back({name, t});
    } else if (word == "attrs") {
      lx.expect('{');
      do {
        std::string k = lx.ident("attribute name");
        lx.expect('=');
        g.attrs.emplace_back(k, lx.attr_value());
      } while (lx.eat(','));
      lx.expect('}');
      if (!lx.at_end()) lx.fail("unexpected text at end of line");
    } else if (word == "output") {
      g.outputs.push_back(lx.value_name());
      if (!lx.at_end()) lx.fail("unexpected text at end of line");
    } else {  // side-effect op: kind(...) {attrs}
      Op op;
      lx.pos = word_at;
      op.kind = lx.kind();
      lx.call(op);
      if (!lx.at_end()) lx.fail("unexpected text at end of op");
      g.ops.push_back(std::move(op));
    }
  }
  if (!open) throw Error("IR: no 'graph NAME {' found");
  if (!closed) throw Error("IR: missing closing '}'");
  return g;
}

}  // namespace qrig::ir
