// Parsing Qwen3.5 model output into OpenAI message fields: reasoning_content, content and tool_calls,
// both for a whole output and incrementally for streaming. The server and the CLI share it.
//
// Format (QWEN35.md, reference/qwen3.5-chat-template.jinja):
// - With thinking on, the generation prompt ends with "<think>\n", so the output starts inside the
//   reasoning: "reasoning\n</think>\n\ncontent". An output that itself starts with "<think>" (after
//   newlines) is accepted too. Leading and trailing newlines of the reasoning and leading newlines of the
//   content are the template's separators and are dropped. An output that ends before "</think>"
//   (max_tokens) is all reasoning, kept as written. Inside the reasoning nothing else is special: a tool
//   call there is reasoning text. With thinking off, the output starts in the content and no tag opens
//   reasoning (a stray "<think>" or "</think>" is content text).
// - In the content, tool calls are XML blocks, possibly several in a row:
//     <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n...</function>\n</tool_call>
//   Whitespace between the tags is free. Each VALUE loses one leading and one trailing newline and is
//   coerced with the JSON schema of the named tool's parameter (OpenAI `tools` array):
//     "string"                                  -> the raw text;
//     integer/number/boolean/null/object/array  -> JSON parse of the text (boolean also accepts
//                                                  True/False in any case), the raw string if that fails;
//     a union with "string" (["string","null"]) -> the parsed JSON when it has one of the other listed
//                                                  types, else the raw string;
//     no usable schema, unknown parameter       -> JSON if the text parses, else the raw string.
//   `type` may be a string or an array; without it the types of anyOf/oneOf/allOf branches, or of the
//   enum/const values, are used. Arguments keep the model's parameter order; key order inside object
//   values is kept too. Invalid UTF-8 in a value is replaced by U+FFFD in the arguments JSON.
// - A block that is not well-formed (no "</tool_call>" before the end, a function name not in `tools`,
//   text outside the tags, a missing "</parameter>", a parameter given twice) is content, verbatim,
//   together with the newlines before it. Newlines directly before a well-formed block, and after it,
//   are separators and are dropped. Without tools nothing is parsed as a tool call.
//
// Streaming: OutputStreamParser emits Deltas as soon as the text is unambiguous and holds back only what
// could still change meaning: a possible partial tag ("</thi", "<tool_c"), newlines that may turn out
// to be separators, an unfinished UTF-8 character, and a whole <tool_call> block until its
// "</tool_call>" arrives (the block may still turn out malformed, and then it is content; so a call is
// announced only once it is complete, its start delta followed at once by its argument fragments).
// parse_output() is the same machine run over the whole text, so the whole parse equals the
// concatenated deltas for every split of the text into pieces.
//
// Tool call ids are call_id_prefix + index (0, 1, ... per output). The default prefix is
// "call_" + 16 random [a-z0-9] + "_", drawn once per parser; pass a prefix (e.g. derived from the request
// id) to get stable ids.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace qrig::text {

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, as text (OpenAI `function.arguments`)
  bool operator==(const ToolCall&) const = default;
};

struct ParsedOutput {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCall> tool_calls;
  bool operator==(const ParsedOutput&) const = default;
};

struct Delta {
  enum class Kind { reasoning, content, tool_call_start, tool_call_arguments };
  Kind kind = Kind::content;
  std::string text;    // reasoning / content text, or a fragment of the call's arguments JSON
  int32_t index = -1;  // tool call index (tool_call_start, tool_call_arguments)
  std::string id;      // tool_call_start only
  std::string name;    // tool_call_start only
  bool operator==(const Delta&) const = default;
};

// Adds one delta to an accumulated output (text appended; a start delta opens tool_calls[index]).
// Throws std::invalid_argument for an arguments fragment or start whose index is out of sequence.
void apply_delta(ParsedOutput& out, const Delta& d);

class OutputStreamParser {
 public:
  // tools: the OpenAI `tools` array (or null / empty array: no tool calls are parsed). Throws
  // std::invalid_argument when it is not an array of {"type":"function","function":{"name":...,
  // "parameters":{...}}} entries ("type" may be omitted).
  OutputStreamParser(const nlohmann::json& tools, bool thinking, std::string call_id_prefix = {});

  // Pieces may split tags and UTF-8 characters anywhere. Throws std::logic_error after finish().
  std::vector<Delta> feed(std::string_view piece);
  // End of output: releases everything held back. Further calls to feed()/finish() throw.
  std::vector<Delta> finish();

 private:
  enum class State { think_open, reasoning, content, tool_call };
  struct Param {
    std::string name;
    nlohmann::ordered_json value;
  };
  void process(bool final, std::vector<Delta>& out);
  bool parse_block(std::string_view block, std::string& name, std::vector<Param>& params) const;
  void emit_text(Delta::Kind kind, std::string_view text, std::vector<Delta>& out);
  void emit_call(const std::string& name, const std::vector<Param>& params, std::vector<Delta>& out);

  std::map<std::string, nlohmann::json, std::less<>> tools_;  // name -> parameters schema (or null)
  std::string id_prefix_;
  State state_;
  std::string pending_;        // text received and not yet emitted or dropped
  std::string held_newlines_;  // newlines before the <tool_call> block in pending_ (state tool_call)
  size_t call_scan_ = 0;       // where the search for "</tool_call>" resumes in pending_
  bool at_start_ = true;       // at the start of a reasoning/content section: leading newlines drop
  int32_t next_index_ = 0;
  bool finished_ = false;
};

// The whole output at once (same rules, same machine). With an empty call_id_prefix the ids get a random
// prefix, so pass one to compare with a streamed parse.
ParsedOutput parse_output(std::string_view text, const nlohmann::json& tools, bool thinking,
                          std::string call_id_prefix = {});

// Coerces one raw parameter value with its JSON schema (nullptr: none known). Exposed for tests.
nlohmann::ordered_json coerce_parameter(std::string_view raw, const nlohmann::json* schema);

// The JSON type names a parameter schema admits (empty set = unknown): "type" (string or array), else the
// union over anyOf/oneOf/allOf branches, else the types of enum/const values. coerce_parameter decides raw
// text vs JSON with it, and the tool-call grammar (grammar_tool.cpp) must decide the same way, so both use
// this one definition. J is nlohmann::json or nlohmann::ordered_json.
template <class J>
void collect_schema_types(const J& schema, std::set<std::string>& types, int depth = 0) {
  if (!schema.is_object() || depth > 8) return;
  if (auto t = schema.find("type"); t != schema.end()) {
    if (t->is_string()) types.insert(t->template get<std::string>());
    if (t->is_array())
      for (const J& e : *t)
        if (e.is_string()) types.insert(e.template get<std::string>());
    return;
  }
  bool branches = false;
  for (const char* key : {"anyOf", "oneOf", "allOf"})
    if (auto b = schema.find(key); b != schema.end() && b->is_array()) {
      branches = true;
      for (const J& e : *b) collect_schema_types(e, types, depth + 1);
    }
  if (branches) return;
  auto type_of = [](const J& v) -> std::string {
    if (v.is_string()) return "string";
    if (v.is_boolean()) return "boolean";
    if (v.is_null()) return "null";
    if (v.is_number_integer()) return "integer";  // signed and unsigned
    if (v.is_number_float()) return "number";
    if (v.is_object()) return "object";
    if (v.is_array()) return "array";
    return "";
  };
  if (auto e = schema.find("enum"); e != schema.end() && e->is_array())
    for (const J& v : *e)
      if (auto n = type_of(v); !n.empty()) types.insert(n);
  if (auto c = schema.find("const"); c != schema.end())
    if (auto n = type_of(*c); !n.empty()) types.insert(n);
}

}  // namespace qrig::text
