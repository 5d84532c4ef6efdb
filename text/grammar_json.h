// JSON Schema -> grammar rules (grammar_rules.h), for response_format json_schema and for the non-string
// parameters of tool calls.
//
// Every keyword is honoured, an annotation, or refused with GrammarError naming it and where it sits
// ("at #/properties/x: ..."); none is silently ignored (grammar_schema.h: check_keywords).
// Honoured: type (object, array, string, number, integer, boolean, null, or an array of them), properties,
// required, additionalProperties (false / true / a schema), items, prefixItems (and the old array form of
// items, with additionalItems), minItems / maxItems, minLength / maxLength (code points; an escape sequence
// is one), pattern and format (date, time, date-time, uuid, email, ipv4; grammar_regex.h), minimum /
// maximum / exclusiveMinimum / exclusiveMaximum (both drafts' forms) and integer multipleOf
// (grammar_number.h), enum and const (any JSON value, anywhere; values that break a sibling keyword are
// dropped), anyOf, oneOf (only when its branches provably exclude each other), allOf (merged so that every
// branch holds: bounds take the stricter value, patterns all apply, members meet the other branch's
// additionalProperties; what cannot be combined is refused), $ref to any local JSON pointer ("#",
// "#/$defs/X", "#/definitions/X", ...; ~0/~1 escapes, no percent-decoding; recursion allowed; validating
// keywords beside a $ref apply too), boolean schemas, OpenAPI's nullable.
// Annotations (no effect on validity): title, description, default, examples, example, $comment,
// deprecated, readOnly, writeOnly, $schema, $id, $anchor, $vocabulary, $defs, definitions,
// contentEncoding, contentMediaType, contentSchema, discriminator, xml, externalDocs, x-*.
// Refused: not, if / then / else, dependentSchemas, dependentRequired, dependencies, patternProperties,
// propertyNames, minProperties / maxProperties (except minProperties 0), uniqueItems (except false),
// contains / minContains / maxContains, unevaluatedProperties / unevaluatedItems, $dynamicRef and kin,
// unknown keywords, formats other than the ones above, non-integer multipleOf, pattern features
// grammar_regex.h lists; $ref outside the document; unknown type names; minItems / maxItems / prefixItems
// beyond 4096 elements; schemas nested deeper than 64 levels.
// Decisions:
//   - additionalProperties absent: no undeclared members when `properties` declares any (every output is
//     still valid for the schema; models stay on the declared fields), any members otherwise. Undeclared
//     member names are written without escape sequences and never equal a declared name; two undeclared
//     members may still repeat a name (not tracked).
//   - anyOf/oneOf siblings (e.g. "type") are merged into each branch.
//   - without "type": properties/required/additionalProperties -> object, items/prefixItems/minItems/maxItems
//     -> array, minLength/maxLength/pattern/format -> string, numeric keywords -> number, else any JSON
//     value; keywords of several types without "type" are refused (say which type).
//   - strings under pattern/format: characters are written raw or as the short escapes (\" \\ \/ \b
//     \f \n \r \t), control characters also as \u00XX; no other \u escapes.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <optional>

#include "text/grammar_dfa.h"
#include "text/grammar_lexer.h"
#include "text/grammar_rules.h"
#include "text/grammar_schema.h"

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
  // segment: where the schema sits in its parent ("properties/name", "items"...), for error messages.
  uint32_t compile(const nlohmann::ordered_json& schema, const std::string& segment = {});
  uint32_t any_value();
  uint32_t any_object();
  // Whether a literal may be emitted (in tool-safe mode: contains no tool-call tag).
  bool literal_ok(const std::string& text) const;
  // Whether v is valid for s (grammar_schema.h's validator, for the honoured keywords).
  bool accepts(const nlohmann::ordered_json& v, const nlohmann::ordered_json& s) { return checker_.accepts(v, s); }
  // pattern / format of a string schema; nullopt when it has neither. Its length limits are folded into
  // the automaton, except where counting them is safe (counts_safely): then they are left in min_chars /
  // max_chars for the lexeme (else those are 0 / UINT32_MAX).
  struct StringAutomaton {
    ByteDfa dfa;
    uint32_t min_chars = 0, max_chars = UINT32_MAX;
  };
  std::optional<StringAutomaton> string_dfa(const nlohmann::ordered_json& s);
  // Identifies string_dfa's automaton (pattern, format, lengths).
  static std::string string_key(const nlohmann::ordered_json& s);

 private:
  using json = nlohmann::ordered_json;
  uint32_t compile_inner(const json& s);
  uint32_t ref_rule(const std::string& ref);
  // The schema with pure $ref chains followed and a $ref with validating siblings merged with its target.
  json expanded(const json& s);
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
  std::map<std::string, uint32_t> numbers_;
  std::map<std::string, StringAutomaton> string_dfas_;
  SchemaChecker checker_;
  std::vector<std::string> path_;
  static constexpr uint32_t kNone = UINT32_MAX;
  uint32_t ws_ = kNone, value_ = kNone, object_ = kNone, number_ = kNone, integer_ = kNone;
  int depth_ = 0;
};

}  // namespace qrig::text::grammar
