// The structured half of JsonSchemaCompiler (grammar_json.h): objects (members in schema order, optional ones
// skippable, undeclared names kept apart from declared ones) and arrays (prefixItems, items, minItems /
// maxItems unrolled), plus the TokenGrammar::json_schema factories.
#include <algorithm>
#include <map>
#include <set>

#include "text/grammar.h"
#include "text/grammar_json.h"
#include "text/tokenizer.h"

namespace qrig::text {

namespace grammar {

using json = nlohmann::ordered_json;

namespace {
constexpr uint32_t kMaxUnrolled = 4096;
}  // namespace

uint32_t JsonSchemaCompiler::object_rule(const json& s) {
  using G = GrammarBuilder;
  const json* props = nullptr;
  if (auto p = s.find("properties"); p != s.end()) {
    if (!p->is_object()) throw GrammarError("properties must be an object");
    props = &*p;
  }
  std::vector<std::string> required;
  if (auto r = s.find("required"); r != s.end()) {
    if (!r->is_array()) throw GrammarError("required must be an array of names");
    for (const json& n : *r) {
      if (!n.is_string()) throw GrammarError("required must be an array of names");
      if (std::find(required.begin(), required.end(), n.get<std::string>()) == required.end())
        required.push_back(n.get<std::string>());
    }
  }
  enum class Extra { None, Any, Schema } extra;
  const auto add = s.find("additionalProperties");
  if (add == s.end()) extra = props && !props->empty() ? Extra::None : Extra::Any;
  else if (add->is_boolean()) extra = add->get<bool>() ? Extra::Any : Extra::None;
  else if (add->is_object()) extra = Extra::Schema;
  else throw GrammarError("additionalProperties must be a boolean or a schema");
  const bool extra_forbidden = add != s.end() && add->is_boolean() && !add->get<bool>();

  struct Prop {
    std::string key;  // as written: a JSON string
    uint32_t value;
    bool required;
  };
  std::vector<Prop> list;
  std::vector<std::string> declared;
  auto is_required = [&](const std::string& k) { return std::find(required.begin(), required.end(), k) != required.end(); };
  auto add_prop = [&](const std::string& k, const json* sub) {
    const bool req = is_required(k);
    declared.push_back(k);
    if (sub && sub->is_boolean() && !sub->get<bool>()) {
      if (req) throw GrammarError("required property \"" + k + "\" has the schema false");
      return;
    }
    const std::string key = json(k).dump(-1, ' ', false, json::error_handler_t::replace);
    if (!literal_ok(key)) {
      if (req) throw GrammarError("required property name \"" + k + "\" cannot appear inside a tool call");
      return;
    }
    uint32_t value;
    if (sub) value = compile(*sub, "properties/" + k);
    else if (extra == Extra::Schema) value = compile(*add, "additionalProperties");
    else value = any_value();
    list.push_back(Prop{key, value, req});
  };
  if (props)
    for (const auto& [k, sub] : props->items()) add_prop(k, &sub);
  for (const std::string& k : required) {
    if (std::find(declared.begin(), declared.end(), k) != declared.end()) continue;
    if (extra_forbidden)
      throw GrammarError("required property \"" + k + "\" is not declared and additionalProperties is false");
    add_prop(k, nullptr);
  }

  std::vector<Item> extra_kv;  // an undeclared member, when allowed
  if (extra != Extra::None) {
    const uint32_t value = extra == Extra::Schema ? compile(*add, "additionalProperties") : any_value();
    extra_kv.push_back(G::call(declared.empty() ? string_rule(0, UINT32_MAX) : undeclared_key_rule(declared)));
    W(extra_kv);
    b_.lit(extra_kv, ":");
    W(extra_kv);
    extra_kv.push_back(G::call(value));
  }

  // rest[i]: after at least one member, the members from i on; first[i]: the first member is i or later.
  const size_t n = list.size();
  std::vector<uint32_t> rest(n + 1), first(n + 1);
  for (size_t i = 0; i <= n; ++i) {
    rest[i] = b_.new_rule();
    first[i] = b_.new_rule();
  }
  auto member = [&](std::vector<Item>& seq, size_t i) {
    b_.lit(seq, list[i].key);
    W(seq);
    b_.lit(seq, ":");
    W(seq);
    seq.push_back(G::call(list[i].value));
  };
  if (!extra_kv.empty()) {
    std::vector<Item> more;
    W(more);
    b_.lit(more, ",");
    W(more);
    more.insert(more.end(), extra_kv.begin(), extra_kv.end());
    more.push_back(G::call(rest[n]));
    b_.add_alt(rest[n], std::move(more));
    std::vector<Item> one = extra_kv;
    one.push_back(G::call(rest[n]));
    b_.add_alt(first[n], std::move(one));
  }
  b_.add_alt(rest[n], {});
  for (size_t i = n; i-- > 0;) {
    std::vector<Item> more;
    W(more);
    b_.lit(more, ",");
    W(more);
    member(more, i);
    more.push_back(G::call(rest[i + 1]));
    b_.add_alt(rest[i], std::move(more));
    std::vector<Item> one;
    member(one, i);
    one.push_back(G::call(rest[i + 1]));
    b_.add_alt(first[i], std::move(one));
    if (!list[i].required) {
      b_.add_alt(rest[i], {G::call(rest[i + 1])});
      b_.add_alt(first[i], {G::call(first[i + 1])});
    }
  }
  const uint32_t obj = b_.new_rule();
  std::vector<Item> full;
  b_.lit(full, "{");
  W(full);
  full.push_back(G::call(first[0]));
  W(full);
  b_.lit(full, "}");
  b_.add_alt(obj, std::move(full));  // pruned when no member is possible
  if (std::none_of(list.begin(), list.end(), [](const Prop& p) { return p.required; })) {
    std::vector<Item> empty;
    b_.lit(empty, "{");
    W(empty);
    b_.lit(empty, "}");
    b_.add_alt(obj, std::move(empty));
  }
  return obj;
}

// A JSON string (after nothing: the rule starts with the quote) that is not one of `declared`: the names
// form a trie; at each trie node the key may continue along the trie, leave it with any other byte (then any
// escape-free string follows), or end unless the node spells a declared name.
uint32_t JsonSchemaCompiler::undeclared_key_rule(const std::vector<std::string>& declared) {
  using G = GrammarBuilder;
  const Lexer& lx = b_.lexer(key_def_);
  struct Node {
    std::map<uint8_t, size_t> kids;
    bool end = false;
  };
  std::vector<Node> trie(1);
  for (const std::string& k : declared) {
    // Names that need escapes cannot be produced without escapes anyway.
    if (std::any_of(k.begin(), k.end(), [](char c) { return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20; }))
      continue;
    size_t n = 0;
    for (unsigned char c : k) {
      auto it = trie[n].kids.find(c);
      if (it == trie[n].kids.end()) {
        trie.emplace_back();
        it = trie[n].kids.emplace(c, trie.size() - 1).first;
      }
      n = it->second;
    }
    trie[n].end = true;
  }
  // Rules from the deepest nodes up (children have larger indices than parents).
  std::vector<uint32_t> rule(trie.size());
  std::vector<uint16_t> state(trie.size(), Lexer::kDead);
  state[0] = 0;
  for (size_t n = 0; n < trie.size(); ++n)
    for (const auto& [c, kid] : trie[n].kids) {
      const uint16_t e = state[n] == Lexer::kDead ? Lexer::kDead : lx.next(state[n], c);
      state[kid] = e == Lexer::kDead ? Lexer::kDead : static_cast<uint16_t>(e & ~Lexer::kCharStart);
      if (state[kid] != Lexer::kDead && lx.is_final(state[kid])) state[kid] = Lexer::kDead;
    }
  for (size_t n = trie.size(); n-- > 0;) {
    rule[n] = b_.new_rule();
    if (state[n] == Lexer::kDead) continue;  // unreachable as a string (no alternatives: pruned)
    std::map<uint16_t, ByteSet> leave;       // lexer state after the byte -> bytes leading there
    for (int c = 0; c < 256; ++c) {
      const auto byte = static_cast<uint8_t>(c);
      if (auto it = trie[n].kids.find(byte); it != trie[n].kids.end()) {
        if (state[it->second] != Lexer::kDead) b_.add_alt(rule[n], {b_.set(byte_set(std::string(1, static_cast<char>(c)))), G::call(rule[it->second])});
        continue;
      }
      const uint16_t e = lx.next(state[n], byte);
      if (e == Lexer::kDead) continue;
      const auto s = static_cast<uint16_t>(e & ~Lexer::kCharStart);
      if (lx.is_final(s)) {
        if (!trie[n].end) b_.add_alt(rule[n], {b_.set(byte_set(std::string(1, static_cast<char>(c))))});
        continue;
      }
      add(leave[s], byte);
    }
    for (const auto& [s, set] : leave) b_.add_alt(rule[n], {b_.set(set), b_.lex(key_def_, 0, UINT32_MAX, s)});
  }
  std::vector<Item> seq;
  b_.lit(seq, "\"");
  seq.push_back(G::call(rule[0]));
  return b_.rule_of({std::move(seq)});
}

uint32_t JsonSchemaCompiler::array_rule(const json& s) {
  using G = GrammarBuilder;
  const json* prefix = nullptr;
  const json* rest = nullptr;  // schema of the elements after the prefix (nullptr: any value)
  if (auto p = s.find("prefixItems"); p != s.end()) {
    if (!p->is_array()) throw GrammarError("prefixItems must be an array of schemas");
    prefix = &*p;
  }
  if (auto it = s.find("items"); it != s.end()) {
    if (it->is_array() && !prefix) {  // draft 4-2019 tuple form
      prefix = &*it;
      if (auto a = s.find("additionalItems"); a != s.end()) rest = &*a;
    } else if (!it->is_array()) {
      rest = &*it;
    } else {
      throw GrammarError("items must be a schema when prefixItems is given");
    }
  }
  std::vector<uint32_t> prefix_rules;
  if (prefix) {
    if (prefix->size() > kMaxUnrolled) throw GrammarError("prefixItems longer than 4096");
    for (size_t i = 0; i < prefix->size(); ++i) prefix_rules.push_back(compile((*prefix)[i], "prefixItems/" + std::to_string(i)));
  }
  const auto k = static_cast<uint32_t>(prefix_rules.size());
  const uint32_t min_items = schema_count(s, "minItems", 0);
  uint32_t max_items = schema_count(s, "maxItems", UINT32_MAX);
  const bool rest_false = rest && rest->is_boolean() && !rest->get<bool>();
  if (rest_false) max_items = std::min(max_items, k);
  if (min_items > max_items)
    throw GrammarError("array length range is empty: minItems " + std::to_string(min_items) + " > maxItems " +
                       std::to_string(max_items));
  const bool bounded = max_items != UINT32_MAX;
  if (std::max({k, min_items, bounded ? max_items : 0u}) > kMaxUnrolled)
    throw GrammarError("minItems/maxItems/prefixItems beyond 4096 elements are not supported");
  uint32_t item = UINT32_MAX;
  auto elem = [&](uint32_t j) {
    if (j < k) return prefix_rules[j];
    if (item == UINT32_MAX) item = rest ? compile(*rest, "items") : any_value();
    return item;
  };

  const uint32_t arr = b_.new_rule();
  if (min_items == 0) {
    std::vector<Item> empty;
    b_.lit(empty, "[");
    W(empty);
    b_.lit(empty, "]");
    b_.add_alt(arr, std::move(empty));
  }
  if (max_items == 0) return arr;
  // cont[j]: what may follow the first j elements (j = 1 .. last); the last one is empty (maxItems reached)
  // or loops over further elements.
  const uint32_t last = bounded ? max_items : std::max({k, min_items, 1u});
  std::vector<uint32_t> cont(last + 1);
  for (uint32_t j = 1; j <= last; ++j) cont[j] = b_.new_rule();
  auto next_elem = [&](uint32_t j, uint32_t then) {
    std::vector<Item> seq;
    W(seq);
    b_.lit(seq, ",");
    W(seq);
    seq.push_back(G::call(elem(j)));
    seq.push_back(G::call(then));
    return seq;
  };
  if (!bounded) b_.add_alt(cont[last], next_elem(last, cont[last]));
  b_.add_alt(cont[last], {});
  for (uint32_t j = last - 1; j >= 1; --j) {
    b_.add_alt(cont[j], next_elem(j, cont[j + 1]));
    if (j >= min_items) b_.add_alt(cont[j], {});
  }
  std::vector<Item> full;
  b_.lit(full, "[");
  W(full);
  full.push_back(G::call(elem(0)));
  full.push_back(G::call(cont[1]));
  W(full);
  b_.lit(full, "]");
  b_.add_alt(arr, std::move(full));
  return arr;
}

}  // namespace grammar

std::unique_ptr<TokenGrammar> TokenGrammar::json_schema(const nlohmann::ordered_json& schema,
                                                        std::shared_ptr<const TokenVocab> vocab, bool thinking) {
  grammar::GrammarBuilder b;
  grammar::JsonSchemaCompiler jc(b, schema, /*tool_safe=*/false);
  const bool any_object = schema.is_null() || (schema.is_object() && schema.empty());
  const uint32_t value = any_object ? jc.any_object() : jc.compile(schema);
  std::vector<grammar::Item> top;
  if (thinking) grammar::append_reasoning(b, top);
  top.push_back(grammar::GrammarBuilder::call(value));
  return std::make_unique<TokenGrammar>(b.finish(b.rule_of({std::move(top)})), std::move(vocab));
}

std::unique_ptr<TokenGrammar> TokenGrammar::json_schema(const nlohmann::ordered_json& schema, const Tokenizer& tok,
                                                        bool thinking) {
  return json_schema(schema, TokenVocab::of(tok), thinking);
}

std::unique_ptr<TokenGrammar> TokenGrammar::json_schema(const nlohmann::json& schema, const Tokenizer& tok,
                                                        bool thinking) {
  return json_schema(nlohmann::ordered_json(schema), TokenVocab::of(tok), thinking);
}

std::unique_ptr<TokenGrammar> TokenGrammar::json_schema(const nlohmann::json& schema,
                                                        std::shared_ptr<const TokenVocab> vocab, bool thinking) {
  return json_schema(nlohmann::ordered_json(schema), std::move(vocab), thinking);
}

}  // namespace qrig::text
