// POST /v1/responses: OpenAI's Responses API (what Codex CLI and newer OpenAI SDK examples speak) on top of
// the chat pipeline. `input` (a string, or items: messages with input_text / output_text parts,
// function_call, function_call_output, reasoning) and `instructions` become chat messages; function `tools`,
// `tool_choice`, `parallel_tool_calls`, `text.format` (text, json_object, json_schema), `max_output_tokens`,
// `reasoning.effort`, temperature / top_p become chat fields; parse_chat_request reads them and ChatOutput's
// deltas become output items: reasoning (reasoning_text), message (output_text), function_call. Streams send
// the typed events the SDK's ResponseStream checks: response.created, response.in_progress, per item
// output_item.added / content_part.added / *.delta / *.done / content_part.done / output_item.done, then
// response.completed (or response.incomplete at max_output_tokens) with usage; every event has a
// sequence_number. Nothing is stored (store: false semantics whatever `store` says):
// previous_response_id, conversation, background and item references are a 400 saying so.
#include <chrono>
#include <memory>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "server/chat_request.h"
#include "server/handlers.h"
#include "server/samples.h"
#include "server/sse.h"
#include "server/stream.h"

namespace qrig::server {

namespace {

using nlohmann::json;
using text::Delta;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(ErrorKind::invalid_request, message, param);
}
[[noreturn]] void refuse(const std::string& param, const std::string& message) {
  throw ApiError(ErrorKind::unsupported, message, param);
}

std::string str_field(const Json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

// The text of a message's content: a string or input_text / output_text parts.
std::string content_text(const Json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad("input", fmt::format("'{}.content' must be a string or an array of content parts", where));
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const Json& p = c[i];
    const std::string t = p.is_object() ? str_field(p, "type") : "";
    if (t == "input_text" || t == "output_text" || t == "text") {
      if (!p.contains("text") || !p["text"].is_string()) bad("input", fmt::format("'{}.content[{}].text' must be a string", where, i));
      out += p["text"].get<std::string>();
    } else if (t == "input_image" || t == "input_file" || t == "input_audio") {
      refuse("input", fmt::format("'{}.content[{}]' is '{}': this server accepts text only", where, i, t));
    } else if (t == "refusal") {
      out += str_field(p, "refusal");
    } else {
      bad("input", fmt::format("'{}.content[{}]' has an unknown type '{}'", where, i, t));
    }
  }
  return out;
}

// Items -> chat messages. Function calls join the assistant message before them (or start one); reasoning
// items attach to the next assistant message.
Json convert_input(const Json& input) {
  Json messages = Json::array();
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return messages;
  }
  if (!input.is_array()) bad("input", "'input' must be a string or an array of items");
  std::string reasoning;
  auto assistant_for_calls = [&]() -> Json& {
    if (messages.empty() || messages.back().value("role", Json()) != "assistant") {
      Json m = {{"role", "assistant"}, {"content", ""}};
      if (!reasoning.empty()) m["reasoning_content"] = std::exchange(reasoning, "");
      messages.push_back(std::move(m));
    }
    Json& m = messages.back();
    if (!m.contains("tool_calls")) m["tool_calls"] = Json::array();
    return m;
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const Json& it = input[i];
    const std::string where = fmt::format("input[{}]", i);
    if (!it.is_object()) bad("input", fmt::format("'{}' must be an object", where));
    std::string type = str_field(it, "type");
    if (type.empty() && it.contains("role")) type = "message";
    if (type == "message") {
      std::string role = str_field(it, "role");
      if (role == "developer") role = "system";
      if (role != "user" && role != "system" && role != "assistant")
        bad("input", fmt::format("'{}.role' must be \"user\", \"assistant\", \"system\" or \"developer\"", where));
      auto c = it.find("content");
      if (c == it.end() || c->is_null()) bad("input", fmt::format("'{}' has no 'content'", where));
      Json m = {{"role", role}, {"content", content_text(*c, where)}};
      if (role == "assistant" && !reasoning.empty()) m["reasoning_content"] = std::exchange(reasoning, "");
      messages.push_back(std::move(m));
    } else if (type == "function_call") {
      const std::string name = str_field(it, "name");
      if (name.empty()) bad("input", fmt::format("'{}.name' must be a non-empty string", where));
      Json& m = assistant_for_calls();
      m["tool_calls"].push_back({{"id", str_field(it, "call_id")},
                                 {"type", "function"},
                                 {"function", {{"name", name}, {"arguments", str_field(it, "arguments")}}}});
    } else if (type == "function_call_output") {
      auto out = it.find("output");
      if (out == it.end() || out->is_null()) bad("input", fmt::format("'{}.output' is required", where));
      messages.push_back({{"role", "tool"}, {"tool_call_id", str_field(it, "call_id")}, {"content", content_text(*out, where)}});
    } else if (type == "reasoning") {
      std::string text;
      for (const char* key : {"content", "summary"}) {
        auto parts = it.find(key);
        if (parts == it.end() || !parts->is_array() || !text.empty()) continue;
        for (const Json& p : *parts)
          if (p.is_object() && p.contains("text") && p["text"].is_string()) text += p["text"].get<std::string>();
      }
      reasoning += text;
    } else if (type == "item_reference") {
      refuse("input", fmt::format("'{}' is an item reference: this server stores no items; send the item itself", where));
    } else {
      refuse("input", fmt::format("'{}' has type '{}'; this server accepts message, function_call, "
                                  "function_call_output and reasoning items", where, type));
    }
  }
  return messages;
}

Json convert_tools(const Json& tools) {
  if (!tools.is_array()) bad("tools", "'tools' must be an array");
  Json out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    if (!t.is_object()) bad("tools", fmt::format("'tools[{}]' must be an object", i));
    const std::string type = str_field(t, "type");
    if (type != "function")
      refuse("tools", fmt::format("'tools[{}]' has type '{}': this server runs no built-in tools; only function "
                                  "tools are accepted", i, type));
    const std::string name = str_field(t, "name");
    if (name.empty()) bad("tools", fmt::format("'tools[{}].name' must be a non-empty string", i));
    Json fn = {{"name", name}, {"parameters", t.value("parameters", Json::object())}};
    if (t.contains("description") && t["description"].is_string()) fn["description"] = t["description"];
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

// The Responses request as a chat body; the request's own echo fields are left in `echo`.
Json to_chat_body(const Json& body, std::string& ignored) {
  static const std::set<std::string> kKnown = {
      "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text", "max_output_tokens",
      "temperature", "top_p", "reasoning", "stream", "stream_options", "store", "metadata", "user",
      "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "service_tier", "truncation", "include",
      "previous_response_id", "conversation", "background", "max_tool_calls", "prompt", "top_logprobs"};
  for (auto it = body.begin(); it != body.end(); ++it)
    if (!kKnown.count(it.key())) append_name(ignored, it.key());
  auto set = [&](const char* k) { auto it = body.find(k); return it != body.end() && !it->is_null(); };
  if (set("previous_response_id"))
    refuse("previous_response_id", "'previous_response_id' is not supported: this server stores no responses (store is "
                                   "always false); send the whole conversation in 'input'");
  if (set("conversation")) refuse("conversation", "'conversation' is not supported: this server stores no conversations");
  if (set("background") && body["background"] != Json(false))
    refuse("background", "'background' is not supported: responses are generated while the request waits");
  if (set("prompt")) refuse("prompt", "'prompt' (stored prompt templates) is not supported");
  if (set("max_tool_calls")) refuse("max_tool_calls", "'max_tool_calls' is not supported");
  if (set("top_logprobs") && body["top_logprobs"] != Json(0)) refuse("top_logprobs", "'top_logprobs' is not supported here; use /v1/chat/completions");
  if (set("truncation") && body["truncation"] != Json("disabled"))
    refuse("truncation", "'truncation' \"auto\" is not supported: a prompt that does not fit is a 400");
  if (set("include")) {
    if (!body["include"].is_array()) bad("include", "'include' must be an array");
    for (const Json& v : body["include"])
      if (v != Json("reasoning.encrypted_content"))
        refuse("include", fmt::format("'include' value {} is not supported", v.dump()));
  }
  Json chat = Json::object();
  Json messages = Json::array();
  if (set("instructions")) {
    if (!body["instructions"].is_string()) bad("instructions", "'instructions' must be a string");
    messages.push_back({{"role", "system"}, {"content", body["instructions"]}});
  }
  if (!set("input")) bad("input", "'input' is required");
  for (auto& m : convert_input(body["input"])) messages.push_back(std::move(m));
  chat["messages"] = std::move(messages);
  if (set("max_output_tokens")) chat["max_tokens"] = body["max_output_tokens"];
  for (const char* k : {"temperature", "top_p", "model", "parallel_tool_calls"})
    if (set(k)) chat[k] = body[k];
  if (set("tools")) chat["tools"] = convert_tools(body["tools"]);
  if (set("tool_choice")) {
    const Json& tc = body["tool_choice"];
    if (tc.is_string()) {
      chat["tool_choice"] = tc;
    } else if (tc.is_object() && str_field(tc, "type") == "function") {
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc.value("name", Json())}}}};
    } else {
      refuse("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\"}");
    }
  }
  if (set("text")) {
    const Json& t = body["text"];
    if (!t.is_object()) bad("text", "'text' must be an object");
    if (auto v = t.find("verbosity"); v != t.end() && !v->is_null() && *v != Json("medium"))
      refuse("text", "'text.verbosity' other than \"medium\" is not supported");
    if (auto f = t.find("format"); f != t.end() && !f->is_null()) {
      if (!f->is_object()) bad("text", "'text.format' must be an object with a 'type'");
      const std::string type = str_field(*f, "type");
      if (type == "json_schema") {
        chat["response_format"] = {{"type", "json_schema"},
                                   {"json_schema", {{"name", f->value("name", Json("output"))}, {"schema", f->value("schema", Json::object())}}}};
      } else if (type == "json_object" || type == "text") {
        chat["response_format"] = {{"type", type}};
      } else {
        bad("text", "'text.format.type' must be \"text\", \"json_object\" or \"json_schema\"");
      }
    }
  }
  if (set("reasoning")) {
    const Json& r = body["reasoning"];
    if (!r.is_object()) bad("reasoning", "'reasoning' must be an object");
    if (auto e = r.find("effort"); e != r.end() && !e->is_null()) chat["reasoning_effort"] = *e;
  }
  return chat;
}

json usage_of(const Generation& gen, int64_t reasoning_tokens) {
  json u = gen.usage();
  return {{"input_tokens", u["prompt_tokens"]},
          {"input_tokens_details", {{"cached_tokens", u["prompt_tokens_details"]["cached_tokens"]}}},
          {"output_tokens", u["completion_tokens"]},
          {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
          {"total_tokens", u["total_tokens"]}};
}

// The response object around `output` (the request's settings echoed, as OpenAI does).
json response_object(const std::string& id, int64_t created, const ModelPtr& model, const Json& body,
                     const std::string& status, json output) {
  json tools = body.contains("tools") && body["tools"].is_array() ? json::parse(body["tools"].dump()) : json::array();
  json r = {{"id", id},
            {"object", "response"},
            {"created_at", created},
            {"status", status},
            {"model", model->id},
            {"output", std::move(output)},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"instructions", body.contains("instructions") ? json::parse(body["instructions"].dump()) : json()},
            {"max_output_tokens", body.contains("max_output_tokens") ? json::parse(body["max_output_tokens"].dump()) : json()},
            {"parallel_tool_calls", body.value("parallel_tool_calls", Json(true)) == Json(true)},
            {"previous_response_id", nullptr},
            {"store", false},
            {"temperature", body.contains("temperature") ? json::parse(body["temperature"].dump()) : json()},
            {"top_p", body.contains("top_p") ? json::parse(body["top_p"].dump()) : json()},
            {"tool_choice", body.contains("tool_choice") ? json::parse(body["tool_choice"].dump()) : json("auto")},
            {"tools", std::move(tools)},
            {"text", body.contains("text") ? json::parse(body["text"].dump()) : json{{"format", {{"type", "text"}}}}},
            {"reasoning", body.contains("reasoning") ? json::parse(body["reasoning"].dump()) : json{{"effort", nullptr}, {"summary", nullptr}}},
            {"metadata", body.contains("metadata") ? json::parse(body["metadata"].dump()) : json::object()},
            {"usage", nullptr}};
  return r;
}

json reasoning_item(const std::string& id, const std::string& text) {
  return {{"id", id}, {"type", "reasoning"}, {"summary", json::array()},
          {"content", json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}
json message_item(const std::string& id, const std::string& status, const std::string& text, bool with_part = true) {
  json content = json::array();
  if (with_part) content.push_back({{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}});
  return {{"id", id}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", std::move(content)}};
}
json call_item(const std::string& id, const std::string& status, const std::string& call_id, const std::string& name,
               const std::string& arguments) {
  return {{"id", id}, {"type", "function_call"}, {"status", status}, {"call_id", call_id}, {"name", name}, {"arguments", arguments}};
}

struct ResponsesStream {
  ModelPtr model;
  Json body;
  ChatRequest creq;
  std::unique_ptr<Generation> gen;
  std::unique_ptr<ChatOutput> out;
  std::string id;
  int64_t created = 0;
  bool started = false, finished = false;
  int64_t seq = 0;
  enum class Item { none, reasoning, message, call } open = Item::none;
  int64_t index = -1;
  std::string item_id, text, call_id, name;
  json done_items = json::array();

  std::string event(json data) {
    data["sequence_number"] = seq++;
    return fmt::format("event: {}\ndata: {}\n\n", data["type"].get<std::string>(), json_text(data));
  }
  std::string close_item() {
    std::string w;
    json item;
    switch (open) {
      case Item::none: return w;
      case Item::reasoning: {
        json part = {{"type", "reasoning_text"}, {"text", text}};
        w += event({{"type", "response.reasoning_text.done"}, {"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"text", text}});
        w += event({{"type", "response.content_part.done"}, {"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
        item = reasoning_item(item_id, text);
        break;
      }
      case Item::message: {
        json part = {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
        w += event({{"type", "response.output_text.done"}, {"item_id", item_id}, {"output_index", index}, {"content_index", 0},
                    {"text", text}, {"logprobs", json::array()}});
        w += event({{"type", "response.content_part.done"}, {"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
        item = message_item(item_id, "completed", text);
        break;
      }
      case Item::call:
        w += event({{"type", "response.function_call_arguments.done"}, {"item_id", item_id}, {"output_index", index},
                    {"name", name}, {"arguments", text}});
        item = call_item(item_id, "completed", call_id, name, text);
        break;
    }
    w += event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
    done_items.push_back(std::move(item));
    open = Item::none;
    return w;
  }
  std::string open_item(Item kind, const Delta& d) {
    std::string w = close_item();
    open = kind;
    ++index;
    text.clear();
    json item;
    if (kind == Item::reasoning) {
      item_id = random_id("rs_");
      item = {{"id", item_id}, {"type", "reasoning"}, {"summary", json::array()}, {"content", json::array()}};
    } else if (kind == Item::message) {
      item_id = random_id("msg_");
      item = message_item(item_id, "in_progress", "", false);
    } else {
      item_id = random_id("fc_");
      call_id = d.id, name = d.name;
      item = call_item(item_id, "in_progress", call_id, name, "");
    }
    w += event({{"type", "response.output_item.added"}, {"output_index", index}, {"item", item}});
    if (kind == Item::reasoning)
      w += event({{"type", "response.content_part.added"}, {"item_id", item_id}, {"output_index", index}, {"content_index", 0},
                  {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
    if (kind == Item::message)
      w += event({{"type", "response.content_part.added"}, {"item_id", item_id}, {"output_index", index}, {"content_index", 0},
                  {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}, {"logprobs", json::array()}}}});
    return w;
  }
  std::string wire_of(const Delta& d) {
    std::string w;
    switch (d.kind) {
      case Delta::Kind::reasoning:
        if (d.text.empty()) return w;
        if (open != Item::reasoning) w += open_item(Item::reasoning, d);
        text += d.text;
        return w + event({{"type", "response.reasoning_text.delta"}, {"item_id", item_id}, {"output_index", index},
                          {"content_index", 0}, {"delta", d.text}});
      case Delta::Kind::content:
        if (d.text.empty()) return w;
        if (open != Item::message) w += open_item(Item::message, d);
        text += d.text;
        return w + event({{"type", "response.output_text.delta"}, {"item_id", item_id}, {"output_index", index},
                          {"content_index", 0}, {"delta", d.text}, {"logprobs", json::array()}});
      case Delta::Kind::tool_call_start: return open_item(Item::call, d);
      case Delta::Kind::tool_call_arguments:
        if (d.text.empty()) return w;
        text += d.text;
        return event({{"type", "response.function_call_arguments.delta"}, {"item_id", item_id}, {"output_index", index}, {"delta", d.text}});
    }
    return w;
  }

  bool pump(StreamSink& sink) {
    try {
      return pump_inner(sink);
    } catch (const std::exception& e) {
      gen->cancel();
      finished = true;
      const std::string w = error_event(ApiError(ErrorKind::internal, std::string("internal error: ") + e.what()));
      sink.write(w.data(), w.size());
      return false;
    }
  }
  std::string error_event(const ApiError& e) {
    const ErrorSpec& s = error_spec(e.kind);
    return event({{"type", "error"}, {"code", s.code ? json(s.code) : json(s.type)}, {"message", e.what()}, {"param", nullptr}});
  }

  bool pump_inner(StreamSink& sink) {
    if (finished) return false;
    if (!started) {
      started = true;
      json r = response_object(id, created, model, body, "in_progress", json::array());
      std::string w = event({{"type", "response.created"}, {"response", r}});
      w += event({{"type", "response.in_progress"}, {"response", r}});  // sequence numbers in order
      return write_step(*gen, finished, sink, w, false);
    }
    Generation::Step step = gen->next(std::chrono::milliseconds(kPollMs));
    ChatOutput::Fed fed = out->feed(step, *gen);
    std::string w;
    for (const Delta& d : fed.deltas) w += wire_of(d);
    if (step.done) {
      const std::string& reason = gen->finish_reason();
      if (reason == "error" || reason == "cancelled") {
        if (gen->cancelled_by_engine() || reason == "error") w += error_event(gen->failure());
        return write_step(*gen, finished, sink, w, true);
      }
      w += close_item();
      const bool incomplete = out->finish_reason(*gen) == "length";
      json r = response_object(id, created, model, body, incomplete ? "incomplete" : "completed", done_items);
      if (incomplete) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
      r["usage"] = usage_of(*gen, out->reasoning_tokens());
      w += event({{"type", incomplete ? "response.incomplete" : "response.completed"}, {"response", r}});
    }
    return write_step(*gen, finished, sink, w, step.done);
  }
};

json whole_response(const ModelPtr& model, const Json& body, Generation& gen, ChatOutput& out, const Request& client,
                    bool& gone) {
  text::ParsedOutput parsed;
  while (true) {
    Generation::Step step = gen.next(std::chrono::milliseconds(kPollMs));
    for (const Delta& d : out.feed(step, gen).deltas) text::apply_delta(parsed, d);
    if (step.done) break;
    if (!client.client_alive()) {
      gen.cancel();
      gone = true;
      return nullptr;
    }
  }
  const std::string& reason = gen.finish_reason();
  if (reason == "error" || reason == "cancelled") throw gen.failure();
  json output = json::array();
  if (!parsed.reasoning_content.empty()) output.push_back(reasoning_item(random_id("rs_"), parsed.reasoning_content));
  if (!parsed.content.empty() || parsed.tool_calls.empty())
    output.push_back(message_item(random_id("msg_"), "completed", parsed.content));
  for (const auto& c : parsed.tool_calls) output.push_back(call_item(random_id("fc_"), "completed", c.id, c.name, c.arguments));
  const bool incomplete = out.finish_reason(gen) == "length";
  json r = response_object(random_id("resp_"), unix_now(), model, body, incomplete ? "incomplete" : "completed", std::move(output));
  if (incomplete) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  r["usage"] = usage_of(gen, out.reasoning_tokens());
  return r;
}

}  // namespace

void handle_responses(Context& ctx, const ModelPtr& model, const Request& req, Response& res) {
  const Json body = parse_body(req.body);
  std::string ignored;
  const Json chat = to_chat_body(body, ignored);
  ChatRequest creq;
  try {
    creq = parse_chat_request(chat, *model, FieldPolicy{ctx.opt.ignore_unsupported_fields});
  } catch (ApiError& e) {
    // Errors name the Responses fields the chat fields came from.
    if (e.param == "max_tokens") e.param = "max_output_tokens";
    else if (e.param == "response_format") e.param = "text";
    else if (e.param == "messages") e.param = "input";
    throw;
  }
  if (!creq.ignored.empty()) append_name(ignored, creq.ignored);
  report_ignored(req, res, ignored);
  if (auto s = body.find("stream"); s != body.end() && !s->is_null() && !s->is_boolean())
    bad("stream", "'stream' must be a boolean");
  const bool stream = body.value("stream", Json(false)) == Json(true);

  auto gens = start_samples(model, creq.prompt, creq.gen, creq.make_constraint, "input");
  auto out = std::make_unique<ChatOutput>(creq, *model);
  if (!stream) {
    bool gone = false;
    json j = whole_response(model, body, *gens.front(), *out, req, gone);
    if (gone) {
      res.status = 499;
      return;
    }
    send_json(res, 200, j);
    return;
  }
  auto st = std::make_shared<ResponsesStream>();
  st->model = model;
  st->body = body;
  st->creq = std::move(creq);
  st->gen = std::move(gens.front());
  st->out = std::move(out);
  st->id = random_id("resp_");
  st->created = unix_now();
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_stream(
      "text/event-stream", [st](StreamSink& sink) { return st->pump(sink); },
      [st](bool) {
        if (!st->gen->done()) st->gen->cancel();
      });
}

}  // namespace qrig::server
