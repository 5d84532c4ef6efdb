// POST /v1/chat/completions: the whole response (chat.completion) or a stream of chat.completion.chunk
// events. Stream contract (what OpenAI sends and llama.cpp's server tests check): every chunk has the same
// id, created and model; the first chunk's delta carries the role; reasoning arrives as
// delta.reasoning_content (mirrored as delta.reasoning); a tool call's first delta has index, id, type and
// function.name, later deltas only argument fragments; the finish chunk has an empty delta and the
// finish_reason; with stream_options.include_usage every chunk has "usage": null and a last chunk with empty
// choices carries the usage; then "data: [DONE]". A failure after the stream has started is an error event
// ({"error": {...}}) and the stream ends without [DONE]. With n > 1 the samples share one prefill
// (start_samples) and stream one after another, each choice's chunks carrying its index.
#include <chrono>
#include <memory>

#include "server/chat_request.h"
#include "server/handlers.h"
#include "server/samples.h"
#include "server/sse.h"
#include "server/stream.h"

namespace qrig::server {

namespace {

using text::Delta;
using nlohmann::json;

json delta_json(const Delta& d) {
  switch (d.kind) {
    case Delta::Kind::reasoning: return {{"reasoning_content", d.text}, {"reasoning", d.text}};
    case Delta::Kind::content: return {{"content", d.text}};
    case Delta::Kind::tool_call_start:
      return {{"tool_calls", json::array({{{"index", d.index},
                                           {"id", d.id},
                                           {"type", "function"},
                                           {"function", {{"name", d.name}, {"arguments", ""}}}}})}};
    case Delta::Kind::tool_call_arguments:
      return {{"tool_calls", json::array({{{"index", d.index}, {"function", {{"arguments", d.text}}}}})}};
  }
  return json::object();
}

// Adjacent text deltas of one kind become one chunk.
std::vector<Delta> merge_text(std::vector<Delta> ds) {
  std::vector<Delta> out;
  for (auto& d : ds) {
    bool text = d.kind == Delta::Kind::reasoning || d.kind == Delta::Kind::content;
    if (text && !out.empty() && out.back().kind == d.kind) out.back().text += d.text;
    else out.push_back(std::move(d));
  }
  return out;
}

// The samples (n) stream one after another, as the engine runs them: each choice's chunks carry its index,
// its first chunk the role and its last the finish_reason; the usage chunk and [DONE] come after the last.
struct ChatStream {
  ModelPtr model;
  ChatRequest creq;
  std::vector<std::unique_ptr<Generation>> gens;
  std::vector<std::unique_ptr<ChatOutput>> outs;
  size_t current = 0;  // the sample being streamed
  std::string id;
  int64_t created = 0;
  bool started = false, finished = false;
  json pending_logprobs = json::array();

  json chunk(json delta, json finish_reason = nullptr) {
    json choice = {{"index", current}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", std::move(finish_reason)}};
    if (creq.gen.top_logprobs >= 0 && !pending_logprobs.empty()) {
      choice["logprobs"] = {{"content", pending_logprobs}, {"refusal", nullptr}};
      pending_logprobs = json::array();
    }
    return stream_chunk(id, "chat.completion.chunk", created, model->id, std::move(choice), creq.gen.include_usage);
  }

  void cancel_all() {
    for (auto& g : gens)
      if (!g->done()) g->cancel();
  }

  // One call of the response's pump: write what is ready (waiting up to kPollMs for it). Returning false
  // aborts the response (client gone); the connection layer checks the socket between calls.
  bool pump(StreamSink& sink) {
    const bool more = guarded_pump(*gens[current], finished, sink, [this](StreamSink& s) { return pump_inner(s); });
    if (!more || finished) cancel_all();
    return more;
  }

  bool pump_inner(StreamSink& sink) {
    if (finished) return false;
    Generation& gen = *gens[current];
    ChatOutput& out = *outs[current];
    std::string wire;
    if (!started) {  // the role chunk goes out at once, before the first token
      started = true;
      return write_step(gen, finished, sink, sse_event(chunk({{"role", "assistant"}, {"content", ""}})), false);
    }
    Generation::Step step = gen.next(std::chrono::milliseconds(kPollMs));
    ChatOutput::Fed fed = out.feed(step, gen);
    if (creq.gen.top_logprobs >= 0) {
      step.tokens.resize(fed.tokens_used);
      for (auto& e : out.logprob_entries(step.tokens)) pending_logprobs.push_back(std::move(e));
    }
    for (const Delta& d : merge_text(std::move(fed.deltas))) wire += sse_event(chunk(delta_json(d)));
    if (!step.done) return write_step(gen, finished, sink, wire, false);
    const std::string reason = out.finish_reason(gen);
    const bool last = current + 1 == gens.size();
    if (last || reason == "error" || reason == "cancelled") {
      json usage;
      if (creq.gen.include_usage) {
        std::vector<int64_t> reasoning;
        for (auto& o : outs) reasoning.push_back(o->reasoning_tokens());
        usage = samples_usage(gens, reasoning);
      }
      wire += stream_end(gen, reason, chunk(json::object(), reason), usage);
      return write_step(gen, finished, sink, wire, true);
    }
    json end = chunk(json::object(), reason);
    wire += sse_event(end);
    ++current;
    started = false;
    return write_step(gen, finished, sink, wire, false);
  }
};

// One sample's message and finish reason; null when the client went away.
json whole_choice(const ChatRequest& creq, size_t index, Generation& gen, ChatOutput& out, const Request& client,
                  bool& client_gone) {
  text::ParsedOutput parsed;
  json logprobs = json::array();
  while (true) {
    Generation::Step step = gen.next(std::chrono::milliseconds(kPollMs));
    ChatOutput::Fed fed = out.feed(step, gen);
    if (creq.gen.top_logprobs >= 0) {
      step.tokens.resize(fed.tokens_used);
      for (auto& e : out.logprob_entries(step.tokens)) logprobs.push_back(std::move(e));
    }
    for (const Delta& d : fed.deltas) text::apply_delta(parsed, d);
    if (step.done) break;
    if (!client.client_alive()) {
      gen.cancel();
      client_gone = true;
      return nullptr;
    }
  }
  const std::string reason = out.finish_reason(gen);
  if (reason == "error" || reason == "cancelled") throw gen.failure();
  json message = {{"role", "assistant"}};
  message["content"] = parsed.content.empty() && !parsed.tool_calls.empty() ? json() : json(parsed.content);
  if (!parsed.reasoning_content.empty()) {
    message["reasoning_content"] = parsed.reasoning_content;
    message["reasoning"] = parsed.reasoning_content;
  }
  if (!parsed.tool_calls.empty()) {
    json calls = json::array();
    for (const auto& c : parsed.tool_calls)
      calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    message["tool_calls"] = std::move(calls);
  }
  json choice = {{"index", index}, {"message", std::move(message)}, {"logprobs", nullptr}, {"finish_reason", reason}};
  if (creq.gen.top_logprobs >= 0) choice["logprobs"] = {{"content", std::move(logprobs)}, {"refusal", nullptr}};
  return choice;
}

json whole_response(const ModelPtr& model, const ChatRequest& creq, std::vector<std::unique_ptr<Generation>>& gens,
                    std::vector<std::unique_ptr<ChatOutput>>& outs, const Request& client, bool& client_gone) {
  json choices = json::array();
  std::vector<int64_t> reasoning;
  for (size_t i = 0; i < gens.size(); ++i) {
    json c = whole_choice(creq, i, *gens[i], *outs[i], client, client_gone);
    if (client_gone) return nullptr;
    choices.push_back(std::move(c));
    reasoning.push_back(outs[i]->reasoning_tokens());
  }
  return {{"id", random_id("chatcmpl-")},
          {"object", "chat.completion"},
          {"created", unix_now()},
          {"model", model->id},
          {"choices", std::move(choices)},
          {"usage", samples_usage(gens, reasoning)},
          {"timings", gens.front()->timings()}};
}

}  // namespace

void handle_chat_completions(Context& ctx, const ModelPtr& model, const Request& req, Response& res) {
  const Json body = parse_body(req.body);
  ChatRequest creq = parse_chat_request(body, *model, FieldPolicy{ctx.opt.ignore_unsupported_fields});
  report_ignored(req, res, creq.ignored);

  auto gens = start_samples(model, creq.prompt, creq.gen, creq.make_constraint, "messages");
  std::vector<std::unique_ptr<ChatOutput>> outs;
  for (size_t i = 0; i < gens.size(); ++i) outs.push_back(std::make_unique<ChatOutput>(creq, *model));

  if (!creq.gen.stream) {
    bool gone = false;
    json j = whole_response(model, creq, gens, outs, req, gone);
    if (gone) {
      res.status = 499;  // nginx's "client closed request": only the log and metrics see it
      return;
    }
    send_json(res, 200, j);
    return;
  }
  auto st = std::make_shared<ChatStream>();
  st->model = model;
  st->creq = std::move(creq);
  st->gens = std::move(gens);
  st->outs = std::move(outs);
  st->id = random_id("chatcmpl-");
  st->created = unix_now();
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_stream(
      "text/event-stream", [st](StreamSink& sink) { return st->pump(sink); }, [st](bool) { st->cancel_all(); });
}

}  // namespace qrig::server
