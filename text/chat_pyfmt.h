// Python string semantics the Qwen chat template relies on when transformers renders it, so the
// native formatter (chat.cpp) prints the same bytes: json.dumps(ensure_ascii=False) for `tojson`,
// str() for `|string` and `{{ value }}`, repr(float), and str.strip()'s Unicode whitespace set.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace qrig::text::py {

// Python repr(float): shortest round-trip digits, "1.0", "1e+16", "1e-05", "-0.0", "inf", "nan".
std::string float_repr(double v);

// json.dumps(v, ensure_ascii=False): separators ", " and ": ", keys in their stored order,
// non-ASCII kept, control characters as \u00xx. Throws ChatError for binary values or nesting
// deeper than 512 levels.
std::string json_dumps(const nlohmann::ordered_json& v);

// Python str() of a JSON scalar as Python sees it after json.loads: strings raw, "None", "True",
// "False", integers, repr(float). Throws ChatError for arrays and objects.
std::string scalar_str(const nlohmann::ordered_json& v);

// str.isspace() for one code point.
bool is_space(char32_t c);

// str.strip() / lstrip() / rstrip() without arguments (Unicode whitespace) on UTF-8 text. Bytes that
// are not valid UTF-8 count as non-whitespace.
std::string_view strip(std::string_view s);
std::string_view lstrip(std::string_view s);
std::string_view rstrip(std::string_view s);

}  // namespace qrig::text::py
