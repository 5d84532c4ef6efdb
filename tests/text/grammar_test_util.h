// Shared helpers of the constrained-decoding tests (test_grammar*.cpp): a validator for the JSON Schema subset
// the grammar supports (independent of the grammar code), a seeded random walk over allowed tokens that checks
// the mask invariants at every step, and feeding a text token by token.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "text/grammar.h"
#include "text/tokenizer.h"

namespace qrig::text::testutil {

using ojson = nlohmann::ordered_json;

inline size_t utf8_chars(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Empty string = valid; otherwise what is wrong and where. `strict_extra`: when additionalProperties is absent
// and properties are declared, undeclared members are an error (the grammar's documented choice).
inline std::string validate(const ojson& v, const ojson& s, const ojson& root, const std::string& at = "$",
                            bool strict_extra = true) {
  auto rec = [&](const ojson& value, const ojson& schema, const std::string& where) {
    return validate(value, schema, root, where, strict_extra);
  };
  if (s.is_boolean()) return s.get<bool>() ? "" : at + ": schema false";
  if (!s.is_object()) return at + ": bad schema";
  if (auto r = s.find("$ref"); r != s.end()) {
    const std::string ref = *r;
    const ojson& target = ref == "#" ? root : root.at(ojson::json_pointer(ref.substr(1)));
    return rec(v, target, at);
  }
  if (auto n = s.find("nullable"); n != s.end() && *n == true && v.is_null()) return "";
  if (auto a = s.find("allOf"); a != s.end())
    for (const ojson& b : *a)  // each branch sees only part of the members: no strictness about extras
      if (auto e = validate(v, b, root, at, false); !e.empty()) return e;
  for (const char* key : {"anyOf", "oneOf"})
    if (auto a = s.find(key); a != s.end()) {
      ojson base = s;
      base.erase(key);
      bool any = false;
      for (const ojson& b : *a) any = any || (rec(v, b, at).empty() && rec(v, base, at).empty());
      if (!any) return at + ": matches no " + key + " branch: " + v.dump();
      return "";
    }
  if (auto c = s.find("const"); c != s.end() && v != *c) return at + ": not the const";
  if (auto e = s.find("enum"); e != s.end() && std::find(e->begin(), e->end(), v) == e->end())
    return at + ": not in enum: " + v.dump();
  if (auto t = s.find("type"); t != s.end()) {
    std::vector<std::string> types;
    if (t->is_string()) types.push_back(*t);
    else
      for (const ojson& x : *t) types.push_back(x);
    auto is = [&](const std::string& ty) {
      if (ty == "null") return v.is_null();
      if (ty == "boolean") return v.is_boolean();
      if (ty == "string") return v.is_string();
      if (ty == "array") return v.is_array();
      if (ty == "object") return v.is_object();
      if (ty == "number") return v.is_number();
      if (ty == "integer") return v.is_number_integer();
      return false;
    };
    if (std::none_of(types.begin(), types.end(), is)) return at + ": wrong type: " + v.dump();
  }
  if (v.is_string()) {
    const size_t n = utf8_chars(v.get<std::string>());
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return at + ": shorter than minLength";
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return at + ": longer than maxLength";
  }
  if (v.is_object()) {
    const ojson props = s.value("properties", ojson::object());
    for (const auto& [k, pv] : v.items()) {
      if (props.contains(k)) {
        if (auto e = rec(pv, props[k], at + "." + k); !e.empty()) return e;
        continue;
      }
      auto add = s.find("additionalProperties");
      if (add == s.end()) {
        if (strict_extra && !props.empty()) return at + ": undeclared member " + k;
      } else if (auto e = rec(pv, *add, at + "." + k); !e.empty()) {
        return e;
      }
    }
    for (const ojson& r : s.value("required", ojson::array()))
      if (!v.contains(r.get<std::string>())) return at + ": missing required " + r.get<std::string>();
  }
  if (v.is_array()) {
    const ojson prefix = s.value("prefixItems", ojson::array());
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string where = at + "[" + std::to_string(i) + "]";
      if (i < prefix.size()) {
        if (auto e = rec(v[i], prefix[i], where); !e.empty()) return e;
      } else if (auto it = s.find("items"); it != s.end()) {
        if (auto e = rec(v[i], *it, where); !e.empty()) return e;
      }
    }
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return at + ": fewer than minItems";
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return at + ": more than maxItems";
  }
  return "";
}

// The grammar's whitespace promise: none at the ends, never two whitespace bytes in a row outside strings.
inline bool compact_json(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text.front())) ||
      std::isspace(static_cast<unsigned char>(text.back())))
    return false;
  bool in_str = false, esc = false, prev_ws = false;
  for (char c : text) {
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
      continue;
    }
    const bool ws = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    if (ws && prev_ws) return false;
    prev_ws = ws;
    if (c == '"') in_str = true;
  }
  return true;
}

inline std::vector<int32_t> allowed_ids(const TokenGrammar& g) {
  std::vector<bool> mask;
  g.allowed(mask);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < mask.size(); ++i)
    if (mask[i]) ids.push_back(static_cast<int32_t>(i));
  return ids;
}

struct WalkResult {
  std::string text;
  std::vector<int32_t> ids;
  bool completed = false;
  int steps = 0;
};

// Random walk: at each step take a random allowed token; with a probability that grows with the step count,
// follow a "plan" instead - the tokens of one of `closers` (e.g. "\"", "}", "\n</parameter>\n"), as long as
// each is allowed - so walks end in reasonable time. Every accepted token comes from the mask. Checks at
// every step: the mask is never empty, holds no control token, holds end-of-generation ids exactly when
// complete(); with `prefix_free`, a complete grammar allows nothing but end-of-generation.
inline WalkResult random_walk(TokenGrammar& g, const std::function<std::vector<int32_t>(const std::string&)>& encode,
                              const std::vector<std::string>& closers, uint64_t seed, int max_steps,
                              bool prefix_free) {
  const TokenVocab& v = g.vocab();
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> closer_ids;
  for (const std::string& c : closers) closer_ids.push_back(encode(c));
  std::vector<int32_t> plan;
  WalkResult r;
  std::vector<bool> mask;
  for (; r.steps < max_steps; ++r.steps) {
    g.allowed(mask);
    REQUIRE(mask.size() == static_cast<size_t>(v.size()));
    std::vector<int32_t> text_ids;
    bool eog = false;
    int32_t not_text = -1;  // (one REQUIRE per step, not per id: Catch assertions are slow)
    for (size_t i = 0; i < mask.size(); ++i) {
      if (!mask[i]) continue;
      const auto id = static_cast<int32_t>(i);
      if (v.is_eog(id)) eog = true;
      else if (!v.is_text(id)) not_text = id;
      else text_ids.push_back(id);
    }
    INFO("allowed id " << not_text << " must be a text token");
    REQUIRE(not_text == -1);
    INFO("text so far: " << r.text);
    REQUIRE(eog == g.complete());
    REQUIRE((eog || !text_ids.empty()));
    if (eog) {
      for (int32_t id : v.eog_ids()) REQUIRE(mask[static_cast<size_t>(id)]);
      if (prefix_free) REQUIRE(text_ids.empty());
      if (text_ids.empty() || rng() % 3 == 0) {
        g.accept(v.eog_ids().front());
        REQUIRE(g.finished());
        r.completed = true;
        return r;
      }
    }
    int32_t pick = -1;
    if (!plan.empty() && mask[static_cast<size_t>(plan.front())]) {
      pick = plan.front();
      plan.erase(plan.begin());
    } else {
      plan.clear();
      const double p_plan = std::min(0.9, 0.15 + r.steps / 150.0);
      if (std::uniform_real_distribution<double>(0, 1)(rng) < p_plan && !closer_ids.empty()) {
        std::vector<size_t> order(closer_ids.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), rng);
        for (size_t i : order)
          if (!closer_ids[i].empty() && mask[static_cast<size_t>(closer_ids[i][0])]) {
            pick = closer_ids[i][0];
            plan.assign(closer_ids[i].begin() + 1, closer_ids[i].end());
            break;
          }
      }
      if (pick < 0) pick = text_ids[rng() % text_ids.size()];
    }
    g.accept(pick);
    r.ids.push_back(pick);
    r.text += v.bytes(pick);
  }
  return r;
}

// Feeds `ids`; returns the index of the first id accept() refused (ids.size() if none).
inline size_t feed(TokenGrammar& g, const std::vector<int32_t>& ids) {
  for (size_t i = 0; i < ids.size(); ++i) {
    try {
      g.accept(ids[i]);
    } catch (const GrammarError&) {
      return i;
    }
  }
  return ids.size();
}

// The index of the token of `ids` that holds byte `offset` of their concatenation.
inline size_t token_at_byte(const TokenVocab& v, const std::vector<int32_t>& ids, size_t offset) {
  size_t pos = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    pos += v.bytes(ids[i]).size();
    if (offset < pos) return i;
  }
  return ids.size();
}

}  // namespace qrig::text::testutil
