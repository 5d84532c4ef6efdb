// JSON-Schema `pattern` and `format` as byte automata (grammar_dfa.h), for constrained decoding of strings.
//
// pattern_dfa: the ECMA-262 regular expressions JSON Schema specifies, with the semantics validators give
// them (ajv compiles patterns with the "u" flag; the match is a search, so "abc" means "contains abc" unless
// anchored): literals and escapes (\t \n \r \v \f \0 \xHH \uHHHH \u{H...} \cX, escaped syntax characters),
// classes ([a-z], [^...], \d \D \w \W \s \S with ECMA's sets - \s includes the Unicode spaces, \d and \w are
// ASCII), the dot (any code point but \n \r U+2028 U+2029), groups ((...), (?:...), (?<name>...)),
// alternation, quantifiers (* + ? {n} {n,} {n,m}, lazy or not: the same set of strings), anchors ^ and $
// (no "m" flag: start and end of the whole string). The automaton accepts exactly the UTF-8 texts the
// expression matches. Refused with GrammarError naming the feature: lookahead and lookbehind, backreferences
// (\1, \k<name>), word boundaries \b \B, Unicode property escapes \p{...} \P{...}, inline flags, quantifier
// bounds above 1000, and expressions whose automaton would exceed 20000 states.
//
// format_dfa: the formats constrained decoding honours, as automata of a subset of what ajv-formats ("full"
// mode) and RFC 3339 accept - every text the automaton accepts is valid, some valid texts are not produced:
//   date       YYYY-MM-DD, days per month, 29 February only in leap years
//   time       HH:MM:SS[.fraction of 1-9 digits] then Z or +HH:MM / -HH:MM (the offset is required, as in
//              RFC 3339 full-time); no leap second
//   date-time  date "T" time
//   uuid       8-4-4-4-12 hexadecimal digits (either case)
//   email      ajv-formats' address syntax: dot-separated atoms of letters, digits and !#$%&'*+/=?^_`{|}~-,
//              "@", dot-separated host labels of letters, digits and inner hyphens (at least two labels)
//   ipv4       four decimal octets 0-255 without leading zeros
// Any other format name is a GrammarError.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "text/grammar_dfa.h"

namespace qrig::text::grammar {

ByteDfa pattern_dfa(std::string_view pattern);
ByteDfa format_dfa(const std::string& format);
const std::vector<std::string>& supported_formats();

}  // namespace qrig::text::grammar
