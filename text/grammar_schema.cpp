// check_keywords, merge and SchemaChecker (grammar_schema.h).
#include "text/grammar_schema.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "text/grammar_regex.h"

namespace qrig::text::grammar {

using json = nlohmann::ordered_json;

namespace {

const std::set<std::string> kHonoured{
    "type",       "enum",        "const",     "properties",       "required",         "additionalProperties",
    "items",      "prefixItems", "additionalItems", "minItems",   "maxItems",         "minLength",
    "maxLength",  "pattern",     "format",    "minimum",          "maximum",          "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "anyOf", "oneOf",           "allOf",            "$ref",
    "nullable"};
const std::set<std::string> kAnnotations{
    "title",    "description", "default",  "examples",    "example",         "$comment",         "deprecated",
    "readOnly", "writeOnly",   "$schema",  "$id",         "$anchor",         "$vocabulary",      "$defs",
    "definitions", "contentEncoding", "contentMediaType", "contentSchema", "discriminator", "xml", "externalDocs"};

const std::map<std::string, std::string>& refused() {
  static const std::map<std::string, std::string> m{
      {"not", "negation cannot be expressed as a grammar"},
      {"if", "conditional schemas are not supported"},
      {"then", "conditional schemas are not supported"},
      {"else", "conditional schemas are not supported"},
      {"dependentSchemas", "conditional schemas are not supported"},
      {"dependentRequired", "members required by other members are not supported"},
      {"dependencies", "members required by other members are not supported"},
      {"patternProperties", "member names matched by patterns are not supported"},
      {"propertyNames", "constraints on member names are not supported"},
      {"minProperties", "member counts are not enforced"},
      {"maxProperties", "member counts are not enforced"},
      {"uniqueItems", "the grammar cannot keep array items distinct"},
      {"contains", "array search keywords are not supported"},
      {"minContains", "array search keywords are not supported"},
      {"maxContains", "array search keywords are not supported"},
      {"unevaluatedProperties", "unevaluated* keywords are not supported"},
      {"unevaluatedItems", "unevaluated* keywords are not supported"},
      {"$dynamicRef", "dynamic references are not supported"},
      {"$dynamicAnchor", "dynamic references are not supported"},
      {"$recursiveRef", "dynamic references are not supported"},
      {"$recursiveAnchor", "dynamic references are not supported"},
  };
  return m;
}

std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

bool no_op(const std::string& k, const json& v) {
  if (k == "uniqueItems") return v.is_boolean() && !v.get<bool>();
  if (k == "minProperties") return v.is_number() && v.get<double>() == 0;
  return false;
}

size_t utf8_chars(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_integral(const json& v) {
  return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
}

bool has_type(const json& v, const std::string& t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "string") return v.is_string();
  if (t == "array") return v.is_array();
  if (t == "object") return v.is_object();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_number() && is_integral(v);
  return false;
}

std::string type_of(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return is_integral(v) ? "integer" : "number";
}

const std::set<std::string> kAllTypes{"null", "boolean", "string", "array", "object", "number", "integer"};

std::set<std::string> type_keyword(const json& s) {
  std::set<std::string> out;
  auto t = s.find("type");
  if (t == s.end()) return kAllTypes;
  if (t->is_string()) out.insert(t->get<std::string>());
  else if (t->is_array())
    for (const json& e : *t)
      if (e.is_string()) out.insert(e.get<std::string>());
  if (out.count("number")) out.insert("integer");
  if (auto n = s.find("nullable"); n != s.end() && *n == true) out.insert("null");
  return out;
}

// Types a schema's values can have: `generated` = what the grammar writes (type inferred from keywords as
// the compiler does), else what validation accepts.
std::set<std::string> types_of(const json& s, bool generated) {
  if (s.is_boolean()) return s.get<bool>() ? kAllTypes : std::set<std::string>{};
  if (!s.is_object() || s.contains("anyOf") || s.contains("oneOf") || s.contains("allOf") || s.contains("$ref"))
    return kAllTypes;
  std::set<std::string> values;
  if (auto c = s.find("const"); c != s.end()) values.insert(type_of(*c));
  else if (auto e = s.find("enum"); e != s.end() && e->is_array())
    for (const json& v : *e) values.insert(type_of(v));
  else values = kAllTypes;
  std::set<std::string> types = type_keyword(s);
  if (generated && !s.contains("type")) {
    auto any = [&](std::initializer_list<const char*> keys) {
      return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.contains(k); });
    };
    if (any({"properties", "required", "additionalProperties"})) types = {"object"};
    else if (any({"items", "prefixItems", "minItems", "maxItems"})) types = {"array"};
    else if (any({"minLength", "maxLength", "pattern", "format"})) types = {"string"};
  }
  std::set<std::string> out;
  for (const std::string& t : values)
    if (types.count(t) || (t == "integer" && types.count("number"))) out.insert(t);
  return out;
}

bool types_overlap(const std::set<std::string>& a, const std::set<std::string>& b) {
  for (const std::string& t : a)
    for (const std::string& u : b)
      if (t == u || (t == "integer" && u == "number") || (t == "number" && u == "integer")) return true;
  return false;
}

// Draft 4's boolean exclusive bounds as the later numeric form.
json normalised(json s) {
  for (const auto& [x, plain] : {std::pair<const char*, const char*>{"exclusiveMinimum", "minimum"}, {"exclusiveMaximum", "maximum"}}) {
    auto it = s.find(x);
    if (it == s.end() || !it->is_boolean()) continue;
    const bool on = it->get<bool>();
    s.erase(x);
    if (on && s.contains(plain)) {
      s[x] = s[plain];
      s.erase(plain);
    }
  }
  return s;
}

}  // namespace

bool is_annotation(const std::string& key) { return kAnnotations.count(key) || key.starts_with("x-"); }

void check_keywords(const json& s) {
  for (const auto& [k, v] : s.items()) {
    if (kHonoured.count(k) || is_annotation(k) || no_op(k, v)) continue;
    if (auto it = refused().find(k); it != refused().end())
      throw GrammarError("schema keyword \"" + k + "\" is not supported: " + it->second);
    throw GrammarError("unknown schema keyword \"" + k + "\" (constrained decoding refuses what it cannot honour)");
  }
}

const json& SchemaChecker::resolve(const std::string& ref) const {
  if (ref == "#") return root_;
  if (!ref.starts_with("#/")) throw GrammarError("only local $ref (\"#/...\") is supported, got \"" + ref + "\"");
  try {
    return root_.at(json::json_pointer(ref.substr(1)));
  } catch (const json::exception&) {
    throw GrammarError("$ref \"" + ref + "\" does not resolve in the schema");
  }
}

const json& SchemaChecker::deref(const json& s) const {
  const json* cur = &s;
  for (int hop = 0; hop < 32; ++hop) {
    if (!cur->is_object()) return *cur;
    auto r = cur->find("$ref");
    if (r == cur->end()) return *cur;
    for (const auto& [k, v] : cur->items())
      if (k != "$ref" && !is_annotation(k)) return *cur;
    if (!r->is_string()) throw GrammarError("$ref must be a string, got " + shown(*r));
    cur = &resolve(r->get<std::string>());
  }
  throw GrammarError("$ref chain longer than 32 hops");
}

const ByteDfa& SchemaChecker::pattern(const std::string& p) {
  auto it = patterns_.find(p);
  if (it == patterns_.end()) it = patterns_.emplace(p, pattern_dfa(p)).first;
  return it->second;
}

const ByteDfa& SchemaChecker::format(const std::string& f) {
  auto it = formats_.find(f);
  if (it == formats_.end()) it = formats_.emplace(f, format_dfa(f)).first;
  return it->second;
}

bool SchemaChecker::accepts(const json& v, const json& s0, int depth) {
  if (depth > 64) throw GrammarError("schema nested deeper than 64 levels");
  if (s0.is_boolean()) return s0.get<bool>();
  if (!s0.is_object()) return false;
  const json s = normalised(s0);
  if (auto r = s.find("$ref"); r != s.end() && r->is_string()) {
    if (!accepts(v, resolve(r->get<std::string>()), depth + 1)) return false;
    json rest = s;
    rest.erase("$ref");
    return accepts(v, rest, depth + 1);
  }
  if (auto n = s.find("nullable"); n != s.end() && *n == true && v.is_null()) return true;
  if (s.contains("type")) {
    const auto types = type_keyword(s);
    if (std::none_of(types.begin(), types.end(), [&](const std::string& t) { return has_type(v, t); })) return false;
  }
  if (auto c = s.find("const"); c != s.end() && v != *c) return false;
  if (auto e = s.find("enum"); e != s.end() && e->is_array() && std::find(e->begin(), e->end(), v) == e->end()) return false;
  if (v.is_number()) {
    const double x = v.get<double>();
    auto num = [&](const char* k, auto ok) {
      auto it = s.find(k);
      return it == s.end() || !it->is_number() || ok(it->get<double>());
    };
    if (!num("minimum", [&](double b) { return x >= b; }) || !num("maximum", [&](double b) { return x <= b; }) ||
        !num("exclusiveMinimum", [&](double b) { return x > b; }) || !num("exclusiveMaximum", [&](double b) { return x < b; }) ||
        !num("multipleOf", [&](double b) { return b > 0 && std::fmod(x, b) == 0; }))
      return false;
  }
  if (v.is_string()) {
    const std::string& str = v.get_ref<const std::string&>();
    const size_t n = utf8_chars(str);
    if (auto it = s.find("minLength"); it != s.end() && it->is_number() && double(n) < it->get<double>()) return false;
    if (auto it = s.find("maxLength"); it != s.end() && it->is_number() && double(n) > it->get<double>()) return false;
    if (auto it = s.find("pattern"); it != s.end()) {
      if (it->is_string() && !pattern(it->get<std::string>()).matches(str)) return false;
      if (it->is_array())
        for (const json& p : *it)
          if (p.is_string() && !pattern(p.get<std::string>()).matches(str)) return false;
    }
    if (auto it = s.find("format"); it != s.end() && it->is_string() && !format(it->get<std::string>()).matches(str))
      return false;
  }
  if (v.is_array()) {
    const json* prefix = nullptr;
    const json* rest = nullptr;
    if (auto p = s.find("prefixItems"); p != s.end() && p->is_array()) prefix = &*p;
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_array() && !prefix) {
        prefix = &*it;
        if (auto a = s.find("additionalItems"); a != s.end()) rest = &*a;
      } else if (!it->is_array()) {
        rest = &*it;
      }
    }
    for (size_t i = 0; i < v.size(); ++i) {
      const json* sub = prefix && i < prefix->size() ? &(*prefix)[i] : rest;
      if (sub && !accepts(v[i], *sub, depth + 1)) return false;
    }
    if (auto it = s.find("minItems"); it != s.end() && it->is_number() && double(v.size()) < it->get<double>()) return false;
    if (auto it = s.find("maxItems"); it != s.end() && it->is_number() && double(v.size()) > it->get<double>()) return false;
  }
  if (v.is_object()) {
    const json empty = json::object();
    const json& props = s.contains("properties") && s["properties"].is_object() ? s["properties"] : empty;
    for (const auto& [k, pv] : v.items()) {
      if (auto p = props.find(k); p != props.end()) {
        if (!accepts(pv, *p, depth + 1)) return false;
      } else if (auto a = s.find("additionalProperties"); a != s.end() && !accepts(pv, *a, depth + 1)) {
        return false;
      }
    }
    if (auto r = s.find("required"); r != s.end() && r->is_array())
      for (const json& k : *r)
        if (k.is_string() && !v.contains(k.get<std::string>())) return false;
  }
  if (auto a = s.find("allOf"); a != s.end() && a->is_array())
    for (const json& b : *a)
      if (!accepts(v, b, depth + 1)) return false;
  if (auto a = s.find("anyOf"); a != s.end() && a->is_array() &&
                                std::none_of(a->begin(), a->end(), [&](const json& b) { return accepts(v, b, depth + 1); }))
    return false;
  if (auto a = s.find("oneOf"); a != s.end() && a->is_array() &&
                                std::count_if(a->begin(), a->end(), [&](const json& b) { return accepts(v, b, depth + 1); }) != 1)
    return false;
  return true;
}

json SchemaChecker::merge(json a, const json& b0) {
  if (!a.is_object() || !b0.is_object()) throw GrammarError("allOf entries must be schemas");
  a = normalised(std::move(a));
  const json b = normalised(b0);
  auto both_schema = [](const json& x, const json& y) {
    if (x == y) return x;
    if (x.is_boolean()) return x.get<bool>() ? y : x;
    if (y.is_boolean()) return y.get<bool>() ? x : y;
    return json{{"allOf", json::array({x, y})}};
  };
  // Members: a name only one side declares must also satisfy the other side's additionalProperties.
  if (a.contains("properties") || b.contains("properties") || a.contains("additionalProperties") ||
      b.contains("additionalProperties")) {
    const json empty = json::object();
    const json pa = a.value("properties", empty), pb = b.value("properties", empty);
    if (!pa.is_object() || !pb.is_object()) throw GrammarError("properties must be an object");
    const json* adda = a.contains("additionalProperties") ? &a["additionalProperties"] : nullptr;
    const json* addb = b.contains("additionalProperties") ? &b["additionalProperties"] : nullptr;
    json props = json::object();
    for (const auto& [k, v] : pa.items()) props[k] = pb.contains(k) ? both_schema(v, pb[k]) : addb ? both_schema(v, *addb) : v;
    for (const auto& [k, v] : pb.items())
      if (!pa.contains(k)) props[k] = adda ? both_schema(v, *adda) : v;
    json add;
    if (adda && addb) add = both_schema(*adda, *addb);
    else if (adda) add = *adda;
    else if (addb) add = *addb;
    if (!props.empty()) a["properties"] = props;
    if (!add.is_null()) a["additionalProperties"] = add;
  }
  for (const auto& [k, v] : b.items()) {
    if (k == "properties" || k == "additionalProperties") continue;
    if (!a.contains(k)) {
      a[k] = v;
      continue;
    }
    json& x = a[k];
    if (x == v || is_annotation(k)) continue;
    auto number = [&, &k = k, &v = v](bool larger) {  // the bindings by init-capture: clang before 16
      if (!x.is_number() || !v.is_number()) throw GrammarError(k + " must be a number");
      if ((v.get<double>() > x.get<double>()) == larger) x = v;
    };
    if (k == "type") {
      auto names = [](const json& t) {
        std::set<std::string> out;
        if (t.is_string()) out.insert(t.get<std::string>());
        else if (t.is_array())
          for (const json& e : t)
            if (e.is_string()) out.insert(e.get<std::string>());
        return out;
      };
      const std::set<std::string> tx = names(x), tv = names(v);
      json t = json::array();
      for (const std::string& name : tx) {
        if (tv.count(name)) t.push_back(name);
        else if ((name == "integer" && tv.count("number")) || (name == "number" && tv.count("integer"))) t.push_back("integer");
      }
      if (t.empty()) return json(false);
      x = t;
    } else if (k == "required") {
      if (!x.is_array() || !v.is_array()) throw GrammarError("required must be an array of names");
      for (const json& r : v)
        if (std::find(x.begin(), x.end(), r) == x.end()) x.push_back(r);
    } else if (k == "enum") {
      if (!x.is_array() || !v.is_array()) throw GrammarError("enum must be an array");
      json keep = json::array();
      for (const json& e : x)
        if (std::find(v.begin(), v.end(), e) != v.end()) keep.push_back(e);
      x = keep;
    } else if (k == "const") {
      return json(false);
    } else if (k == "minimum" || k == "exclusiveMinimum" || k == "minLength" || k == "minItems") {
      number(true);
    } else if (k == "maximum" || k == "exclusiveMaximum" || k == "maxLength" || k == "maxItems") {
      number(false);
    } else if (k == "multipleOf") {
      if (!x.is_number_integer() || !v.is_number_integer())
        throw GrammarError("allOf combines multipleOf " + shown(x) + " and " + shown(v) + ", which is supported for integers only");
      x = std::lcm(x.get<int64_t>(), v.get<int64_t>());
    } else if (k == "pattern") {
      json list = x.is_array() ? x : json::array({x});
      if (v.is_array()) list.insert(list.end(), v.begin(), v.end());
      else list.push_back(v);
      x = list;
    } else if (k == "items") {
      x = both_schema(x, v);
    } else if (k == "allOf") {
      if (!x.is_array() || !v.is_array()) throw GrammarError("allOf must be an array");
      x.insert(x.end(), v.begin(), v.end());
    } else if (k == "nullable") {
      x = x == true && v == true;
    } else if (k == "anyOf" && x.is_array() && v.is_array()) {
      if (x.size() * v.size() > 64) throw GrammarError("allOf combines anyOf lists with more than 64 combinations");
      json pairs = json::array();
      for (const json& p : x)
        for (const json& q : v) pairs.push_back(both_schema(p, q));
      x = pairs;
    } else {
      throw GrammarError("allOf combines different values of \"" + k + "\" (" + shown(x) + " and " + shown(v) +
                         "), which is not supported");
    }
  }
  return a;
}

bool SchemaChecker::excludes(const json& a0, const json& b0) {
  const json& a = deref(a0);
  const json& b = deref(b0);
  if (a.is_boolean() && !a.get<bool>()) return true;
  if (b.is_boolean()) return !b.get<bool>();
  if (!a.is_object() || !b.is_object()) return false;
  if (!types_overlap(types_of(a, true), types_of(b, false))) return true;
  const json* values = nullptr;
  json one;
  if (auto c = a.find("const"); c != a.end()) {
    one = json::array({*c});
    values = &one;
  } else if (auto e = a.find("enum"); e != a.end() && e->is_array()) {
    values = &*e;
  }
  if (values) return std::none_of(values->begin(), values->end(), [&](const json& v) { return accepts(v, b); });
  if (types_of(a, true) != std::set<std::string>{"object"}) return false;
  const json empty = json::object();
  const json& pa = a.contains("properties") && a["properties"].is_object() ? a["properties"] : empty;
  const json& pb = b.contains("properties") && b["properties"].is_object() ? b["properties"] : empty;
  auto add = a.find("additionalProperties");
  const bool closed = (add != a.end() && *add == false) || (add == a.end() && !pa.empty());
  if (auto r = b.find("required"); r != b.end() && r->is_array() && closed)
    for (const json& k : *r)
      if (k.is_string() && (!pa.contains(k.get<std::string>()) || pa[k.get<std::string>()] == false)) return true;
  // A member a always writes whose values b's schema for it refuses (a discriminator).
  if (auto r = a.find("required"); r != a.end() && r->is_array())
    for (const json& k : *r) {
      if (!k.is_string() || !pa.contains(k.get<std::string>()) || !pb.contains(k.get<std::string>())) continue;
      const json& sa = deref(pa[k.get<std::string>()]);
      if (!sa.is_object()) continue;
      json vals;
      if (sa.contains("const")) vals = json::array({sa["const"]});
      else if (sa.contains("enum") && sa["enum"].is_array()) vals = sa["enum"];
      else continue;
      const json& sb = pb[k.get<std::string>()];
      if (std::none_of(vals.begin(), vals.end(), [&](const json& v) { return accepts(v, sb); })) return true;
    }
  return false;
}

}  // namespace qrig::text::grammar
