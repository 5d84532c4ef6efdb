// POST /v1/completions (the legacy text completion API): prompt as a string or token ids, output text with
// stop strings applied, optional echo of the prompt, logprobs in the legacy layout ({tokens, token_logprobs,
// top_logprobs, text_offset}; text_offset counts bytes of the returned text). Streams text_completion
// chunks like the chat endpoint (same id in every chunk, finish chunk with empty text, optional usage chunk,
// [DONE]). max_tokens defaults to 16 as in OpenAI's API; sampling defaults are Qwen's non-thinking ones.
#include <chrono>
#include <cmath>
#include <memory>
#include <set>

#include <fmt/format.h>

#include "server/generation.h"
#include "server/handlers.h"
#include "server/request_parse.h"
#include "server/sse.h"
#include "server/stream.h"
#include "server/stream.h"

namespace qrig::server {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(ErrorKind::invalid_request, message, param);
}

struct CompletionRequest {
  std::vector<int32_t> prompt;
  std::string prompt_text;  // for echo
  bool echo = false;
  GenParams gen;
  std::string ignored;
};

std::vector<int32_t> token_array(const Json& a, const std::string& param, int32_t n_vocab) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < a.size(); ++i) {
    const Json& v = a[i];
    if (!(v.is_number_integer() || v.is_number_unsigned()) || v.get<int64_t>() < 0 || v.get<int64_t>() >= n_vocab)
      bad(param, fmt::format("'{}[{}]' must be a token id in [0, {})", param, i, n_vocab));
    ids.push_back((int32_t)v.get<int64_t>());
  }
  return ids;
}

CompletionRequest parse_completion_request(const Json& body, const ServedModel& model) {
  CompletionRequest c;
  std::set<std::string> known = {"prompt", "echo", "logprobs", "best_of", "suffix"};
  const text::Tokenizer& tok = *model.tokenizer;
  auto p = body.find("prompt");
  if (p == body.end() || p->is_null()) bad("prompt", "'prompt' is required");
  const Json* one = &*p;
  if (p->is_array() && !p->empty() && (p->front().is_string() || p->front().is_array())) {
    if (p->size() != 1)
      throw ApiError(ErrorKind::unsupported, "only one prompt per request is supported (send one request each)", "prompt");
    one = &p->front();
  }
  if (one->is_string()) {
    c.prompt_text = one->get<std::string>();
    c.prompt = tok.encode(c.prompt_text, true);
  } else if (one->is_array()) {
    c.prompt = token_array(*one, "prompt", tok.n_vocab());
    c.prompt_text = text::sanitize_utf8(tok.decode(c.prompt));
  } else {
    bad("prompt", "'prompt' must be a string, an array of token ids, or an array holding one of those");
  }
  if (c.prompt.empty()) bad("prompt", "'prompt' is empty");

  reject_unsupported(body, {{"response_format", "constrained output is served by /v1/chat/completions"},
                            {"grammar", "GBNF grammars are not supported"},
                            {"json_schema", "constrained output is served by /v1/chat/completions"}});
  if (auto best = get_int(body, "best_of", 1, 1 << 20); best && *best != 1)
    throw ApiError(ErrorKind::unsupported, "only best_of = 1 is supported", "best_of");
  if (auto suffix = get_string(body, "suffix"); suffix && !suffix->empty())
    throw ApiError(ErrorKind::unsupported, "'suffix' (fill-in-the-middle) is not supported", "suffix");
  c.echo = get_bool(body, "echo").value_or(false);
  auto lp = get_int(body, "logprobs", 0, 20);
  if (lp && c.echo)
    throw ApiError(ErrorKind::unsupported, "'logprobs' together with 'echo' (prompt logprobs) is not supported", "logprobs");

  c.gen.sampling = runtime::SamplingParams::qwen_defaults(false);
  parse_common(body, c.gen, tok.n_real(), 16, known);
  c.gen.top_logprobs = lp ? (int32_t)*lp : -1;
  c.ignored = unknown_fields(body, known);
  return c;
}

// Legacy logprobs for some tokens; `offset` is the byte offset of the first token in the returned text.
struct LegacyLogprobs {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  size_t offset = 0;
  void add(const text::Tokenizer& tok, const std::vector<runtime::TokenEvent>& evs, bool with_top) {
    auto lp = [](float v) { return std::isfinite(v) ? (double)v : -9999.0; };
    for (const auto& e : evs) {
      std::string t = token_text(tok, e.token);
      tokens.push_back(t);
      token_logprobs.push_back(lp(e.logprob));
      json alts = json::object();
      for (const auto& a : e.top) alts[token_text(tok, a.id)] = lp(a.logprob);
      top.push_back(with_top ? alts : json());
      offsets.push_back(offset);
      offset += tok.token_to_bytes(e.token).size();
    }
  }
  bool empty() const { return tokens.empty(); }
  json take() {
    json j = {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
    tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
    return j;
  }
};

struct CompletionStream {
  ModelPtr model;
  CompletionRequest creq;
  std::unique_ptr<Generation> gen;
  std::string id;
  int64_t created = 0;
  bool started = false, finished = false;
  LegacyLogprobs lp;

  json chunk(const std::string& text, json finish_reason = nullptr) {
    json choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", std::move(finish_reason)}};
    if (creq.gen.top_logprobs >= 0 && !lp.empty()) choice["logprobs"] = lp.take();
    return stream_chunk(id, "text_completion", created, model->id, std::move(choice), creq.gen.include_usage);
  }

  bool pump(StreamSink& sink) {
    return guarded_pump(*gen, finished, sink, [this](StreamSink& s) { return pump_inner(s); });
  }

  bool pump_inner(StreamSink& sink) {
    if (finished) return false;
    std::string wire;
    if (!started) {
      started = true;
      if (creq.echo && !creq.prompt_text.empty()) wire += sse_event(chunk(creq.prompt_text));
    }
    Generation::Step step = gen->next(std::chrono::milliseconds(kPollMs));
    if (creq.gen.top_logprobs >= 0) lp.add(*model->tokenizer, step.tokens, creq.gen.top_logprobs > 0);
    if (std::string t = step.text(); !t.empty()) wire += sse_event(chunk(t));
    if (step.done) {
      json usage;
      if (creq.gen.include_usage) usage = gen->usage();
      wire += stream_end(*gen, gen->finish_reason(), chunk("", gen->finish_reason()), usage);
    }
    return write_step(*gen, finished, sink, wire, step.done);
  }
};

}  // namespace

void handle_completions(Context& ctx, const ModelPtr& model, const Request& req, Response& res) {
  const Json body = parse_body(req.body);
  CompletionRequest creq = parse_completion_request(body, *model);
  report_ignored(req, res, creq.ignored);

  runtime::Request r;
  r.prompt = creq.prompt;
  r.sampling = creq.gen.sampling;
  r.max_tokens = creq.gen.max_tokens;
  r.stop_tokens = model->eog;
  r.top_logprobs = creq.gen.top_logprobs;
  auto gen = std::make_unique<Generation>(model, std::move(r), Generation::Options{creq.gen.stop, "prompt", creq.gen.skip_special_tokens});

  if (!creq.gen.stream) {
    std::string text = creq.echo ? creq.prompt_text : "";
    LegacyLogprobs lp;
    lp.offset = text.size();
    while (true) {
      Generation::Step step = gen->next(std::chrono::milliseconds(kPollMs));
      if (creq.gen.top_logprobs >= 0) lp.add(*model->tokenizer, step.tokens, creq.gen.top_logprobs > 0);
      text += step.text();
      if (step.done) break;
      if (!req.client_alive()) {
        gen->cancel();
        res.status = 499;
        return;
      }
    }
    const std::string& reason = gen->finish_reason();
    if (reason == "error" || reason == "cancelled") throw gen->failure();
    json choice = {{"text", text}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", reason}};
    if (creq.gen.top_logprobs >= 0) choice["logprobs"] = lp.take();
    send_json(res, 200,
              json{{"id", random_id("cmpl-")}, {"object", "text_completion"}, {"created", unix_now()},
                   {"model", model->id}, {"choices", json::array({std::move(choice)})}, {"usage", gen->usage()},
                   {"timings", gen->timings()}});
    return;
  }
  auto st = std::make_shared<CompletionStream>();
  st->model = model;
  st->creq = std::move(creq);
  st->gen = std::move(gen);
  st->id = random_id("cmpl-");
  st->created = unix_now();
  st->lp.offset = st->creq.echo ? st->creq.prompt_text.size() : 0;
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
