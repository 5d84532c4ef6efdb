// What the JSON-schema compiler (grammar_json.h) knows about keywords besides turning them into rules:
//   - check_keywords: every keyword of a schema object is honoured, an annotation, or refused by name -
//     none is silently ignored (unknown keywords included: a typo such as "maxLenght" is a 400, not an
//     unconstrained output);
//   - merge_schemas: allOf (and the siblings of anyOf / oneOf / $ref) as one schema whose values are exactly
//     those valid for both parts, or a GrammarError naming the keyword that cannot be combined;
//   - SchemaChecker: a validator for the honoured keywords, used to keep only the enum / const values that
//     also satisfy their sibling keywords, and to prove oneOf branches exclusive (oneOf is honoured only
//     when no output of one branch can satisfy another).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "text/grammar_dfa.h"

namespace qrig::text::grammar {

// Throws GrammarError for the first keyword of `s` (an object) that the grammar cannot honour.
void check_keywords(const nlohmann::ordered_json& s);

// Keywords that only annotate (title, description, $defs...): a schema of only these admits any value.
bool is_annotation(const std::string& key);

class SchemaChecker {
 public:
  explicit SchemaChecker(const nlohmann::ordered_json& root) : root_(root) {}
  // Whether `v` is valid for `schema` (JSON Schema semantics for the honoured keywords).
  bool accepts(const nlohmann::ordered_json& v, const nlohmann::ordered_json& schema, int depth = 0);
  // The schema behind a $ref chain (only pure references - a $ref with validating siblings is returned
  // as it is). Throws GrammarError for unresolvable references.
  const nlohmann::ordered_json& deref(const nlohmann::ordered_json& s) const;
  const nlohmann::ordered_json& resolve(const std::string& ref) const;
  // allOf of a and b as one schema (both objects, references resolved by the caller).
  nlohmann::ordered_json merge(nlohmann::ordered_json a, const nlohmann::ordered_json& b);
  // Whether no value the grammar writes for `a` is valid for `b` (and the other way round is asked
  // separately). Conservative: false when it cannot tell.
  bool excludes(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b);
  const ByteDfa& pattern(const std::string& p);
  const ByteDfa& format(const std::string& f);

 private:
  const nlohmann::ordered_json& root_;
  std::map<std::string, ByteDfa> patterns_, formats_;
};

}  // namespace qrig::text::grammar
