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

#include "server/constraint.h"
#include "server/generation.h"
#include "server/handlers.h"
#include "server/request_fields.h"
#include "server/request_parse.h"
#include "server/samples.h"
#include "server/sse.h"
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
  ConstraintMaker make_constraint;  // the output spec (guided_*, response_format...), allowed_token_ids
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

CompletionRequest parse_completion_request(const Json& body, const ServedModel& model, const FieldPolicy& policy) {
  CompletionRequest c;
  std::set<std::string> known = {"prompt", "echo", "logprobs"};
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

  std::string refused;
  check_table_fields(body, Endpoint::completions, policy, known, refused);
  const OutputSpec spec = parse_output_spec(body, known);
  c.echo = get_bool(body, "echo").value_or(false);
  auto lp = get_int(body, "logprobs", 0, 20);
  if (lp && c.echo)
    throw ApiError(ErrorKind::unsupported, "'logprobs' together with 'echo' (prompt logprobs) is not supported", "logprobs");

  c.gen.sampling = runtime::SamplingParams::qwen_defaults(false);
  parse_common(body, c.gen, tok.n_real(), 16, known);
  c.gen.top_logprobs = lp ? (int32_t)*lp : -1;
  if (c.gen.n > 1 && c.echo)
    throw ApiError(ErrorKind::unsupported, "'echo' together with n > 1 is not supported", "echo");
  std::vector<ConstraintMaker> parts;
  if (spec.kind != OutputSpec::Kind::none) parts.push_back(output_constraint(spec, model, false));
  if (!c.gen.allowed_token_ids.empty()) {
    const std::vector<int32_t> ids = c.gen.allowed_token_ids;
    const size_t n_real = (size_t)tok.n_real();
    parts.push_back([ids, n_real]() { return std::make_shared<AllowedTokens>(ids, n_real); });
  }
  if (c.gen.min_tokens > 0 && spec.kind != OutputSpec::Kind::none)
    bad("min_tokens", "'min_tokens' cannot be combined with constrained output: the constraint may have to end the output");
  c.make_constraint = combine(std::move(parts));
  c.prompt = truncated_prompt(std::move(c.prompt), c.gen, model.engine->context_length());
  c.ignored = unknown_fields(body, known);
  if (!refused.empty()) append_name(c.ignored, refused);
  return c;
}

// Legacy logprobs for some tokens; `offset` is the byte offset of the first token in the returned text.
struct LegacyLogprobs {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  size_t offset = 0;
  // skipped: the tokens that add no text (control tokens under skip_special_tokens).
  void add(const text::Tokenizer& tok, const std::vector<runtime::TokenEvent>& evs, bool with_top,
           const std::vector<bool>* skipped) {
    auto lp = [](float v) { return std::isfinite(v) ? (double)v : -9999.0; };
    for (const auto& e : evs) {
      std::string t = token_text(tok, e.token);
      tokens.push_back(t);
      token_logprobs.push_back(lp(e.logprob));
      json alts = json::object();
      for (const auto& a : e.top) alts[token_text(tok, a.id)] = lp(a.logprob);
      top.push_back(with_top ? alts : json());
      offsets.push_back(offset);
      if (!(skipped && (*skipped)[(size_t)e.token])) offset += tok.token_to_bytes(e.token).size();
    }
  }
  bool empty() const { return tokens.empty(); }
  json take() {
    json j = {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
    tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
    return j;
  }
};

// The samples (n) stream one after another, each choice's chunks carrying its index.
struct CompletionStream {
  ModelPtr model;
  CompletionRequest creq;
  std::vector<std::unique_ptr<Generation>> gens;
  size_t current = 0;
  std::string id;
  int64_t created = 0;
  bool started = false, finished = false;
  LegacyLogprobs lp;

  json chunk(const std::string& text, json finish_reason = nullptr) {
    json choice = {{"index", current}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", std::move(finish_reason)}};
    if (creq.gen.top_logprobs >= 0 && !lp.empty()) choice["logprobs"] = lp.take();
    return stream_chunk(id, "text_completion", created, model->id, std::move(choice), creq.gen.include_usage);
  }

  void cancel_all() {
    for (auto& g : gens)
      if (!g->done()) g->cancel();
  }

  bool pump(StreamSink& sink) {
    const bool more = guarded_pump(*gens[current], finished, sink, [this](StreamSink& s) { return pump_inner(s); });
    if (!more || finished) cancel_all();
    return more;
  }

  bool pump_inner(StreamSink& sink) {
    if (finished) return false;
    Generation& gen = *gens[current];
    std::string wire;
    if (!started) {
      started = true;
      if (creq.echo && !creq.prompt_text.empty()) wire += sse_event(chunk(creq.prompt_text));
    }
    Generation::Step step = gen.next(std::chrono::milliseconds(kPollMs));
    if (creq.gen.top_logprobs >= 0) lp.add(*model->tokenizer, step.tokens, creq.gen.top_logprobs > 0, skipped(*model, creq));
    if (std::string t = step.text(); !t.empty()) wire += sse_event(chunk(t));
    if (!step.done) return write_step(gen, finished, sink, wire, false);
    const std::string& reason = gen.finish_reason();
    if (current + 1 == gens.size() || reason == "error" || reason == "cancelled") {
      json usage;
      if (creq.gen.include_usage) usage = samples_usage(gens);
      wire += stream_end(gen, reason, chunk("", reason), usage);
      return write_step(gen, finished, sink, wire, true);
    }
    wire += sse_event(chunk("", reason));
    ++current;
    started = false;
    lp = LegacyLogprobs{};
    return write_step(gen, finished, sink, wire, false);
  }

  static const std::vector<bool>* skipped(const ServedModel& m, const CompletionRequest& c) {
    return c.gen.skip_special_tokens ? &m.silent_token : nullptr;
  }
};

}  // namespace

void handle_completions(Context& ctx, const ModelPtr& model, const Request& req, Response& res) {
  const Json body = parse_body(req.body);
  CompletionRequest creq = parse_completion_request(body, *model, FieldPolicy{ctx.opt.ignore_unsupported_fields});
  report_ignored(req, res, creq.ignored);
  auto gens = start_samples(model, creq.prompt, creq.gen, creq.make_constraint, "prompt");
  const std::vector<bool>* skipped = CompletionStream::skipped(*model, creq);

  if (!creq.gen.stream) {
    json choices = json::array();
    for (size_t i = 0; i < gens.size(); ++i) {
      Generation& gen = *gens[i];
      std::string text = creq.echo ? creq.prompt_text : "";
      LegacyLogprobs lp;
      lp.offset = text.size();
      while (true) {
        Generation::Step step = gen.next(std::chrono::milliseconds(kPollMs));
        if (creq.gen.top_logprobs >= 0) lp.add(*model->tokenizer, step.tokens, creq.gen.top_logprobs > 0, skipped);
        text += step.text();
        if (step.done) break;
        if (!req.client_alive()) {
          gen.cancel();
          res.status = 499;
          return;
        }
      }
      const std::string& reason = gen.finish_reason();
      if (reason == "error" || reason == "cancelled") throw gen.failure();
      json choice = {{"text", text}, {"index", i}, {"logprobs", nullptr}, {"finish_reason", reason}};
      if (creq.gen.top_logprobs >= 0) choice["logprobs"] = lp.take();
      choices.push_back(std::move(choice));
    }
    send_json(res, 200,
              json{{"id", random_id("cmpl-")}, {"object", "text_completion"}, {"created", unix_now()},
                   {"model", model->id}, {"choices", std::move(choices)}, {"usage", samples_usage(gens)},
                   {"timings", gens.front()->timings()}});
    return;
  }
  auto st = std::make_shared<CompletionStream>();
  st->model = model;
  st->creq = std::move(creq);
  st->gens = std::move(gens);
  st->id = random_id("cmpl-");
  st->created = unix_now();
  st->lp.offset = st->creq.echo ? st->creq.prompt_text.size() : 0;
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_stream(
      "text/event-stream", [st](StreamSink& sink) { return st->pump(sink); }, [st](bool) { st->cancel_all(); });
}

}  // namespace qrig::server
