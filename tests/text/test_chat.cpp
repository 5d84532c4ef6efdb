// Chat formatter unit tests that need no Python: the Python string semantics of chat_pyfmt, the
// template's errors, malformed input (always ChatError, never a crash), preserve_thinking,
// JSON-string tool arguments, and render_chat_request's options and /think /no_think switches.
#include <catch2/catch.hpp>

#include "text/chat.h"
#include "text/chat_pyfmt.h"

#include <limits>

namespace {

using Json = nlohmann::ordered_json;
using qrig::text::ChatError;
using qrig::text::ChatOptions;
using qrig::text::render_chat;
using qrig::text::render_chat_request;

std::string render(const char* messages, const char* tools = "null", ChatOptions opt = {}) {
  return render_chat(Json::parse(messages), Json::parse(tools), opt);
}

std::string request(const char* body) { return render_chat_request(Json::parse(body)); }

std::string error_of(const char* messages, const char* tools = "null") {
  try {
    render(messages, tools);
  } catch (const ChatError& e) {
    return e.what();
  }
  return "<no error>";
}

const char* kUserPrompt = "<|im_start|>user\n";
const char* kThink = "<|im_start|>assistant\n<think>\n";
const char* kNoThink = "<|im_start|>assistant\n<think>\n\n</think>\n\n";

}  // namespace

TEST_CASE("chat: Python float repr", "[text][chat]") {
  using qrig::text::py::float_repr;
  CHECK(float_repr(1e16) == "1e+16");
  CHECK(float_repr(1e15) == "1000000000000000.0");
  CHECK(float_repr(1234567890123456.0) == "1234567890123456.0");
  CHECK(float_repr(123456789012345678.0) == "1.2345678901234568e+17");
  CHECK(float_repr(0.0001) == "0.0001");
  CHECK(float_repr(0.00001) == "1e-05");
  CHECK(float_repr(2.5e-8) == "2.5e-08");
  CHECK(float_repr(1.5e300) == "1.5e+300");
  CHECK(float_repr(0.0) == "0.0");
  CHECK(float_repr(-0.0) == "-0.0");
  CHECK(float_repr(3.0) == "3.0");
  CHECK(float_repr(-2.5) == "-2.5");
  CHECK(float_repr(0.1) == "0.1");
  CHECK(float_repr(1.0 / 3.0) == "0.3333333333333333");
  CHECK(float_repr(5e-324) == "5e-324");
  CHECK(float_repr(std::numeric_limits<double>::max()) == "1.7976931348623157e+308");
  CHECK(float_repr(std::numeric_limits<double>::infinity()) == "inf");
}

TEST_CASE("chat: Python json.dumps and str", "[text][chat]") {
  using qrig::text::py::json_dumps;
  using qrig::text::py::scalar_str;
  auto v = Json::parse(R"({"z": [1, -2, 3.0, 1e16, true, null, {}], "a": {"q\"\\": "\n\t\u0001\u007fé🙂\u2028"}, "e": []})");
  CHECK(json_dumps(v) ==
        "{\"z\": [1, -2, 3.0, 1e+16, true, null, {}], \"a\": {\"q\\\"\\\\\": "
        "\"\\n\\t\\u0001\x7f" "é🙂\u2028\"}, \"e\": []}");
  CHECK(json_dumps(Json::parse("18446744073709551615")) == "18446744073709551615");
  CHECK(scalar_str(Json(nullptr)) == "None");
  CHECK(scalar_str(Json(true)) == "True");
  CHECK(scalar_str(Json(false)) == "False");
  CHECK(scalar_str(Json(2.0)) == "2.0");
  CHECK(scalar_str(Json("raw \"s\"")) == "raw \"s\"");
  CHECK_THROWS_AS(scalar_str(Json::array()), ChatError);
  std::string deep(2000, '[');
  CHECK_THROWS_AS(json_dumps(Json::parse(deep + std::string(2000, ']'))), ChatError);
}

TEST_CASE("chat: Python str.strip whitespace", "[text][chat]") {
  using qrig::text::py::strip;
  CHECK(strip(" \t\n\v\f\r\x1c\x1f a b \u00a0\u3000\u2028\u2029\u202f\u205f\u1680\u2000\u200a\u0085") == "a b");
  CHECK(strip("\u200bx\u200b") == "\u200bx\u200b");  // zero width space is not whitespace
  CHECK(strip("") == "");
  CHECK(strip(" \n ") == "");
  CHECK(strip("\xff \xe3\x80") == "\xff \xe3\x80");  // invalid UTF-8: kept, no crash
  CHECK(strip(" \xc2") == "\xc2");
}

TEST_CASE("chat: basic turns and generation prompt", "[text][chat]") {
  const char* msgs = R"([{"role":"system","content":" Be brief. "},{"role":"user","content":"Hi\n"}])";
  std::string head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n";
  CHECK(render(msgs) == head + kThink);
  CHECK(render(msgs, "null", {.enable_thinking = false}) == head + kNoThink);
  CHECK(render(msgs, "null", {.add_generation_prompt = false}) == head);
  CHECK(render(msgs, "[]") == head + kThink);  // an empty tools list prints no tools block
}

TEST_CASE("chat: preserve_thinking keeps every past reasoning", "[text][chat]") {
  const char* msgs = R"([{"role":"user","content":"a"},
    {"role":"assistant","content":"x","reasoning_content":"r1"},
    {"role":"user","content":"b"},
    {"role":"assistant","content":"<think>\nr2\n</think>\n\ny"},
    {"role":"user","content":"c"}])";
  std::string plain = "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nx<|im_end|>\n"
                      "<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\ny<|im_end|>\n"
                      "<|im_start|>user\nc<|im_end|>\n";
  std::string kept = "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>\nr1\n</think>\n\nx<|im_end|>\n"
                     "<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\ny<|im_end|>\n"
                     "<|im_start|>user\nc<|im_end|>\n";
  CHECK(render(msgs) == plain + kThink);
  CHECK(render(msgs, "null", {.preserve_thinking = true}) == kept + kThink);
}

TEST_CASE("chat: tool calls, JSON-string arguments and tool responses", "[text][chat]") {
  const char* obj = R"([{"role":"user","content":"q"},
    {"role":"assistant","content":null,"tool_calls":[
      {"id":"1","type":"function","function":{"name":"f","arguments":{"s":"a\nb","n":2,"f":0.5,"b":true,"z":null,"l":[1,"x"],"o":{"k":"é"}}}},
      {"name":"g","arguments":{}}]},
    {"role":"tool","content":"r1"},{"role":"tool","content":[{"type":"text","text":"r2"}]}])";
  std::string expected =
      "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
      "<tool_call>\n<function=f>\n<parameter=s>\na\nb\n</parameter>\n<parameter=n>\n2\n</parameter>\n"
      "<parameter=f>\n0.5\n</parameter>\n<parameter=b>\nTrue\n</parameter>\n<parameter=z>\nNone\n</parameter>\n"
      "<parameter=l>\n[1, \"x\"]\n</parameter>\n<parameter=o>\n{\"k\": \"é\"}\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=g>\n</function>\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n";
  CHECK(render(obj) == expected + kThink);
  // The OpenAI wire form: arguments as a JSON string, rendered as the object it holds.
  const char* str = R"([{"role":"user","content":"q"},
    {"role":"assistant","content":null,"tool_calls":[
      {"id":"1","type":"function","function":{"name":"f","arguments":"{\"s\":\"a\\nb\",\"n\":2,\"f\":0.50,\"b\":true,\"z\":null,\"l\":[1,\"x\"],\"o\":{\"k\":\"\\u00e9\"}}"}},
      {"name":"g","arguments":"{}"}]},
    {"role":"tool","content":"r1"},{"role":"tool","content":[{"type":"text","text":"r2"}]}])";
  CHECK(render(str) == expected + kThink);
}

TEST_CASE("chat: the template's errors", "[text][chat]") {
  CHECK(error_of("[]") == "No messages provided.");
  CHECK(error_of("null") == "No messages provided.");
  CHECK(error_of(R"([{"role":"system","content":"s"}])") == "No user query found in messages.");
  CHECK(error_of(R"([{"role":"user","content":"<tool_response>x</tool_response>"}])") ==
        "No user query found in messages.");
  CHECK(error_of(R"([{"role":"user","content":"u"},{"role":"system","content":"s"}])") ==
        "System message must be at the beginning.");
  CHECK(error_of(R"([{"role":"system","content":[{"type":"image"}]},{"role":"user","content":"u"}])") ==
        "System message cannot contain images.");
  CHECK(error_of(R"([{"role":"system","content":[{"video":"v"}]},{"role":"user","content":"u"}])",
                 R"([{"type":"function","function":{"name":"f"}}])") == "System message cannot contain videos.");
  CHECK(error_of(R"([{"role":"user","content":"u"},{"role":"developer","content":"d"}])") ==
        "Unexpected message role.");
  CHECK(error_of(R"([{"role":"user","content":"u"},{"content":"no role"}])") == "Unexpected message role.");
  CHECK(error_of(R"([{"role":"user","content":5}])") == "Unexpected content type.");
  CHECK(error_of(R"([{"role":"user","content":{"text":"x"}}])") == "Unexpected content type.");
  CHECK(error_of(R"([{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}])") ==
        "Unexpected item type in content.");
}

TEST_CASE("chat: malformed input is a ChatError", "[text][chat]") {
  const char* u = R"({"role":"user","content":"u"})";
  auto with_assistant = [&](const std::string& assistant) { return "[" + std::string(u) + "," + assistant + "]"; };
  std::vector<std::string> bad_messages = {
      R"({"role":"user"})",  // an object, not an array
      "[1]", R"(["user: hi"])", "[null]",
      R"([{"role":"user","content":["text"]}])",
      R"([{"role":"user","content":[{"type":"text","text":7}]}])",
      R"([{"role":"user","content":[{"type":"text","text":null}]}])",
      with_assistant(R"({"role":"assistant","tool_calls":{"name":"f"}})"),
      with_assistant(R"({"role":"assistant","tool_calls":"f"})"),
      with_assistant(R"({"role":"assistant","tool_calls":[7]})"),
      with_assistant(R"({"role":"assistant","tool_calls":[{"function":null}]})"),
      with_assistant(R"({"role":"assistant","tool_calls":[{"function":{"arguments":{}}}]})"),
      with_assistant(R"({"role":"assistant","tool_calls":[{"function":{"name":1}}]})"),
      with_assistant(R"({"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{bad"}}]})"),
      with_assistant(R"({"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"[1,2]"}}]})"),
      with_assistant(R"({"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":null}}]})"),
      with_assistant(R"({"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":5}}]})"),
  };
  for (const auto& m : bad_messages) {
    INFO(m);
    CHECK_THROWS_AS(render_chat(Json::parse(m), Json(), {}), ChatError);
  }
  Json deep_args = Json::parse(with_assistant(R"({"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{}}}]})"));
  std::string deep = std::string(5000, '[') + std::string(5000, ']');
  deep_args[1]["tool_calls"][0]["function"]["arguments"]["x"] = Json::parse(deep);
  CHECK_THROWS_AS(render_chat(deep_args, Json(), {}), ChatError);
  for (const char* tools : {R"({"type":"function"})", R"("f")", "[1]", R"(["f"])"}) {
    INFO(tools);
    CHECK_THROWS_AS(render_chat(Json::parse("[" + std::string(u) + "]"), Json::parse(tools), {}), ChatError);
  }
  for (const char* body : {"[]", "null", R"({"messages":"hi"})", R"({"messages":[]})",
                           R"({"messages":[{"role":"user","content":"u"}],"add_generation_prompt":"yes"})",
                           R"({"messages":[{"role":"user","content":"u"}],"chat_template_kwargs":[]})",
                           R"({"messages":[{"role":"user","content":"u"}],"chat_template_kwargs":{"enable_thinking":0}})",
                           R"({"messages":[{"role":"user","content":"u"}],"chat_template_kwargs":{"preserve_thinking":"true"}})"}) {
    INFO(body);
    CHECK_THROWS_AS(request(body), ChatError);
  }
}

TEST_CASE("chat: request options", "[text][chat]") {
  std::string user = std::string(kUserPrompt) + "u<|im_end|>\n";
  CHECK(request(R"({"model":"m","messages":[{"role":"user","content":"u"}]})") == user + kThink);
  CHECK(request(R"({"messages":[{"role":"user","content":"u"}],"add_generation_prompt":false})") == user);
  CHECK(request(R"({"messages":[{"role":"user","content":"u"}],"chat_template_kwargs":{"enable_thinking":false}})") ==
        user + kNoThink);
  CHECK(request(R"({"messages":[{"role":"user","content":"u"}],"tools":null,"chat_template_kwargs":null})") ==
        user + kThink);
  CHECK(request(R"({"messages":[{"role":"user","content":[{"type":"image"}]}],"chat_template_kwargs":{"add_vision_id":true}})") ==
        std::string(kUserPrompt) + "Picture 1: <|vision_start|><|image_pad|><|vision_end|><|im_end|>\n" + kThink);
  std::string tools_body = R"({"messages":[{"role":"user","content":"u"}],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]})";
  CHECK(render_chat_request(Json::parse(tools_body)).find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}\n</tools>") !=
        std::string::npos);
}

TEST_CASE("chat: /think and /no_think switches", "[text][chat]") {
  auto user = [](const char* text) { return std::string(kUserPrompt) + text + "<|im_end|>\n"; };
  CHECK(request(R"({"messages":[{"role":"user","content":"Hello /no_think"}]})") == user("Hello") + kNoThink);
  CHECK(request(R"({"messages":[{"role":"user","content":"Hello\n/no_think \n"}]})") == user("Hello") + kNoThink);
  CHECK(request(R"({"messages":[{"role":"user","content":"/no_think"}]})") == user("") + kNoThink);
  // The switch wins over chat_template_kwargs, both ways.
  CHECK(request(R"({"messages":[{"role":"user","content":"Hi /think"}],"chat_template_kwargs":{"enable_thinking":false}})") ==
        user("Hi") + kThink);
  CHECK(request(R"({"messages":[{"role":"user","content":"Hi /no_think"}],"chat_template_kwargs":{"enable_thinking":true}})") ==
        user("Hi") + kNoThink);
  // In a content array: the last part, when it is text.
  CHECK(request(R"({"messages":[{"role":"user","content":[{"type":"image"},{"type":"text","text":"what? /no_think"}]}]})") ==
        user("<|vision_start|><|image_pad|><|vision_end|>what?") + kNoThink);
  // Not a switch: glued to a word, in the middle, or not in the last user message.
  CHECK(request(R"({"messages":[{"role":"user","content":"cat /tmp/no_think"}]})") == user("cat /tmp/no_think") + kThink);
  CHECK(request(R"({"messages":[{"role":"user","content":"/no_think please"}]})") == user("/no_think please") + kThink);
  CHECK(request(R"({"messages":[{"role":"user","content":"a /no_think"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]})") ==
        user("a /no_think") + "<|im_start|>assistant\nb<|im_end|>\n" + user("c") + kThink);
  // A switch in the last user message applies even when an assistant turn follows it.
  CHECK(request(R"({"messages":[{"role":"user","content":"c /no_think"},{"role":"assistant","content":"d"}],"add_generation_prompt":false})") ==
        user("c") + "<|im_start|>assistant\n<think>\n\n</think>\n\nd<|im_end|>\n");
}

TEST_CASE("chat: developer role, enable_thinking, reasoning_effort", "[text][chat]") {
  const std::string user = std::string(kUserPrompt) + "u<|im_end|>\n";
  // developer is system (OpenAI): the same prompt byte for byte.
  CHECK(request(R"({"messages":[{"role":"developer","content":"be brief"},{"role":"user","content":"u"}]})") ==
        request(R"({"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"u"}]})"));
  CHECK(request(R"({"messages":[{"role":"developer","content":"s"},{"role":"user","content":"u"}]})") ==
        "<|im_start|>system\ns<|im_end|>\n" + user + kThink);
  CHECK_THROWS_AS(request(R"({"messages":[{"role":"user","content":"u"},{"role":"developer","content":"s"}]})"), ChatError);
  // Top-level enable_thinking; it must agree with chat_template_kwargs when both are given.
  CHECK(request(R"({"messages":[{"role":"user","content":"u"}],"enable_thinking":false})") == user + kNoThink);
  CHECK(request(R"({"messages":[{"role":"user","content":"u"}],"enable_thinking":true,"chat_template_kwargs":{"enable_thinking":true}})") ==
        user + kThink);
  CHECK_THROWS_AS(request(R"({"messages":[{"role":"user","content":"u"}],"enable_thinking":false,"chat_template_kwargs":{"enable_thinking":true}})"),
                  ChatError);
  CHECK_THROWS_AS(request(R"({"messages":[{"role":"user","content":"u"}],"enable_thinking":"no"})"), ChatError);
  // reasoning_effort: "none" is thinking off, any level on; an explicit enable_thinking wins.
  CHECK(request(R"({"messages":[{"role":"user","content":"u"}],"reasoning_effort":"none"})") == user + kNoThink);
  CHECK(request(R"({"messages":[{"role":"user","content":"u"}],"reasoning_effort":"low"})") == user + kThink);
  CHECK(request(R"({"messages":[{"role":"user","content":"u"}],"reasoning_effort":"none","enable_thinking":true})") ==
        user + kThink);
  CHECK_THROWS_AS(request(R"({"messages":[{"role":"user","content":"u"}],"reasoning_effort":"extreme"})"), ChatError);
}

TEST_CASE("chat: a trailing assistant message is continued", "[text][chat]") {
  const std::string user = std::string(kUserPrompt) + "u<|im_end|>\n";
  // Assistant prefill (the default with a generation prompt): the closed turn without its <|im_end|>.
  const std::string closed = "<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is<|im_end|>\n";
  const std::string open = "<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is";
  CHECK(request(R"({"messages":[{"role":"user","content":"u"},{"role":"assistant","content":"The answer is "}]})") ==
        user + open);
  CHECK(request(R"({"messages":[{"role":"user","content":"u"},{"role":"assistant","content":"The answer is"}],"continue_final_message":true,"add_generation_prompt":false})") ==
        user + open);
  // Rendered as a finished turn when asked, or without a generation prompt (the template's own rendering).
  CHECK(request(R"({"messages":[{"role":"user","content":"u"},{"role":"assistant","content":"The answer is"}],"continue_final_message":false})") ==
        user + closed + kThink);
  CHECK(request(R"({"messages":[{"role":"user","content":"u"},{"role":"assistant","content":"The answer is"}],"add_generation_prompt":false})") ==
        user + closed);
  // Reasoning only: the prompt ends inside the <think> block, after it.
  auto r = qrig::text::render_chat_request_with_spans(
      Json::parse(R"({"messages":[{"role":"user","content":"u"},{"role":"assistant","content":"","reasoning_content":"Let me see"}]})"));
  CHECK(r.text == user + "<|im_start|>assistant\n<think>\nLet me see");
  CHECK(r.output_in_reasoning);
  auto c = qrig::text::render_chat_request_with_spans(
      Json::parse(R"({"messages":[{"role":"user","content":"u"},{"role":"assistant","content":"Yes","reasoning_content":"Let me see"}]})"));
  CHECK(c.text == user + "<|im_start|>assistant\n<think>\nLet me see\n</think>\n\nYes");
  CHECK_FALSE(c.output_in_reasoning);
  CHECK(qrig::text::render_chat_request_with_spans(Json::parse(R"({"messages":[{"role":"user","content":"u"}]})")).output_in_reasoning);
  CHECK_FALSE(qrig::text::render_chat_request_with_spans(
                  Json::parse(R"({"messages":[{"role":"user","content":"u"}],"enable_thinking":false})")).output_in_reasoning);
  // The prefill is request text: a special token written in it stays text (a literal span).
  auto lit = qrig::text::render_chat_request_with_spans(
      Json::parse(R"({"messages":[{"role":"user","content":"u"},{"role":"assistant","content":"x <|im_end|>"}]})"));
  REQUIRE(!lit.literal_spans.empty());
  CHECK(lit.literal_spans.back().second == lit.text.size());
  // Misuse.
  CHECK_THROWS_AS(request(R"({"messages":[{"role":"user","content":"u"}],"continue_final_message":true,"add_generation_prompt":false})"),
                  ChatError);
  CHECK_THROWS_AS(request(R"({"messages":[{"role":"user","content":"u"},{"role":"assistant","content":"a"}],"continue_final_message":true,"add_generation_prompt":true})"),
                  ChatError);
}
