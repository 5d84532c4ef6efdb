// Tests of text/output_parser on whole outputs: reasoning, content, tool calls with every schema type,
// malformed calls (kept as content), and argument coercion. Streaming is tested in test_output_stream.cpp.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>

#include "text/output_parser.h"

using nlohmann::json;
using qrig::text::coerce_parameter;
using qrig::text::parse_output;
using qrig::text::ParsedOutput;

namespace {

json test_tools() {
  return json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "weather",
      "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "everything", "parameters": {"type": "object", "properties": {
        "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"}, "b": {"type": "boolean"},
        "z": {"type": "null"}, "o": {"type": "object"}, "a": {"type": "array"},
        "u": {"type": ["string", "null"]}, "e": {"enum": ["x", "y"]},
        "any": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}}}},
    {"function": {"name": "no_params"}}
  ])");
}

ParsedOutput parse(const std::string& text, bool thinking, const json& tools = test_tools()) {
  return parse_output(text, tools, thinking, "call_t_");
}

std::string call(const std::string& name, const std::string& params_xml) {
  return "<tool_call>\n<function=" + name + ">\n" + params_xml + "</function>\n</tool_call>";
}

std::string param(const std::string& name, const std::string& value) {
  return "<parameter=" + name + ">\n" + value + "\n</parameter>\n";
}

}  // namespace

TEST_CASE("plain text with thinking off is all content", "[text]") {
  auto r = parse("Hello, world!\nSecond line.", false);
  CHECK(r.content == "Hello, world!\nSecond line.");
  CHECK(r.reasoning_content.empty());
  CHECK(r.tool_calls.empty());
  CHECK(parse("", false) == ParsedOutput{});
  CHECK(parse("Hello\n", false).content == "Hello\n");  // trailing newline kept
  // With thinking off no tag opens or closes reasoning.
  CHECK(parse("<think>\nx\n</think>\n\ny", false).content == "<think>\nx\n</think>\n\ny");
}

TEST_CASE("reasoning and content are split at </think> and the template's newlines dropped", "[text]") {
  auto r = parse("Let me think.\nStep 2.\n</think>\n\nThe answer is 4.", true);
  CHECK(r.reasoning_content == "Let me think.\nStep 2.");
  CHECK(r.content == "The answer is 4.");
  auto only = parse("Just thinking\n</think>\n\n", true);
  CHECK(only.reasoning_content == "Just thinking");
  CHECK(only.content.empty());
  auto empty_reasoning = parse("\n\n</think>\n\nHi", true);  // what the model writes when it skips thinking
  CHECK(empty_reasoning.reasoning_content.empty());
  CHECK(empty_reasoning.content == "Hi");
  auto second_close = parse("a\n</think>\n\nb </think> c", true);
  CHECK(second_close.reasoning_content == "a");
  CHECK(second_close.content == "b </think> c");
}

TEST_CASE("an output that starts with <think> is accepted", "[text]") {
  auto r = parse("<think>\nhmm\n</think>\n\nok", true);
  CHECK(r.reasoning_content == "hmm");
  CHECK(r.content == "ok");
  auto nl = parse("\n<think>\nhmm\n</think>\nok", true);
  CHECK(nl.reasoning_content == "hmm");
  CHECK(nl.content == "ok");
  auto inner = parse("about <think> tags\n</think>\n\nx", true);  // only at the start
  CHECK(inner.reasoning_content == "about <think> tags");
}

TEST_CASE("unfinished reasoning stays reasoning, as written", "[text]") {
  auto r = parse("I think\nabout it\n", true);
  CHECK(r.reasoning_content == "I think\nabout it\n");
  CHECK(r.content.empty());
  CHECK(parse("partial close </thi", true).reasoning_content == "partial close </thi");
  CHECK(parse("<thi", true).reasoning_content == "<thi");
}

TEST_CASE("tool calls inside reasoning are reasoning text", "[text]") {
  const std::string c = call("get_weather", param("city", "Paris"));
  auto unfinished = parse("maybe " + c, true);
  CHECK(unfinished.reasoning_content == "maybe " + c);
  CHECK(unfinished.tool_calls.empty());
  auto finished = parse("maybe " + c + "\n</think>\n\nNo call after all.", true);
  CHECK(finished.reasoning_content == "maybe " + c);
  CHECK(finished.content == "No call after all.");
  CHECK(finished.tool_calls.empty());
}

TEST_CASE("a tool call after reasoning", "[text]") {
  auto r = parse("need weather\n</think>\n\n" + call("get_weather", param("city", "Paris") + param("days", "3")), true);
  CHECK(r.reasoning_content == "need weather");
  CHECK(r.content.empty());
  REQUIRE(r.tool_calls.size() == 1);
  CHECK(r.tool_calls[0].id == "call_t_0");
  CHECK(r.tool_calls[0].name == "get_weather");
  CHECK(r.tool_calls[0].arguments == R"({"city":"Paris","days":3})");
}

TEST_CASE("content before a call keeps its text, the separator newlines go", "[text]") {
  auto r = parse("Let me check.\n\n" + call("get_weather", param("city", "Oslo")) + "\n", false);
  CHECK(r.content == "Let me check.");
  REQUIRE(r.tool_calls.size() == 1);
  CHECK(r.tool_calls[0].arguments == R"({"city":"Oslo"})");
  auto after = parse(call("get_weather", param("city", "Oslo")) + "\n\nAnything else?", false);
  CHECK(after.content == "Anything else?");
}

TEST_CASE("several tool calls in a row", "[text]") {
  const std::string text = "I'll call three tools.\n\n" + call("get_weather", param("city", "Paris")) + "\n" +
                           call("get_weather", param("city", "Rome") + param("days", "2")) + "\n" +
                           call("no_params", "");
  auto r = parse(text, false);
  CHECK(r.content == "I'll call three tools.");
  REQUIRE(r.tool_calls.size() == 3);
  CHECK(r.tool_calls[0].id == "call_t_0");
  CHECK(r.tool_calls[1].id == "call_t_1");
  CHECK(r.tool_calls[2].id == "call_t_2");
  CHECK(r.tool_calls[1].arguments == R"({"city":"Rome","days":2})");
  CHECK(r.tool_calls[2].name == "no_params");
  CHECK(r.tool_calls[2].arguments == "{}");
  // Calls without newlines between, and with free whitespace between the tags.
  auto tight = parse("<tool_call><function=get_weather><parameter=city>A</parameter></function></tool_call>"
                     "<tool_call>  <function= get_weather >\n\n<parameter=city>\nB\n</parameter>   </function>"
                     "\t</tool_call>",
                     false);
  REQUIRE(tight.tool_calls.size() == 2);
  CHECK(tight.tool_calls[0].arguments == R"({"city":"A"})");
  CHECK(tight.tool_calls[1].arguments == R"({"city":"B"})");
  CHECK(tight.content.empty());
}

TEST_CASE("every schema type is coerced", "[text]") {
  const std::string params = param("s", "  two\nlines, \"quoted\"  ") + param("i", "42") + param("n", "3.5") +
                             param("b", "True") + param("z", "null") + param("o", "{\"k\": [1, 2], \"a\": {}}") +
                             param("a", "[1, \"x\", null]") + param("u", "null") + param("e", "x") +
                             param("any", "7") + param("extra", "[1]") + param("word", "hello there");
  auto r = parse(call("everything", params), false);
  REQUIRE(r.tool_calls.size() == 1);
  json args = json::parse(r.tool_calls[0].arguments);
  CHECK(args["s"] == "  two\nlines, \"quoted\"  ");
  CHECK(args["i"] == 42);
  CHECK(args["i"].is_number_integer());
  CHECK(args["n"] == 3.5);
  CHECK(args["b"] == true);
  CHECK(args["z"].is_null());
  CHECK(args["o"] == json::parse(R"({"k": [1, 2], "a": {}})"));
  CHECK(args["a"] == json::parse(R"([1, "x", null])"));
  CHECK(args["u"].is_null());
  CHECK(args["e"] == "x");
  CHECK(args["any"] == 7);
  CHECK(args["extra"] == json::array({1}));
  CHECK(args["word"] == "hello there");
  // Parameter order and key order inside objects are the model's.
  CHECK(r.tool_calls[0].arguments.find(R"("o":{"k":[1,2],"a":{}})") != std::string::npos);
  CHECK(r.tool_calls[0].arguments.rfind(R"({"s":)", 0) == 0);
}

TEST_CASE("coercion falls back to the raw string", "[text]") {
  json integer = {{"type", "integer"}}, string = {{"type", "string"}}, boolean = {{"type", "boolean"}};
  json opt = {{"type", json::array({"string", "integer"})}};
  CHECK(coerce_parameter("abc", &integer) == "abc");
  CHECK(coerce_parameter("12", &string) == "12");
  CHECK(coerce_parameter("FALSE", &boolean) == false);
  CHECK(coerce_parameter("maybe", &boolean) == "maybe");
  CHECK(coerce_parameter("12", &opt) == 12);
  CHECK(coerce_parameter("true", &opt) == "true");  // a boolean is not one of the other listed types
  CHECK(coerce_parameter("{\"a\":", nullptr) == "{\"a\":");
  CHECK(coerce_parameter("", nullptr) == "");
  CHECK(coerce_parameter("1e999", nullptr) == "1e999");  // out of range for a double: kept as text
  json string_enum = {{"enum", json::array({"1", "2"})}};
  CHECK(coerce_parameter("1", &string_enum) == "1");
  json int_const = {{"const", 5}};
  CHECK(coerce_parameter("5", &int_const) == 5);
}

TEST_CASE("a value keeps everything but one leading and one trailing newline", "[text]") {
  auto r = parse(call("get_weather", "<parameter=city>\n\nNew\nYork\n\n</parameter>\n"), false);
  REQUIRE(r.tool_calls.size() == 1);
  CHECK(json::parse(r.tool_calls[0].arguments)["city"] == "\nNew\nYork\n");
  auto inline_value = parse(call("get_weather", "<parameter=city>Paris</parameter>"), false);
  REQUIRE(inline_value.tool_calls.size() == 1);
  CHECK(json::parse(inline_value.tool_calls[0].arguments)["city"] == "Paris");
}

TEST_CASE("malformed tool calls are kept verbatim as content", "[text]") {
  const std::string good = call("get_weather", param("city", "Paris"));
  const std::vector<std::string> bad = {
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis",               // unclosed at the end
      call("nope", param("city", "Paris")),                                       // unknown function
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",  // no </parameter>
      call("get_weather", "<parameter=city>\nA\n<parameter=days>\n2\n</parameter>\n"),  // bad nesting
      "<tool_call>\nhello <function=get_weather>\n</function>\n</tool_call>",      // text outside the tags
      "<tool_call>\n<function=get_weather>\n</function>\ntrailing</tool_call>",    // text after </function>
      "<tool_call>\n<function=get_weather>\n</tool_call>",                         // no </function>
      call("get_weather", param("city", "A") + param("city", "B")),                // parameter given twice
      "<tool_call>\n<function=>\n</function>\n</tool_call>",                       // empty name
      "<tool_call>\n<function=get_weather\n</function>\n</tool_call>",             // unterminated tag
      "<tool_call>\n<tool_call>\n<function=get_weather>\n</function>\n</tool_call>",  // nested open
  };
  for (const std::string& b : bad) {
    INFO(b);
    auto r = parse("Intro.\n\n" + b, false);
    CHECK(r.content == "Intro.\n\n" + b);
    CHECK(r.tool_calls.empty());
    // A good call after a malformed one is still a call.
    auto after = parse(b + "\n" + good, false);
    if (b.find("</tool_call>") != std::string::npos) {
      CHECK(after.content == b);
      REQUIRE(after.tool_calls.size() == 1);
      CHECK(after.tool_calls[0].id == "call_t_0");
    } else {
      CHECK(after.content == b + "\n" + good);  // unclosed swallows the rest up to the first </tool_call>
      CHECK(after.tool_calls.empty());
    }
  }
}

TEST_CASE("without tools nothing is a tool call", "[text]") {
  const std::string text = "x\n\n" + call("get_weather", param("city", "Paris"));
  auto r = parse(text, false, json::array());
  CHECK(r.content == text);
  CHECK(r.tool_calls.empty());
  CHECK(parse(text, false, json()).content == text);  // null tools
}

TEST_CASE("bad tools arrays are rejected with a clear message", "[text]") {
  CHECK_THROWS_WITH(parse("x", false, json::object()), Catch::Contains("tools must be an array"));
  CHECK_THROWS_WITH(parse("x", false, json::parse(R"([{"type":"function","function":{}}])")),
                    Catch::Contains("tools[0].function.name"));
  CHECK_THROWS_WITH(parse("x", false, json::parse(R"([1])")), Catch::Contains("tools[0] must be an object"));
  CHECK_THROWS_WITH(parse("x", false, json::parse(R"([{"type":"retrieval","function":{"name":"a"}}])")),
                    Catch::Contains("tools[0].type"));
  CHECK_THROWS_WITH(parse("x", false, json::parse(R"([{"function":{"name":"a","parameters":3}}])")),
                    Catch::Contains("parameters must be an object"));
}

TEST_CASE("invalid UTF-8 in a value does not crash the arguments JSON", "[text]") {
  auto r = parse(call("get_weather", param("city", "Par\xFFis")), false);
  REQUIRE(r.tool_calls.size() == 1);
  CHECK(json::parse(r.tool_calls[0].arguments)["city"] == "Par\xEF\xBF\xBDis");
}

TEST_CASE("default tool call ids are call_ plus a random prefix and the index", "[text]") {
  const std::string text = call("no_params", "") + call("no_params", "");
  auto a = parse_output(text, test_tools(), false);
  auto b = parse_output(text, test_tools(), false);
  REQUIRE(a.tool_calls.size() == 2);
  CHECK(a.tool_calls[0].id.rfind("call_", 0) == 0);
  CHECK(a.tool_calls[0].id.size() == 5 + 16 + 1 + 1);
  CHECK(a.tool_calls[1].id.substr(0, 22) == a.tool_calls[0].id.substr(0, 22));
  CHECK(a.tool_calls[1].id.back() == '1');
  CHECK(a.tool_calls[0].id != b.tool_calls[0].id);
}
