// JsonSchemaCompiler (grammar_json.h) and TokenGrammar::json_schema: JSON Schema keywords -> rules.
#include "text/grammar_json.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "text/grammar.h"
#include "text/tokenizer.h"

namespace qrig::text {

namespace grammar {

using json = nlohmann::ordered_json;

const std::vector<std::string>& tool_call_tags() {
  static const std::vector<std::string> tags{"</parameter>", "<parameter=", "</function>", "</tool_call>"};
  return tags;
}

namespace {

const std::set<std::string> kAnnotations{"title",    "description", "default",  "examples", "$comment", "deprecated",
                                         "readOnly", "writeOnly",   "$schema",  "$id",      "$defs",    "definitions",
                                         "$anchor",  "$vocabulary", "nullable"};
constexpr const char* kRejected[] = {"not", "if", "then", "else", "dependentSchemas"};
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

bool has_type(const json& v, const std::string& t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "string") return v.is_string();
  if (t == "array") return v.is_array();
  if (t == "object") return v.is_object();
  if (t == "number") return v.is_number();
  if (t == "integer")
    return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  return false;
}

bool only_annotations(const json& s) {
  for (const auto& [k, v] : s.items())
    if (!kAnnotations.count(k)) return false;
  return true;
}

// allOf / anyOf-sibling merge: properties and required united, anything else from b wins.
json merge(json a, const json& b) {
  for (const auto& [k, v] : b.items()) {
    if (k == "properties" && a.contains(k) && a[k].is_object() && v.is_object()) {
      for (const auto& [pk, pv] : v.items()) a[k][pk] = pv;
    } else if (k == "required" && a.contains(k) && a[k].is_array() && v.is_array()) {
      for (const json& r : v)
        if (std::find(a[k].begin(), a[k].end(), r) == a[k].end()) a[k].push_back(r);
    } else {
      a[k] = v;
    }
  }
  return a;
}

}  // namespace

JsonSchemaCompiler::JsonSchemaCompiler(GrammarBuilder& b, const json& root, bool tool_safe)
    : b_(b), root_(root), tool_safe_(tool_safe) {
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

const json& JsonSchemaCompiler::resolve(const std::string& ref) const {
  if (ref == "#") return root_;
  if (!ref.starts_with("#/")) throw GrammarError("only local $ref (\"#/...\") is supported, got \"" + ref + "\"");
  try {
    return root_.at(json::json_pointer(ref.substr(1)));
  } catch (const json::exception&) {
    throw GrammarError("$ref \"" + ref + "\" does not resolve in the schema");
  }
}

const json& JsonSchemaCompiler::deref(const json& s) const {
  const json* cur = &s;
  for (int hop = 0; hop < 32; ++hop) {
    if (!cur->is_object()) return *cur;
    auto r = cur->find("$ref");
    if (r == cur->end()) return *cur;
    if (!r->is_string()) throw GrammarError("$ref must be a string, got " + brief(*r));
    cur = &resolve(r->get<std::string>());
  }
  throw GrammarError("$ref chain longer than 32 hops");
}

uint32_t JsonSchemaCompiler::ref_rule(const std::string& ref) {
  if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
  const uint32_t r = b_.new_rule();
  refs_[ref] = r;  // before compiling the target: recursive references land here
  const uint32_t target = compile(resolve(ref));
  b_.add_alt(r, {GrammarBuilder::call(target)});
  return r;
}

json JsonSchemaCompiler::merged_all_of(const json& s) {
  const json& all = s["allOf"];
  if (!all.is_array() || all.empty()) throw GrammarError("allOf must be a non-empty array, got " + brief(all));
  json base = s;
  base.erase("allOf");
  for (const json& branch : all) {
    const json& t = deref(branch);
    if (t.is_boolean()) {
      if (!t.get<bool>()) return json(false);
      continue;
    }
    if (!t.is_object()) throw GrammarError("allOf entries must be schemas, got " + brief(t));
    base = merge(std::move(base), t);
  }
  return base;
}

uint32_t JsonSchemaCompiler::compile(const json& schema) {
  if (++depth_ > kMaxDepth) {
    depth_ = 0;
    throw GrammarError("schema nested deeper than " + std::to_string(kMaxDepth) + " levels");
  }
  const uint32_t r = compile_inner(schema);
  --depth_;
  return r;
}

uint32_t JsonSchemaCompiler::compile_inner(const json& s) {
  using G = GrammarBuilder;
  if (s.is_boolean()) return s.get<bool>() ? any_value() : b_.new_rule();
  if (!s.is_object()) throw GrammarError("a schema must be an object or a boolean, got " + brief(s));
  for (const char* k : kRejected)
    if (s.contains(k)) throw GrammarError(std::string("unsupported schema keyword \"") + k + "\"");
  if (auto r = s.find("$ref"); r != s.end()) {
    if (!r->is_string()) throw GrammarError("$ref must be a string, got " + brief(*r));
    return ref_rule(r->get<std::string>());
  }
  if (s.contains("allOf")) return compile(merged_all_of(s));
  if (auto n = s.find("nullable"); n != s.end() && n->is_boolean() && n->get<bool>()) {
    json rest = s;
    rest.erase("nullable");
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
    const uint32_t r = b_.new_rule();
    for (const json& branch : *it) {
      if (plain) {
        b_.add_alt(r, {G::call(compile(branch))});
      } else {
        const json& t = deref(branch);
        if (t.is_boolean() && !t.get<bool>()) continue;
        b_.add_alt(r, {G::call(compile(t.is_object() ? merge(base, t) : t))});
      }
    }
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
  auto allowed_value = [&](const json& v) {
    if (!explicit_type) return true;
    for (const std::string& t : types)
      if (has_type(v, t)) return true;
    return false;
  };
  if (auto c = s.find("const"); c != s.end()) return literal_rule(allowed_value(*c) ? std::vector<json>{*c} : std::vector<json>{});
  if (auto e = s.find("enum"); e != s.end()) {
    if (!e->is_array()) throw GrammarError("enum must be an array, got " + brief(*e));
    std::vector<json> values;
    for (const json& v : *e)
      if (allowed_value(v)) values.push_back(v);
    return literal_rule(values);
  }
  if (!explicit_type) {
    auto any_of = [&](std::initializer_list<const char*> keys) {
      for (const char* k : keys)
        if (s.contains(k)) return true;
      return false;
    };
    if (any_of({"properties", "required", "additionalProperties"})) types = {"object"};
    else if (any_of({"items", "prefixItems", "minItems", "maxItems"})) types = {"array"};
    else if (any_of({"minLength", "maxLength", "pattern", "format"})) types = {"string"};
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
  if (type == "string") return string_rule(schema_count(s, "minLength", 0), schema_count(s, "maxLength", UINT32_MAX));
  if (type == "number" || type == "integer") return number_rule(type == "integer");
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
