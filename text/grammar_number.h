// Numeric JSON-schema keywords (minimum, maximum, exclusiveMinimum, exclusiveMaximum - the number forms and
// draft 4's boolean forms - and multipleOf) as a byte automaton of the JSON numbers that satisfy them
// (grammar_dfa.h), so that constrained decoding writes only numbers in range.
//
// Soundness: validators (ajv, Python's jsonschema) read the schema's bounds and the output as doubles and
// compare those. An exclusive bound d becomes the inclusive bound next to it (nextafter(d)), so the rounded
// output can never equal d. Integers are compared exactly with the bound (an integer at least the bound
// rounds to a double at least the bound). A fixed-point decimal is accepted when it lies strictly between
// the midpoints from the bounds to their neighbouring doubles: it then rounds to a double in range, and a
// bound such as minimum 0.1 admits "0.1" itself. Bounds written as integers beyond 2^53 that no double
// represents are refused (validators disagree on them).
// Form of the numbers written:
//   - integers (type integer, or any type with an integer multipleOf): -?(0|[1-9][0-9]*), at most 16 digits,
//     never "-0"; multipleOf must be an integer 1..1000 (a remainder automaton);
//   - numbers with a range and no multipleOf: fixed point, -?(0|[1-9][0-9]*)(\.[0-9]{1,16})?, no exponent,
//     at most 16 integer digits; bounds are rounded inward to 16 fraction digits. A non-integer multipleOf
//     (0.01...) is refused: validators test it by floating-point division (0.07 / 0.01 is not an integer
//     there), so no decimal output is reliably valid.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

#include "text/grammar_dfa.h"

namespace qrig::text::grammar {

// The numbers of the schema's numeric keywords for `integer` (type integer) or number; nullopt when the
// schema has none of them. An empty language (no value in range) is an automaton without accepting state.
// Throws GrammarError for malformed or unsupported values, naming the keyword.
std::optional<ByteDfa> number_dfa(const nlohmann::ordered_json& s, bool integer);

}  // namespace qrig::text::grammar
