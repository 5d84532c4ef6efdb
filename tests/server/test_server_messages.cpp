// End-to-end tests (in-process server, scripted backend, so the output is known token by token) of the
// Anthropic Messages and OpenAI Responses endpoints: content blocks / output items from reasoning, text and a
// Qwen XML tool call (tool input and arguments exact), the streamed event sequences, stop_reason values,
// conversations with tool results rendered as the equivalent chat request, and malformed bodies answered
// with a 400 in each API's error shape (never a 500).
#include <catch2/catch.hpp>

#include "server_test_util.h"

using namespace qrig;
using nlohmann::json;

namespace {

std::vector<int32_t> enc(const std::string& s) { return test::tiny_tokenizer()->encode(s, true); }

const char* kThinkingAnchor = "<|im_start|>assistant\n<think>\n";
const char* kPlainAnchor = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
const char* kCall =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    "</function>\n</tool_call>";

std::unique_ptr<test::ScriptedBackend> scripted(const std::string& out, const char* anchor = kPlainAnchor) {
  return std::make_unique<test::ScriptedBackend>(*test::tiny_tokenizer(), enc(out), enc(anchor), 2);
}

const json kWeatherSchema = {{"type", "object"},
                             {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}}},
                             {"required", {"city", "days"}}};

struct Reply {
  int status = 0;
  json body;
  std::string raw;
};

Reply post(test::TestServer& srv, const std::string& path, const std::string& body) {
  auto cli = srv.client();
  auto r = cli.Post(path.c_str(), body, "application/json");
  REQUIRE(r);
  Reply out{r->status, json(), r->body};
  if (r->get_header_value("Content-Type").rfind("application/json", 0) == 0) out.body = json::parse(r->body);
  return out;
}

// "event: NAME\ndata: JSON" events; checks that NAME is the data's type.
std::vector<json> events_of(const std::string& body) {
  std::vector<json> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    REQUIRE(end != std::string::npos);
    const std::string part = body.substr(pos, end - pos);
    pos = end + 2;
    REQUIRE(part.rfind("event: ", 0) == 0);
    const size_t nl = part.find('\n');
    REQUIRE(part.compare(nl + 1, 6, "data: ") == 0);
    json data = json::parse(part.substr(nl + 7));
    CHECK(data["type"] == part.substr(7, nl - 7));
    out.push_back(std::move(data));
  }
  return out;
}

json messages_body(json extra = json::object()) {
  json b = {{"model", "claude"}, {"max_tokens", 200}, {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}};
  for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
  return b;
}

json weather_tool_anthropic() { return {{"name", "get_weather"}, {"input_schema", kWeatherSchema}}; }
json weather_tool_openai() { return {{"type", "function"}, {"name", "get_weather"}, {"parameters", kWeatherSchema}}; }

}  // namespace

TEST_CASE("messages: text and a tool call become text and tool_use blocks, whole and streamed", "[server][messages][fixtures]") {
  test::TestServer srv(scripted(std::string("Checking.\n\n") + kCall));
  const json body = messages_body({{"tools", {weather_tool_anthropic()}}});
  Reply r = post(srv, "/v1/messages", body.dump());
  INFO(r.raw);
  REQUIRE(r.status == 200);
  CHECK(r.body["type"] == "message");
  CHECK(r.body["stop_reason"] == "tool_use");
  REQUIRE(r.body["content"].size() == 2);
  CHECK(r.body["content"][0] == json{{"type", "text"}, {"text", "Checking."}});
  const json& use = r.body["content"][1];
  CHECK(use["type"] == "tool_use");
  CHECK(use["name"] == "get_weather");
  CHECK(use["input"] == json{{"city", "Paris"}, {"days", 3}});
  CHECK(r.body["usage"]["output_tokens"].get<int64_t>() > 0);

  json sbody = body;
  sbody["stream"] = true;
  Reply s = post(srv, "/v1/messages", sbody.dump());
  REQUIRE(s.status == 200);
  std::vector<json> ev = events_of(s.raw);
  std::vector<std::string> kinds;
  std::string text, input_json;
  for (const json& e : ev) {
    const std::string t = e["type"];
    if (kinds.empty() || kinds.back() != t) kinds.push_back(t);
    if (t == "content_block_delta" && e["delta"]["type"] == "text_delta") text += e["delta"]["text"].get<std::string>();
    if (t == "content_block_delta" && e["delta"]["type"] == "input_json_delta")
      input_json += e["delta"]["partial_json"].get<std::string>();
  }
  CHECK(kinds == std::vector<std::string>{"message_start", "ping", "content_block_start", "content_block_delta",
                                          "content_block_stop", "content_block_start", "content_block_delta",
                                          "content_block_stop", "message_delta", "message_stop"});
  CHECK(text == "Checking.");
  CHECK(json::parse(input_json) == json{{"city", "Paris"}, {"days", 3}});
  const json& start = *std::find_if(ev.begin(), ev.end(), [](const json& e) {
    return e["type"] == "content_block_start" && e["content_block"]["type"] == "tool_use";
  });
  CHECK(start["index"] == 1);
  CHECK(start["content_block"]["name"] == "get_weather");
  CHECK(start["content_block"]["input"] == json::object());
  CHECK(ev[ev.size() - 2]["delta"]["stop_reason"] == "tool_use");
}

TEST_CASE("messages: thinking blocks, stop_sequence, max_tokens, end_turn", "[server][messages][fixtures]") {
  {
    test::TestServer srv(scripted("Let me see.</think>\n\nSunny.", kThinkingAnchor));
    Reply r = post(srv, "/v1/messages", messages_body({{"thinking", {{"type", "enabled"}, {"budget_tokens", 1000}}}}).dump());
    INFO(r.raw);
    REQUIRE(r.status == 200);
    REQUIRE(r.body["content"].size() == 2);
    CHECK(r.body["content"][0]["type"] == "thinking");
    CHECK(r.body["content"][0]["thinking"] == "Let me see.");
    CHECK(r.body["content"][1] == json{{"type", "text"}, {"text", "Sunny."}});
    CHECK(r.body["stop_reason"] == "end_turn");
    Reply s = post(srv, "/v1/messages",
                   messages_body({{"stream", true}, {"thinking", {{"type", "enabled"}, {"budget_tokens", 1000}}}}).dump());
    std::string thinking;
    bool signature = false;
    for (const json& e : events_of(s.raw)) {
      if (e["type"] != "content_block_delta") continue;
      if (e["delta"]["type"] == "thinking_delta") thinking += e["delta"]["thinking"].get<std::string>();
      if (e["delta"]["type"] == "signature_delta") signature = true;
    }
    CHECK(thinking == "Let me see.");
    CHECK(signature);
  }
  test::TestServer srv(scripted("Hello world. Goodbye."));
  Reply r = post(srv, "/v1/messages", messages_body({{"stop_sequences", {"world"}}}).dump());
  CHECK(r.body["stop_reason"] == "stop_sequence");
  CHECK(r.body["stop_sequence"] == "world");
  CHECK(r.body["content"][0]["text"] == "Hello ");
  r = post(srv, "/v1/messages", messages_body({{"max_tokens", 2}}).dump());
  CHECK(r.body["stop_reason"] == "max_tokens");
  CHECK(r.body["usage"]["output_tokens"] == 2);
  r = post(srv, "/v1/messages", messages_body().dump());
  CHECK(r.body["stop_reason"] == "end_turn");
  CHECK(r.body["stop_sequence"].is_null());
  CHECK(r.body["content"][0]["text"] == "Hello world. Goodbye.");
}

TEST_CASE("messages and responses: a conversation with tool results renders as the equivalent chat request",
          "[server][messages][fixtures]") {
  test::TestServer srv(scripted("Fine."));
  // Key order matters (the template writes tool definitions in it): ordered, as a client sends them.
  using ojson = nlohmann::ordered_json;
  const ojson chat_messages = {
      {{"role", "system"}, {"content", "Be brief."}},
      {{"role", "user"}, {"content", "Weather in Paris?"}},
      {{"role", "assistant"}, {"content", ""},
       {"tool_calls", {{{"id", "c1"}, {"type", "function"},
                        {"function", {{"name", "get_weather"}, {"arguments", R"({"city":"Paris","days":3})"}}}}}}},
      {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "Sunny"}}};
  const ojson chat_tools = {
      {{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", ojson::parse(kWeatherSchema.dump())}}}}};
  Reply tok = post(srv, "/tokenize",
                   ojson{{"messages", chat_messages}, {"tools", chat_tools}, {"enable_thinking", false}}.dump());
  REQUIRE(tok.status == 200);
  const int64_t expected = tok.body["count"];

  const json anthropic = {
      {"model", "m"}, {"max_tokens", 5}, {"system", {{{"type", "text"}, {"text", "Be brief."}}}},
      {"tools", {weather_tool_anthropic()}},
      {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}},
                    {{"role", "assistant"}, {"content", {{{"type", "tool_use"}, {"id", "c1"}, {"name", "get_weather"},
                                                          {"input", {{"city", "Paris"}, {"days", 3}}}}}}},
                    {{"role", "user"}, {"content", {{{"type", "tool_result"}, {"tool_use_id", "c1"}, {"content", "Sunny"}}}}}}}};
  Reply count = post(srv, "/v1/messages/count_tokens", anthropic.dump());
  INFO(count.raw);
  CHECK(count.body["input_tokens"] == expected);
  Reply m = post(srv, "/v1/messages", anthropic.dump());
  CHECK(m.body["usage"]["input_tokens"].get<int64_t>() + m.body["usage"]["cache_read_input_tokens"].get<int64_t>() == expected);

  const json responses = {
      {"model", "m"}, {"instructions", "Be brief."}, {"tools", {weather_tool_openai()}}, {"reasoning", {{"effort", "none"}}},
      {"input", {{{"role", "user"}, {"content", "Weather in Paris?"}},
                 {{"type", "function_call"}, {"call_id", "c1"}, {"name", "get_weather"}, {"arguments", R"({"city":"Paris","days":3})"}},
                 {{"type", "function_call_output"}, {"call_id", "c1"}, {"output", "Sunny"}}}}};
  Reply r = post(srv, "/v1/responses", responses.dump());
  INFO(r.raw);
  REQUIRE(r.status == 200);
  CHECK(r.body["usage"]["input_tokens"] == expected);
}

TEST_CASE("responses: reasoning, message and function_call items, whole and streamed", "[server][messages][fixtures]") {
  test::TestServer srv(scripted(std::string("Let me check.</think>\n\n") + kCall, kThinkingAnchor));
  const json body = {{"model", "m"}, {"input", "Weather in Paris?"}, {"tools", {weather_tool_openai()}}};
  Reply r = post(srv, "/v1/responses", body.dump());
  INFO(r.raw);
  REQUIRE(r.status == 200);
  CHECK(r.body["status"] == "completed");
  REQUIRE(r.body["output"].size() == 2);
  CHECK(r.body["output"][0]["type"] == "reasoning");
  CHECK(r.body["output"][0]["content"][0]["text"] == "Let me check.");
  const json& call = r.body["output"][1];
  CHECK(call["type"] == "function_call");
  CHECK(call["name"] == "get_weather");
  CHECK(json::parse(call["arguments"].get<std::string>()) == json{{"city", "Paris"}, {"days", 3}});
  CHECK(r.body["usage"]["output_tokens_details"]["reasoning_tokens"].get<int64_t>() > 0);

  json sbody = body;
  sbody["stream"] = true;
  Reply s = post(srv, "/v1/responses", sbody.dump());
  std::vector<json> ev = events_of(s.raw);
  std::vector<std::string> kinds;
  std::string args;
  for (size_t i = 0; i < ev.size(); ++i) {
    CHECK(ev[i]["sequence_number"] == i);
    const std::string t = ev[i]["type"];
    if (kinds.empty() || kinds.back() != t) kinds.push_back(t);
    if (t == "response.function_call_arguments.delta") args += ev[i]["delta"].get<std::string>();
  }
  CHECK(kinds == std::vector<std::string>{
                     "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
                     "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
                     "response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done", "response.completed"});
  CHECK(json::parse(args) == json{{"city", "Paris"}, {"days", 3}});
  CHECK(ev.back()["response"]["output"].size() == 2);
  CHECK(ev.back()["response"]["output"][1]["arguments"] == call["arguments"]);
  // max_output_tokens: incomplete.
  json small = body;
  small["max_output_tokens"] = 2;
  Reply inc = post(srv, "/v1/responses", small.dump());
  CHECK(inc.body["status"] == "incomplete");
  CHECK(inc.body["incomplete_details"]["reason"] == "max_output_tokens");
}

TEST_CASE("messages and responses: malformed bodies are 400s in each API's shape, never 500", "[server][messages][fixtures]") {
  test::TestServer srv(scripted("Hi."));
  for (const char* body : {
           "{}", "[]", R"({"max_tokens": 5})", R"({"max_tokens": 5, "messages": []})", R"({"max_tokens": 5, "messages": "hi"})",
           R"({"max_tokens": 5, "messages": [1]})", R"({"max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]})",
           R"({"max_tokens": 5, "messages": [{"role": "user"}]})",
           R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", "name": "x"}]}]})",
           R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text"}]}]})",
           R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": 5}]}]})",
           R"({"max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": 3}]}]})",
           R"({"max_tokens": 5, "system": 5, "messages": [{"role": "user", "content": "x"}]})",
           R"({"max_tokens": 5, "tools": {}, "messages": [{"role": "user", "content": "x"}]})",
           R"({"max_tokens": 5, "tools": [{"input_schema": {}}], "messages": [{"role": "user", "content": "x"}]})",
           R"({"max_tokens": 5, "tool_choice": {"type": "any"}, "messages": [{"role": "user", "content": "x"}]})",
           R"({"max_tokens": 5, "tool_choice": "auto", "messages": [{"role": "user", "content": "x"}]})",
           R"({"max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": -1}, "messages": [{"role": "user", "content": "x"}]})",
           R"({"max_tokens": 5, "thinking": {"type": "sometimes"}, "messages": [{"role": "user", "content": "x"}]})",
           R"({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]})",
           R"({"max_tokens": 5, "stop_sequences": "x", "messages": [{"role": "user", "content": "x"}]})",
           R"({"max_tokens": 5, "stream": "yes", "messages": [{"role": "user", "content": "x"}]})",
           R"({"max_tokens": 5, "mcp_servers": [{"url": "x"}], "messages": [{"role": "user", "content": "x"}]})"}) {
    INFO(body);
    Reply r = post(srv, "/v1/messages", body);
    CHECK(r.status == 400);
    CHECK(r.body["type"] == "error");
    CHECK(r.body["error"]["type"] == "invalid_request_error");
    CHECK(r.body["error"]["message"].get<std::string>().size() > 5);
  }
  for (const char* body : {
           "{}", "[]", R"({"input": 5})", R"({"input": [5]})", R"({"input": [{"role": "robot", "content": "x"}]})",
           R"({"input": [{"role": "user"}]})", R"({"input": [{"role": "user", "content": [{"type": "input_image"}]}]})",
           R"({"input": [{"type": "function_call"}]})", R"({"input": [{"type": "function_call_output", "call_id": "x"}]})",
           R"({"input": [{"type": "web_search_call"}]})", R"({"input": "x", "instructions": 5})",
           R"({"input": "x", "tools": [{"type": "function"}]})", R"({"input": "x", "tools": [{"type": "file_search"}]})",
           R"({"input": "x", "tool_choice": {"type": "mcp"}})", R"({"input": "x", "tool_choice": "required"})",
           R"({"input": "x", "text": {"format": {"type": "yaml"}}})", R"({"input": "x", "text": 5})",
           R"({"input": "x", "text": {"format": {"type": "json_schema", "schema": {"type": "object", "not": {}}}}})",
           R"({"input": "x", "max_output_tokens": -3})", R"({"input": "x", "reasoning": {"effort": "extreme"}})",
           R"({"input": "x", "previous_response_id": "resp_1"})", R"({"input": "x", "conversation": "c"})",
           R"({"input": "x", "background": true})", R"({"input": "x", "include": ["file_search_call.results"]})",
           R"({"input": "x", "truncation": "auto"})", R"({"input": "x", "stream": 1})"}) {
    INFO(body);
    Reply r = post(srv, "/v1/responses", body);
    CHECK(r.status == 400);
    CHECK(r.body["error"]["type"] == "invalid_request_error");
    CHECK(r.body["error"]["message"].get<std::string>().size() > 5);
  }
}
