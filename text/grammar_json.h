// JSON Schema -> grammar rules (grammar_rules.h), for response_format json_schema and for the non-string
// parameters of tool calls.
//
// Supported: type (object, array, string, number, integer, boolean, null, or an array of them), properties,
// required, additionalProperties (false / true / a schema), items, prefixItems (and the old array form of
// items, with additionalItems), minItems / maxItems, minLength / maxLength (code points; an escape sequence
// is one), enum, const, anyOf, oneOf (as anyOf: exclusivity is not enforced), allOf (merged: properties and
// required united, other keywords of later branches win), $ref to any local JSON pointer ("#", "#/$defs/X",
// "#/definitions/X", ...; ~0/~1 escapes, no percent-decoding; recursion allowed; keywords beside a $ref are
// ignored), boolean schemas, OpenAPI's nullable: true.
// Decisions:
//   - additionalProperties absent: no undeclared members when `properties` declares any (every output is
//     still valid for the schema; models stay on the declared fields), any members otherwise. Undeclared
//     member names are written without escape sequences and never equal a declared name; two undeclared
//     members may still repeat a name (not tracked).
//   - anyOf/oneOf siblings (e.g. "type") are merged into each branch.
//   - without "type": properties/required/additionalProperties -> object, items/prefixItems/minItems/maxItems
//     -> array, minLength/maxLength/pattern/format -> string, else any JSON value.
// Ignored (not enforced - the output has the right shape but may break them): pattern, format, minimum,
// maximum, exclusiveMinimum, exclusiveMaximum, multipleOf, uniqueItems, contains, minProperties,
// maxProperties, patternProperties, propertyNames, dependentRequired, and annotations (title, description,
// default, examples...). Rejected with GrammarError (ignoring them would change which shapes are valid):
// not, if / then / else, dependentSchemas; $ref outside the document; unknown type names; minItems /
// maxItems / prefixItems beyond 4096 elements; schemas nested deeper than 64 levels.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/grammar_rules.h"

namespace qrig::text::grammar {

// Substrings that would break the XML tool-call format if they appeared inside a parameter value
// (OutputStreamParser cuts the block there).
const std::vector<std::string>& tool_call_tags();

// A non-negative integer keyword of a schema (minLength...), dflt when absent; values beyond 2^32-2 are
// clamped. Throws GrammarError for anything else.
uint32_t schema_count(const nlohmann::ordered_json& s, const char* key, uint32_t dflt);

class JsonSchemaCompiler {
 public:
  // root: the document $refs resolve in. tool_safe: strings (and enum literals) never contain
  // tool_call_tags().
  JsonSchemaCompiler(GrammarBuilder& b, const nlohmann::ordered_json& root, bool tool_safe);

  // A rule matching exactly the values of `schema` (compact JSON). Throws GrammarError.
  uint32_t compile(const nlohmann::ordered_json& schema);
  uint32_t any_value();
  uint32_t any_object();
  // Whether a literal may be emitted (in tool-safe mode: contains no tool-call tag).
  bool literal_ok(const std::string& text) const;

 private:
  using json = nlohmann::ordered_json;
  uint32_t compile_inner(const json& s);
  uint32_t ref_rule(const std::string& ref);
  const json& resolve(const std::string& ref) const;
  const json& deref(const json& s) const;
  json merged_all_of(const json& s);
  uint32_t literal_rule(const std::vector<json>& values);
  uint32_t type_rule(const std::string& type, const json& s);
  uint32_t object_rule(const json& s);
  uint32_t array_rule(const json& s);
  uint32_t string_rule(uint32_t min_chars, uint32_t max_chars);
  uint32_t undeclared_key_rule(const std::vector<std::string>& declared);
  uint32_t number_rule(bool integer);
  uint32_t optional_digits(uint32_t n);
  uint32_t ws();
  void W(std::vector<Item>& seq) { seq.push_back(GrammarBuilder::call(ws())); }

  GrammarBuilder& b_;
  const json& root_;
  bool tool_safe_;
  LexerDef string_def_;
  LexerDef key_def_;
  std::map<std::string, uint32_t> refs_;
  std::map<uint32_t, uint32_t> opt_digits_;
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> strings_;
  static constexpr uint32_t kNone = UINT32_MAX;
  uint32_t ws_ = kNone, value_ = kNone, object_ = kNone, number_ = kNone, integer_ = kNone;
  int depth_ = 0;
};

}  // namespace qrig::text::grammar
