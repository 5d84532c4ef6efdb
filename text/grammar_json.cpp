// JsonSchemaCompiler (grammar_json.h) and TokenGrammar::json_schema: JSON Schema keywords -> rules.
#include "text/grammar_json.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "text/grammar.h"
#include "text/grammar_number.h"
#include "text/tokenizer.h"

namespace qrig::text {

namespace grammar {

using json = nlohmann::ordered_json;

const std::vector<std::string>& tool_call_tags() {
  static const std::vector<std::string> tags{"</parameter>", "<parameter=", "</function>", "</tool_call>"};
  return tags;
}

namespace {

constexpr int kMaxDepth = 64;

std::string brief(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 120 ? s.substr(0, 117) + "..." : s;
}

std::string dump(const json& v) {
  try {
    return v.dump();
  } catch (const json::exception& e) {
    throw GrammarError(std::string("schema value cannot be written as JSON: ") + e.what());
  }
}

}  // namespace

uint32_t schema_count(const json& s, const char* key, uint32_t dflt) {
  auto it = s.find(key);
  if (it == s.end()) return dflt;
  double v = -1;
  if (it->is_number_unsigned()) v = static_cast<double>(it->get<uint64_t>());
  else if (it->is_number_integer()) v = static_cast<double>(it->get<int64_t>());
  else if (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>()) v = it->get<double>();
  if (v < 0) throw GrammarError(std::string(key) + " must be a non-negative integer, got " + brief(*it));
  return v >= double(UINT32_MAX - 1) ? UINT32_MAX - 1 : static_cast<uint32_t>(v);
}

namespace {

bool only_annotations(const json& s, const char* except = nullptr) {
  for (const auto& [k, v] : s.items())
    if (!is_annotation(k) && (!except || k != except)) return false;
  return true;
}

// A readable identity for a JSON value (memo keys).
std::string key_of(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

JsonSchemaCompiler::JsonSchemaCompiler(GrammarBuilder& b, const json& root, bool tool_safe)
    : b_(b), root_(root), tool_safe_(tool_safe), checker_(root) {
  string_def_.base = LexBase::JsonString;
  key_def_.base = LexBase::JsonStringPlain;
  if (tool_safe)
    for (const std::string& t : tool_call_tags()) {
      string_def_.patterns.push_back(LexPattern{t, false});
      key_def_.patterns.push_back(LexPattern{t, false});
    }
}

bool JsonSchemaCompiler::literal_ok(const std::string& text) const {
  if (tool_safe_)
    for (const std::string& t : tool_call_tags())
      if (text.find(t) != std::string::npos) return false;
  return true;
}

uint32_t JsonSchemaCompiler::ws() {
  if (ws_ == kNone) ws_ = b_.rule_of({{b_.set(byte_set(" \n"))}, {}});
  return ws_;
}

uint32_t JsonSchemaCompiler::optional_digits(uint32_t n) {
  if (auto it = opt_digits_.find(n); it != opt_digits_.end()) return it->second;
  const uint32_t r = n == 0 ? b_.rule_of({{}}) : b_.rule_of({{b_.set(byte_set("0123456789")), GrammarBuilder::call(optional_digits(n - 1))}, {}});
  opt_digits_[n] = r;
  return r;
}

uint32_t JsonSchemaCompiler::number_rule(bool integer) {
  uint32_t& memo = integer ? integer_ : number_;
  if (memo != kNone) return memo;
  using G = GrammarBuilder;
  const Item digit = b_.set(byte_set("0123456789"));
  const uint32_t sign = b_.rule_of({{b_.set(byte_set("-"))}, {}});
  const uint32_t int_part = b_.rule_of({{b_.set(byte_set("0"))}, {b_.set(byte_set("123456789")), G::call(optional_digits(15))}});
  if (integer) return memo = b_.rule_of({{G::call(sign), G::call(int_part)}});
  const uint32_t frac = b_.rule_of({{b_.set(byte_set(".")), digit, G::call(optional_digits(15))}, {}});
  const uint32_t exp_sign = b_.rule_of({{b_.set(byte_set("+-"))}, {}});
  const uint32_t exp = b_.rule_of({{b_.set(byte_set("eE")), G::call(exp_sign), digit, G::call(optional_digits(1))}, {}});
  return memo = b_.rule_of({{G::call(sign), G::call(int_part), G::call(frac), G::call(exp)}});
}

uint32_t JsonSchemaCompiler::string_rule(uint32_t min_chars, uint32_t max_chars) {
  const auto key = std::make_pair(min_chars, max_chars);
  if (auto it = strings_.find(key); it != strings_.end()) return it->second;
  std::vector<Item> seq;
  b_.lit(seq, "\"");
  seq.push_back(b_.lex(string_def_, min_chars, max_chars));
  const uint32_t r = b_.rule_of({std::move(seq)});
  strings_[key] = r;
  return r;
}

uint32_t JsonSchemaCompiler::any_value() {
  if (value_ != kNone) return value_;
  using G = GrammarBuilder;
  value_ = b_.new_rule();
  b_.add_alt(value_, {G::call(any_object())});
  // array := "[" W "]" | "[" W value rest W "]";  rest := W "," W value rest | eps
  const uint32_t arr = b_.new_rule(), rest = b_.new_rule();
  std::vector<Item> empty, full, more;
  b_.lit(empty, "[");
  W(empty);
  b_.lit(empty, "]");
  b_.lit(full, "[");
  W(full);
  full.push_back(G::call(value_));
  full.push_back(G::call(rest));
  W(full);
  b_.lit(full, "]");
  W(more);
  b_.lit(more, ",");
  W(more);
  more.push_back(G::call(value_));
  more.push_back(G::call(rest));
  b_.add_alt(arr, std::move(empty));
  b_.add_alt(arr, std::move(full));
  b_.add_alt(rest, std::move(more));
  b_.add_alt(rest, {});
  b_.add_alt(value_, {G::call(arr)});
  b_.add_alt(value_, {G::call(string_rule(0, UINT32_MAX))});
  b_.add_alt(value_, {G::call(number_rule(false))});
  for (const char* word : {"true", "false", "null"}) {
    std::vector<Item> seq;
    b_.lit(seq, word);
    b_.add_alt(value_, std::move(seq));
  }
  return value_;
}

uint32_t JsonSchemaCompiler::any_object() {
  if (object_ != kNone) return object_;
  using G = GrammarBuilder;
  object_ = b_.new_rule();
  const uint32_t members = b_.new_rule(), rest = b_.new_rule();
  const uint32_t value = any_value();
  auto kv = [&](std::vector<Item>& seq) {
    seq.push_back(G::call(string_rule(0, UINT32_MAX)));
    W(seq);
    b_.lit(seq, ":");
    W(seq);
    seq.push_back(G::call(value));
  };
  std::vector<Item> m, more, empty, full;
  kv(m);
  m.push_back(G::call(rest));
  b_.add_alt(members, std::move(m));
  W(more);
  b_.lit(more, ",");
  W(more);
  kv(more);
  more.push_back(G::call(rest));
  b_.add_alt(rest, std::move(more));
  b_.add_alt(rest, {});
  b_.lit(empty, "{");
  W(empty);
  b_.lit(empty, "}");
  b_.lit(full, "{");
  W(full);
  full.push_back(G::call(members));
  W(full);
  b_.lit(full, "}");
  b_.add_alt(object_, std::move(empty));
  b_.add_alt(object_, std::move(full));
  return object_;
}

std::string JsonSchemaCompiler::string_key(const json& s) {
  json k = json::object();
  for (const char* name : {"pattern", "format", "minLength", "maxLength"})
    if (s.contains(name)) k[name] = s[name];
  return key_of(k);
}

std::optional<JsonSchemaCompiler::StringAutomaton> JsonSchemaCompiler::string_dfa(const json& s) {
  std::vector<std::string> patterns;
  if (auto p = s.find("pattern"); p != s.end()) {
    if (p->is_string()) patterns.push_back(p->get<std::string>());
    else if (p->is_array() && !p->empty() && std::all_of(p->begin(), p->end(), [](const json& e) { return e.is_string(); }))
      for (const json& e : *p) patterns.push_back(e.get<std::string>());
    else throw GrammarError("pattern must be a string, got " + brief(*p));
  }
  const json* format = nullptr;
  if (auto f = s.find("format"); f != s.end()) {
    if (!f->is_string()) throw GrammarError("format must be a string, got " + brief(*f));
    format = &*f;
  }
  if (patterns.empty() && !format) return std::nullopt;
  const std::string key = string_key(s);
  if (auto it = string_dfas_.find(key); it != string_dfas_.end()) return it->second;
  std::optional<ByteDfa> v;
  const std::string what = "the string of " + key;
  if (format) v = checker_.format(format->get<std::string>());
  for (const std::string& p : patterns) v = v ? intersect(*v, checker_.pattern(p), what) : checker_.pattern(p);
  const uint32_t min = schema_count(s, "minLength", 0), max = schema_count(s, "maxLength", UINT32_MAX);
  if (min > max)
    throw GrammarError("string length range is empty: minLength " + std::to_string(min) + " > maxLength " + std::to_string(max));
  StringAutomaton out;
  if (min > 0 || max != UINT32_MAX) {
    if (counts_safely(*v)) {
      out.min_chars = min;
      out.max_chars = max;
    } else {
      v = limit_chars(*v, min, max, what);
    }
  }
  out.dfa = std::move(*v);
  string_dfas_.emplace(key, out);
  return out;
}

uint32_t JsonSchemaCompiler::literal_rule(const std::vector<json>& values) {
  const uint32_t r = b_.new_rule();  // no alternative left = no value (pruned later, or "admits no value")
  for (const json& v : values) {
    const std::string text = dump(v);
    if (!literal_ok(text)) continue;
    std::vector<Item> seq;
    b_.lit(seq, text);
    b_.add_alt(r, std::move(seq));
  }
  return r;
}

uint32_t JsonSchemaCompiler::ref_rule(const std::string& ref) {
  if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
  const uint32_t r = b_.new_rule();
  refs_[ref] = r;  // before compiling the target: recursive references land here
  std::vector<std::string> saved = std::move(path_);
  path_ = {ref.size() > 2 ? ref.substr(2) : std::string()};
  uint32_t target;
  try {
    target = compile(checker_.resolve(ref));
  } catch (...) {
    path_ = std::move(saved);
    throw;
  }
  path_ = std::move(saved);
  b_.add_alt(r, {GrammarBuilder::call(target)});
  return r;
}

json JsonSchemaCompiler::expanded(const json& s) {
  const json* cur = &checker_.deref(s);
  json out;
  for (int hop = 0; hop < 32; ++hop) {
    if (!cur->is_object() || !cur->contains("$ref")) return *cur;
    // a $ref with validating siblings: both apply
    const json& r = (*cur)["$ref"];
    if (!r.is_string()) throw GrammarError("$ref must be a string, got " + brief(r));
    json rest = *cur;
    rest.erase("$ref");
    const json& target = checker_.deref(checker_.resolve(r.get<std::string>()));
    if (target.is_boolean()) out = target.get<bool>() ? rest : json(false);
    else if (!target.is_object()) throw GrammarError("$ref \"" + r.get<std::string>() + "\" is not a schema");
    else out = checker_.merge(target, rest);
    cur = &out;
  }
  throw GrammarError("$ref chain longer than 32 hops");
}

json JsonSchemaCompiler::merged_all_of(const json& s) {
  const json& all = s["allOf"];
  if (!all.is_array() || all.empty()) throw GrammarError("allOf must be a non-empty array, got " + brief(all));
  json base = s;
  base.erase("allOf");
  for (const json& branch : all) {
    const json t = expanded(branch);
    if (t.is_boolean()) {
      if (!t.get<bool>()) return json(false);
      continue;
    }
    if (!t.is_object()) throw GrammarError("allOf entries must be schemas, got " + brief(t));
    base = checker_.merge(std::move(base), t);
    if (base.is_boolean()) return base;
  }
  return base;
}

uint32_t JsonSchemaCompiler::compile(const json& schema, const std::string& segment) {
  if (++depth_ > kMaxDepth) {
    depth_ = 0;
    throw GrammarError("schema nested deeper than " + std::to_string(kMaxDepth) + " levels");
  }
  if (!segment.empty()) path_.push_back(segment);
  uint32_t r;
  try {
    r = compile_inner(schema);
  } catch (const GrammarError& e) {
    std::string m = e.what();
    if (!m.starts_with("at #") && !path_.empty() && !m.starts_with("schema nested deeper")) {
      std::string at;
      for (const std::string& p : path_) at += "/" + p;
      m = "at #" + at + ": " + m;
    }
    if (!segment.empty()) path_.pop_back();
    --depth_;
    throw GrammarError(m);
  }
  if (!segment.empty()) path_.pop_back();
  --depth_;
  return r;
}

uint32_t JsonSchemaCompiler::compile_inner(const json& s) {
  using G = GrammarBuilder;
  if (s.is_boolean()) return s.get<bool>() ? any_value() : b_.new_rule();
  if (!s.is_object()) throw GrammarError("a schema must be an object or a boolean, got " + brief(s));
  check_keywords(s);
  if (auto r = s.find("$ref"); r != s.end()) {
    if (!r->is_string()) throw GrammarError("$ref must be a string, got " + brief(*r));
    if (only_annotations(s, "$ref")) return ref_rule(r->get<std::string>());
    return compile(expanded(s));
  }
  if (s.contains("allOf")) return compile(merged_all_of(s));
  if (auto n = s.find("nullable"); n != s.end()) {
    if (!n->is_boolean()) throw GrammarError("nullable must be a boolean");
    json rest = s;
    rest.erase("nullable");
    if (!n->get<bool>()) return compile(rest);
    std::vector<Item> null_seq;
    b_.lit(null_seq, "null");
    return b_.rule_of({{G::call(compile(rest))}, std::move(null_seq)});
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    auto it = s.find(key);
    if (it == s.end()) continue;
    if (!it->is_array() || it->empty()) throw GrammarError(std::string(key) + " must be a non-empty array");
    json base = s;
    base.erase(key);
    const bool plain = only_annotations(base);
    std::vector<json> branches;
    for (const json& branch : *it) {
      json t = plain ? json(branch) : expanded(branch);
      if (!plain && t.is_object()) t = checker_.merge(base, t);
      branches.push_back(std::move(t));
    }
    if (std::string(key) == "oneOf")
      for (size_t i = 0; i < branches.size(); ++i)
        for (size_t j = 0; j < branches.size(); ++j)
          if (i != j && !checker_.excludes(branches[i], branches[j]))
            throw GrammarError("oneOf branches " + std::to_string(i) + " and " + std::to_string(j) +
                               " may both match one value; oneOf is honoured only when its branches exclude each "
                               "other (by type, const/enum values, a required member or a discriminating member)");
    const uint32_t r = b_.new_rule();
    for (size_t i = 0; i < branches.size(); ++i)
      b_.add_alt(r, {G::call(compile(branches[i], std::string(key) + "/" + std::to_string(i)))});
    return r;
  }

  std::vector<std::string> types;
  bool explicit_type = false;
  if (auto t = s.find("type"); t != s.end()) {
    explicit_type = true;
    if (t->is_string()) types.push_back(t->get<std::string>());
    else if (t->is_array())
      for (const json& e : *t) {
        if (!e.is_string()) throw GrammarError("type entries must be strings, got " + brief(e));
        types.push_back(e.get<std::string>());
      }
    else throw GrammarError("type must be a string or an array, got " + brief(*t));
    for (const std::string& name : types)
      if (name != "object" && name != "array" && name != "string" && name != "number" && name != "integer" &&
          name != "boolean" && name != "null")
        throw GrammarError("unknown type \"" + name + "\"");
    if (types.empty()) throw GrammarError("type is an empty array");
  }
  // enum / const: the values that also satisfy every sibling keyword
  auto literals = [&](const json& values) {
    std::vector<json> keep;
    for (const json& v : values)
      if (checker_.accepts(v, s)) keep.push_back(v);
    return literal_rule(keep);
  };
  if (auto c = s.find("const"); c != s.end()) return literals(json::array({*c}));
  if (auto e = s.find("enum"); e != s.end()) {
    if (!e->is_array()) throw GrammarError("enum must be an array, got " + brief(*e));
    return literals(*e);
  }
  if (!explicit_type) {
    auto any_of = [&](std::initializer_list<const char*> keys) {
      for (const char* k : keys)
        if (s.contains(k)) return true;
      return false;
    };
    const bool object = any_of({"properties", "required", "additionalProperties"});
    const bool array = any_of({"items", "prefixItems", "additionalItems", "minItems", "maxItems"});
    const bool string = any_of({"minLength", "maxLength", "pattern", "format"});
    const bool number = any_of({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"});
    if (object + array + string + number > 1)
      throw GrammarError("keywords of several types without \"type\" (the grammar writes one type; say which)");
    if (object) types = {"object"};
    else if (array) types = {"array"};
    else if (string) types = {"string"};
    else if (number) types = {"number"};
    else return any_value();
  }
  if (std::find(types.begin(), types.end(), "number") != types.end()) std::erase(types, std::string("integer"));
  std::sort(types.begin(), types.end());
  types.erase(std::unique(types.begin(), types.end()), types.end());
  if (types.size() == 1) return type_rule(types[0], s);
  const uint32_t r = b_.new_rule();
  for (const std::string& t : types) b_.add_alt(r, {G::call(type_rule(t, s))});
  return r;
}

uint32_t JsonSchemaCompiler::type_rule(const std::string& type, const json& s) {
  if (type == "string") {
    const uint32_t min = schema_count(s, "minLength", 0), max = schema_count(s, "maxLength", UINT32_MAX);
    if (std::optional<StringAutomaton> v = string_dfa(s)) {
      std::vector<Item> seq;
      b_.lit(seq, "\"");
      // the key names the automaton: with the lengths folded in or not
      const std::string key = string_key(s) + (v->max_chars != UINT32_MAX || v->min_chars ? "|counted" : "");
      auto lexer = string_lexer(v->dfa, tool_safe_ ? StringLexerMode::JsonToolSafe : StringLexerMode::Json, key);
      if (!lexer) return b_.new_rule();  // no string can be written
      seq.push_back(b_.lex(std::move(lexer), v->min_chars, v->max_chars));
      return b_.rule_of({std::move(seq)});
    }
    return string_rule(min, max);
  }
  if (type == "number" || type == "integer") {
    const std::string key = type + key_of(s);
    if (auto it = numbers_.find(key); it != numbers_.end()) return it->second;
    if (std::optional<ByteDfa> d = number_dfa(s, type == "integer")) return numbers_[key] = dfa_rule(b_, *d);
    return number_rule(type == "integer");
  }
  if (type == "object") return object_rule(s);
  if (type == "array") return array_rule(s);
  std::vector<std::vector<Item>> alts;
  for (const char* word : type == "boolean" ? std::vector<const char*>{"true", "false"} : std::vector<const char*>{"null"}) {
    alts.emplace_back();
    b_.lit(alts.back(), word);
  }
  return b_.rule_of(std::move(alts));
}

}  // namespace grammar

}  // namespace qrig::text
