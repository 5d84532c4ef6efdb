// Types, op attribute accessors and graph lookups of the IR (ir.h).
#include "ir/ir.h"

#include <algorithm>

#include <fmt/format.h>

namespace qrig::ir {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::q8: return "q8";
    case DType::t4: return "t4";
    case DType::t3: return "t3";
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

const AttrValue& get_attr(const Op& op, std::string_view key) {
  for (const auto& [k, v] : op.attrs)
    if (k == key) return v;
  throw Error(fmt::format("op '{}' has no attribute '{}'", op.describe(), key));
}

}  // namespace

std::string type_string(const Type& t) {
  std::string s = std::string(dtype_name(t.dtype)) + "[";
  for (size_t k = 0; k < t.shape.size(); ++k) s += (k ? "," : "") + dim_string(t.shape[k]);
  return s + "]";
}

const std::string& Op::result() const {
  if (results.size() != 1) throw Error(fmt::format("op '{}' has {} results, not one", describe(), results.size()));
  return results[0];
}

const Type& Op::type() const {
  if (types.size() != 1) throw Error(fmt::format("op '{}' has {} result types, not one", describe(), types.size()));
  return types[0];
}

bool Op::has(std::string_view key) const {
  for (const auto& [k, v] : attrs)
    if (k == key) return true;
  return false;
}

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
  // An empty list prints as [] and parses back as an integer list; an empty string list reads the same.
  throw Error(fmt::format("op '{}': attribute '{}' is not an integer list", describe(), key));
}
const std::vector<std::string>& Op::strs(std::string_view key) const {
  const AttrValue& v = get_attr(*this, key);
  if (auto p = std::get_if<std::vector<std::string>>(&v)) return *p;
  static const std::vector<std::string> none;
  if (auto p = std::get_if<std::vector<int64_t>>(&v); p && p->empty()) return none;
  throw Error(fmt::format("op '{}': attribute '{}' is not a string list", describe(), key));
}
int64_t Op::i_or(std::string_view key, int64_t dflt) const { return has(key) ? i(key) : dflt; }
void Op::set(const std::string& key, AttrValue v) {
  for (auto& [k, old] : attrs)
    if (k == key) { old = std::move(v); return; }
  attrs.emplace_back(key, std::move(v));
}
void Op::erase(std::string_view key) {
  attrs.erase(std::remove_if(attrs.begin(), attrs.end(), [&](const auto& kv) { return kv.first == key; }), attrs.end());
}
std::string Op::describe() const {
  std::string s;
  for (size_t k = 0; k < results.size(); ++k) s += (k ? ", %" : "%") + results[k];
  if (!results.empty()) s += " = ";
  s += std::string(op_name(kind)) + "(";
  for (size_t k = 0; k < args.size(); ++k) s += (k ? ", %" : "%") + args[k];
  return s + ")";
}

void Graph::set_attr(const std::string& key, AttrValue v) {
  for (auto& [k, old] : attrs)
    if (k == key) { old = std::move(v); return; }
  attrs.emplace_back(key, std::move(v));
}
const AttrValue* Graph::attr(std::string_view key) const {
  for (const auto& [k, v] : attrs)
    if (k == key) return &v;
  return nullptr;
}

const Op* Graph::producer(std::string_view value) const {
  for (const Op& op : ops)
    for (const auto& r : op.results)
      if (r == value) return &op;
  return nullptr;
}
const Type* Graph::type_of(std::string_view value) const {
  for (const Input& in : inputs)
    if (in.name == value) return &in.type;
  for (const Op& op : ops)
    for (size_t k = 0; k < op.results.size() && k < op.types.size(); ++k)
      if (op.results[k] == value) return &op.types[k];
  return nullptr;
}
const State* Graph::state(std::string_view name) const {
  for (const State& s : states)
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace qrig::ir
