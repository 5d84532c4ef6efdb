// The request fields other servers define that this one does not implement: one table (request_fields.cpp)
// of the fields of OpenAI's chat and completions APIs, llama.cpp's /completion and OpenAI-compatible
// endpoints, and vLLM's extra parameters, each either
//   - harmless: accepted and without effect on the output (metadata, store, cache_prompt, priority...), or
//   - refused unless it holds its inert default (use_beam_search: false, mirostat: 0, dry_multiplier: 0...):
//     otherwise a 400 (unsupported_value) naming the field, since it would change the output.
// The fields the server honours are read by the endpoints themselves (request_parse.cpp, chat_request.cpp,
// completions.cpp). `qrig serve --ignore-unsupported-fields` turns the refusals into reports: the field is
// then ignored and named in the X-Qrig-Ignored-Fields header, like an unknown field.
#pragma once

#include <set>
#include <string>

#include "server/request_parse.h"

namespace qrig::server {

enum class Endpoint { chat, completions };

struct FieldPolicy {
  bool ignore_unsupported = false;  // refused fields are reported instead (qrig serve --ignore-unsupported-fields)
};

// Checks `body` against the table for `ep`: throws ApiError(unsupported, param = the field) for the first
// refused field that is set (or, with policy.ignore_unsupported, appends it to `ignored`, comma-separated);
// adds every field of the table to `known`.
void check_table_fields(const Json& body, Endpoint ep, const FieldPolicy& policy, std::set<std::string>& known,
                        std::string& ignored);

// Every field name the table judges for `ep` (the tests walk it).
std::set<std::string> table_field_names(Endpoint ep, bool refused_only);

// Adds `name` to a comma-separated list.
void append_name(std::string& list, const std::string& name);

}  // namespace qrig::server
