// IR printing, parsing and structural verification. The text form, one statement per line:
//   graph NAME {
//     input %tokens : i32[T]
//     state %gdn.0 : f32[4,128,128]
//     %x0 = embed(%tokens) {weight="token_embd.weight"} : f32[T,256]
//     kv_write(%k, %v, %pos) {cache="kv.3"}
//     output %logits
//   }
#include "ir/ir.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <set>

#include <fmt/format.h>

namespace qrig::ir {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
  }
  return "?";
}

namespace {

std::string dim_string(int64_t d) {
  if (d == kTokens) return "T";
  if (d == kRows) return "R";
  if (d == kContext) return "C";
  return std::to_string(d);
}

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
  const auto& l = std::get<std::vector<int64_t>>(v);
  std::string s = "[";
  for (size_t k = 0; k < l.size(); ++k) s += (k ? "," : "") + std::to_string(l[k]);
  return s + "]";
}

}  // namespace

std::string type_string(const Type& t) {
  std::string s = std::string(dtype_name(t.dtype)) + "[";
  for (size_t k = 0; k < t.shape.size(); ++k) s += (k ? "," : "") + dim_string(t.shape[k]);
  return s + "]";
}

// ---- Op accessors ---------------------------------------------------------------------------------

bool Op::has(std::string_view key) const {
  for (const auto& [k, v] : attrs)
    if (k == key) return true;
  return false;
}

namespace {
const AttrValue& get_attr(const Op& op, std::string_view key) {
  for (const auto& [k, v] : op.attrs)
    if (k == key) return v;
  throw Error(fmt::format("op '{}' has no attribute '{}'", op.describe(), key));
}
}  // namespace

int64_t Op::i(std::string_view key) const {
  const AttrValue& v = get_attr(*this, key);
  if (auto p = std::get_if<int64_t>(&v)) return *p;
  throw Error(fmt::format("op '{}': attribute '{}' is not an integer", describe(), key));
}
double Op::f(std::string_view key) const {
  const AttrValue& v = get_attr(*this, key);
  if (auto p = std::get_if<double>(&v)) return *p;
  if (auto p = std::get_if<int64_t>(&v)) return (double)*p;
  throw Error(fmt::format("op '{}': attribute '{}' is not a number", describe(), key));
}
const std::string& Op::s(std::string_view key) const {
  const AttrValue& v = get_attr(*this, key);
  if (auto p = std::get_if<std::string>(&v)) return *p;
  throw Error(fmt::format("op '{}': attribute '{}' is not a string", describe(), key));
}
const std::vector<int64_t>& Op::ints(std::string_view key) const {
  const AttrValue& v = get_attr(*this, key);
  if (auto p = std::get_if<std::vector<int64_t>>(&v)) return *p;
  throw Error(fmt::format("op '{}': attribute '{}' is not an integer list", describe(), key));
}
int64_t Op::i_or(std::string_view key, int64_t dflt) const { return has(key) ? i(key) : dflt; }
void Op::set(const std::string& key, AttrValue v) {
  for (auto& [k, old] : attrs)
    if (k == key) { old = std::move(v); return; }
  attrs.emplace_back(key, std::move(v));
}
std::string Op::describe() const {
  std::string s = result.empty() ? "" : "%" + result + " = ";
  s += kind + "(";
  for (size_t k = 0; k < args.size(); ++k) s += (k ? ", %" : "%") + args[k];
  return s + ")";
}

const Op* Graph::producer(std::string_view value) const {
  for (const Op& op : ops)
    if (op.result == value) return &op;
  return nullptr;
}
const Type* Graph::type_of(std::string_view value) const {
  for (const Input& in : inputs)
    if (in.name == value) return &in.type;
  const Op* op = producer(value);
  return op ? &op->type : nullptr;
}
const State* Graph::state(std::string_view name) const {
  for (const State& s : states)
    if (s.name == name) return &s;
  return nullptr;
}

// ---- printing ------------------------------------------------------------------------------------

std::string print(const Graph& g) {
  std::string o = "graph " + g.name + " {\n";
  for (const Input& in : g.inputs) o += "  input %" + in.name + " : " + type_string(in.type) + "\n";
  for (const State& st : g.states) o += "  state %" + st.name + " : " + type_string(st.type) + "\n";
  for (const Op& op : g.ops) {
    o += "  " + op.describe();
    if (!op.attrs.empty()) {
      o += " {";
      for (size_t k = 0; k < op.attrs.size(); ++k)
        o += (k ? ", " : "") + op.attrs[k].first + "=" + attr_string(op.attrs[k].second);
      o += "}";
    }
    if (!op.result.empty()) o += " : " + type_string(op.type);
    o += "\n";
  }
  for (const std::string& out : g.outputs) o += "  output %" + out + "\n";
  return o + "}\n";
}

// ---- parsing -------------------------------------------------------------------------------------

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
  AttrValue attr_value() {
    ws();
    if (pos >= s.size()) fail("expected an attribute value");
    char c = s[pos];
    if (c == '"') {
      ++pos;
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
    if (c == '[') {
      ++pos;
      std::vector<int64_t> l;
      if (!eat(']')) {
        do l.push_back(integer()); while (eat(','));
        expect(']');
      }
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
    if (line[lx.pos] == '%') {  // %r = kind(...)
      Op op;
      op.result = lx.value_name();
      lx.expect('=');
      op.kind = lx.ident("op kind");
      lx.call(op);
      lx.expect(':');
      op.type = lx.type();
      if (!lx.at_end()) lx.fail("unexpected text at end of op");
      g.ops.push_back(std::move(op));
      continue;
    }
    std::string word = lx.ident("statement");
    if (word == "input" || word == "state") {
      std::string name = lx.value_name();
      lx.expect(':');
      Type t = lx.type();
      if (!lx.at_end()) lx.fail("unexpected text at end of line");
      if (word == "input") g.inputs.push_back({name, t});
      else g.states.push_back({name, t});
    } else if (word == "output") {
      g.outputs.push_back(lx.value_name());
      if (!lx.at_end()) lx.fail("unexpected text at end of line");
    } else {  // side-effect op: kind(...) {attrs}
      Op op;
      op.kind = word;
      lx.call(op);
      if (!lx.at_end()) lx.fail("unexpected text at end of op");
      g.ops.push_back(std::move(op));
    }
  }
  if (!open) throw Error("IR: no 'graph NAME {' found");
  if (!closed) throw Error("IR: missing closing '}'");
  return g;
}

// ---- schemas and verification -------------------------------------------------------------------

const std::vector<OpSchema>& op_schemas() {
  static const std::vector<OpSchema> schemas = {
      {"embed", 1, true, {"weight"}, "rows of a table for token ids"},
      {"rmsnorm", 1, true, {"weight", "eps"}, "x * rsqrt(mean(x^2) + eps) * w per row"},
      {"matmul", 1, true, {"weight"}, "x W^T with a GGUF weight [in, out]"},
      {"add", 2, true, {}, "elementwise sum"},
      {"swiglu", 2, true, {}, "silu(gate) * up"},
      {"conv1d_silu", 1, true, {"weight", "state"}, "causal depthwise conv over time with state, then SiLU"},
      {"gdn", 3, true, {"ssm_a", "dt_bias", "key_heads", "value_heads", "key_dim", "value_dim", "state"},
       "gated delta rule over (mixed qkv, alpha, beta) with recurrent state"},
      {"gated_rmsnorm", 2, true, {"weight", "heads", "head_dim", "eps"}, "w * o/rms(o) * silu(z) per head"},
      {"head_rmsnorm", 1, true, {"weight", "heads", "head_dim", "head_stride", "head_offset", "eps"},
       "RMSNorm over each head, reading heads at a stride"},
      {"rope", 2, true, {"heads", "head_dim", "rope_dims", "theta"}, "partial NeoX rotary embedding at positions"},
      {"kv_write", 3, false, {"cache"}, "store k, v rows at positions in a KV cache state"},
      {"attention", 3, true, {"cache", "heads", "kv_heads", "head_dim", "scale", "gate_head_stride", "gate_offset"},
       "causal GQA attention over a KV cache, times sigmoid(gate)"},
      {"gather_rows", 2, true, {}, "select rows of x by index"},
  };
  return schemas;
}

const OpSchema* find_schema(std::string_view kind) {
  for (const OpSchema& s : op_schemas())
    if (kind == s.kind) return &s;
  return nullptr;
}

void verify(const Graph& g) {
  std::set<std::string> defined, states;
  auto define = [&](const std::string& n, const char* what) {
    if (n.empty()) throw Error(fmt::format("IR: empty {} name", what));
    if (!defined.insert(n).second) throw Error(fmt::format("IR: value %{} defined twice", n));
  };
  for (const Input& in : g.inputs) define(in.name, "input");
  for (const State& st : g.states)
    if (!states.insert(st.name).second) throw Error(fmt::format("IR: state %{} declared twice", st.name));
  for (const Op& op : g.ops) {
    const OpSchema* sc = find_schema(op.kind);
    if (!sc) throw Error(fmt::format("IR: unknown op kind '{}' in {}", op.kind, op.describe()));
    if ((int)op.args.size() != sc->n_args)
      throw Error(fmt::format("IR: {} takes {} arguments, has {}", op.describe(), sc->n_args, op.args.size()));
    if (sc->has_result == op.result.empty())
      throw Error(fmt::format("IR: {} {} a result", op.describe(), sc->has_result ? "needs" : "must not have"));
    for (const std::string& a : op.args)
      if (!defined.count(a)) throw Error(fmt::format("IR: {} uses %{} before it is defined", op.describe(), a));
    for (const char* r : sc->required_attrs)
      if (!op.has(r)) throw Error(fmt::format("IR: {} lacks attribute '{}'", op.describe(), r));
    for (const char* key : {"state", "cache"})
      if (op.has(key) && !states.count(op.s(key)))
        throw Error(fmt::format("IR: {} refers to undeclared state %{}", op.describe(), op.s(key)));
    if (!op.result.empty()) define(op.result, "result");
  }
  for (const std::string& o : g.outputs)
    if (!defined.count(o)) throw Error(fmt::format("IR: output %{} is not defined", o));
}

}  // namespace qrig::ir
