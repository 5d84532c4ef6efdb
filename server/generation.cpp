// Generation: engine request <-> HTTP thread hand-off, decoding, stop strings, usage and timings.
#include "server/generation.h"

#include <algorithm>
#include <random>

#include <fmt/format.h>

#include "server/errors.h"
#include "server/metrics.h"
#include "text/unicode.h"

namespace qrig::server {

std::string random_id(const std::string& prefix, size_t n) {
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string s = prefix;
  for (size_t i = 0; i < n; ++i) s += kChars[rng() % (sizeof(kChars) - 1)];
  return s;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string token_text(const text::Tokenizer& tok, int32_t id) { return text::sanitize_utf8(tok.token_to_bytes(id)); }

nlohmann::json token_bytes(const text::Tokenizer& tok, int32_t id) {
  nlohmann::json a = nlohmann::json::array();
  for (unsigned char c : tok.token_to_bytes(id)) a.push_back((int)c);
  return a;
}

namespace {

// Runs submit; turns the engine's refusals into API errors.
template <class Submit>
void submit_or_throw(const std::string& prompt_param, Submit&& submit) {
  try {
    submit();
  } catch (const runtime::ContextOverflow& e) {
    ApiError err(ErrorKind::context_overflow,
                 fmt::format("the request exceeds the available context size: the prompt has {} tokens, the context "
                             "holds {} (prompt plus at least one generated token); shorten the prompt",
                             e.n_prompt, e.n_ctx),
                 prompt_param);
    // Typed, not a bare braced list: inside a template clang before 17 skips the destructor of the by-value
    // operator= argument (llvm-project#51037), so the object replaced leaked (fuzz_http's first finding).
    err.extra = nlohmann::json{{"n_prompt_tokens", e.n_prompt}, {"n_ctx", e.n_ctx}};
    throw err;
  } catch (const runtime::QueueFull& e) {
    throw ApiError(ErrorKind::queue_full, std::string("the server is busy: ") + e.what() + "; retry later");
  } catch (const runtime::EngineError& e) {
    // Empty prompts and bad ids are checked before; what is left is the engine refusing new work.
    throw ApiError(ErrorKind::unavailable, e.what());
  } catch (const std::invalid_argument& e) {
    throw ApiError(ErrorKind::invalid_request, e.what());
  }
}

}  // namespace

Generation::Generation(std::shared_ptr<const ServedModel> model, Options opt)
    : model_(std::move(model)),
      q_(std::make_shared<Queue>()),
      decoder_(*model_->tokenizer),
      stop_(opt.stop),
      skip_special_(opt.skip_special),
      include_stop_(opt.include_stop),
      record_(RequestScope::current()) {}

void Generation::check_prompt(const ServedModel& model, const runtime::Request& req, const Options& opt) {
  if (req.prompt.empty()) throw ApiError(ErrorKind::invalid_request, "the prompt is empty", opt.prompt_param);
  for (int32_t t : req.prompt)
    if (t < 0 || t >= model.tokenizer->n_vocab())
      throw ApiError(ErrorKind::invalid_request,
                     fmt::format("token id {} is out of range [0, {})", t, model.tokenizer->n_vocab()), opt.prompt_param);
}

runtime::Callbacks Generation::callbacks() const {
  runtime::Callbacks cb;
  std::shared_ptr<Queue> q = q_;
  cb.on_token = [q](const runtime::TokenEvent& ev) {
    {
      std::lock_guard<std::mutex> lk(q->mu);
      q->tokens.push_back(ev);
    }
    q->cv.notify_all();
  };
  cb.on_done = [q](const runtime::DoneEvent& d) {
    {
      std::lock_guard<std::mutex> lk(q->mu);
      q->done = d;
    }
    q->cv.notify_all();
  };
  return cb;
}

Generation::Generation(std::shared_ptr<const ServedModel> model, runtime::Request req, Options opt)
    : Generation(std::move(model), opt) {
  check_prompt(*model_, req, opt);
  submit_or_throw(opt.prompt_param, [&] { id_ = model_->engine->submit(std::move(req), callbacks()); });
}

std::vector<std::unique_ptr<Generation>> Generation::group(std::shared_ptr<const ServedModel> model,
                                                           std::vector<runtime::Request> reqs, const Options& opt) {
  std::vector<std::unique_ptr<Generation>> gens;
  std::vector<runtime::Callbacks> cbs;
  for (const runtime::Request& r : reqs) {
    check_prompt(*model, r, opt);
    gens.push_back(std::unique_ptr<Generation>(new Generation(model, opt)));
    cbs.push_back(gens.back()->callbacks());
  }
  std::vector<uint64_t> ids;
  submit_or_throw(opt.prompt_param, [&] { ids = model->engine->submit_group(std::move(reqs), std::move(cbs)); });
  for (size_t i = 0; i < gens.size(); ++i) gens[i]->id_ = ids[i];
  return gens;
}

Generation::~Generation() {
  if (!done_ && id_ != 0) {
    model_->engine->cancel(id_);
    finish_reason_ = "cancelled";  // left before the end: the client went away, or the handler failed
    report_end();
  }
}

void Generation::report_end() {
  if (reported_ || id_ == 0) return;
  reported_ = true;
  try {
    if (model_->metrics) model_->metrics->observe({finish_reason_, done_, stats_});
    if (record_)
      record_->add_generation(done_ ? stats_.prompt_tokens : 0, stats_.cached_tokens, completion_tokens_,
                              stats_.prompt_ms, stats_.generation_ms, stats_.queue_ms, finish_reason_, error_);
    if (record_ && done_ && stats_.drafted > 0) record_->add_draft(stats_.decode_steps, stats_.drafted, stats_.accepted);
  } catch (const std::exception&) {  // reporting never fails a generation (or a destructor)
  }
}

void Generation::cancel() {
  if (done_ || cancel_requested_) return;
  cancel_requested_ = true;
  stopped_ = true;
  model_->engine->cancel(id_);
  finish_reason_ = "cancelled";  // the client is gone: report now, the response's log line follows at once
  report_end();
}

void Generation::stop_early(const std::string& reason, size_t unused_tokens) {
  if (stopped_) return;
  stopped_ = true;
  early_reason_ = reason;
  completion_tokens_ -= std::min<int64_t>((int64_t)unused_tokens, completion_tokens_);
  if (done_) {
    if ((finish_reason_ == "stop" || finish_reason_ == "length") && reason != finish_reason_) {
      // Already reported at the end: the end turned out to be this reason (a tool call completed by the tail).
      if (reported_ && model_->metrics) model_->metrics->reclassify(finish_reason_, reason);
      if (reported_ && record_) record_->reclassify(finish_reason_, reason);
      finish_reason_ = reason;
    }
    return;
  }
  model_->engine->cancel(id_);
}

std::string Generation::Step::text() const {
  std::string t;
  for (const auto& p : pieces) t += p;
  return t + tail;
}

void Generation::finish_text(Step& step) {
  if (stopped_) return;
  std::string tail = decoder_.flush();
  text::StopMatcher::Result r = stop_.feed(tail);
  step.tail += r.text;
  if (r.stopped && include_stop_) step.tail += stop_.matched();
  if (r.stopped) {
    stopped_ = true;
    early_reason_ = "stop";
    return;
  }
  step.tail += stop_.flush();
}

Generation::Step Generation::next(std::chrono::milliseconds wait) {
  Step step;
  if (done_) {
    step.done = true;
    return step;
  }
  std::deque<runtime::TokenEvent> tokens;
  std::optional<runtime::DoneEvent> done;
  {
    std::unique_lock<std::mutex> lk(q_->mu);
    q_->cv.wait_for(lk, wait, [&] { return !q_->tokens.empty() || q_->done.has_value(); });
    tokens.swap(q_->tokens);
    if (q_->done) done = q_->done;  // taken together with every token before it
  }
  for (const runtime::TokenEvent& ev : tokens) {
    if (stopped_) break;
    ++completion_tokens_;
    step.tokens.push_back(ev);
    const bool silent = skip_special_ && model_->silent_token[(size_t)ev.token];
    text::StopMatcher::Result r = stop_.feed(silent ? std::string() : decoder_.push(ev.token));
    if (r.stopped && include_stop_) r.text += stop_.matched();
    step.pieces.push_back(std::move(r.text));
    if (r.stopped) {
      stopped_ = true;
      early_reason_ = "stop";
      model_->engine->cancel(id_);
    }
  }
  if (!done) return step;
  stats_ = *done;
  done_ = true;
  step.done = true;
  if (done->reason == runtime::Finish::error) {
    finish_reason_ = "error";
    error_ = done->error;
  } else if (!early_reason_.empty()) {
    finish_reason_ = early_reason_;  // our own stop (stop string, one tool call) wins over the engine's
  } else if (cancel_requested_ || done->reason == runtime::Finish::cancelled) {
    finish_reason_ = "cancelled";
  } else {
    finish_text(step);
    finish_reason_ = !early_reason_.empty() ? early_reason_ : done->reason == runtime::Finish::length ? "length" : "stop";
  }
  report_end();
  return step;
}

nlohmann::json Generation::usage(int64_t reasoning_tokens) const {
  nlohmann::json u = {{"prompt_tokens", stats_.prompt_tokens},
                      {"completion_tokens", completion_tokens_},
                      {"total_tokens", stats_.prompt_tokens + completion_tokens_},
                      {"prompt_tokens_details", {{"cached_tokens", stats_.cached_tokens}}}};
  if (reasoning_tokens >= 0) u["completion_tokens_details"] = {{"reasoning_tokens", reasoning_tokens}};
  return u;
}

nlohmann::json Generation::timings() const {
  const int64_t prompt_n = stats_.prompt_tokens - stats_.cached_tokens;
  const int64_t gen_n = stats_.generated_tokens;
  auto per_token = [](double ms, int64_t n) { return n > 0 ? ms / (double)n : 0.0; };
  auto per_second = [](double ms, int64_t n) { return ms > 0 ? 1000.0 * (double)n / ms : 0.0; };
  return {{"cache_n", stats_.cached_tokens},
          {"prompt_n", prompt_n},
          {"prompt_ms", stats_.prompt_ms},
          {"prompt_per_token_ms", per_token(stats_.prompt_ms, prompt_n)},
          {"prompt_per_second", per_second(stats_.prompt_ms, prompt_n)},
          {"predicted_n", gen_n},
          {"predicted_ms", stats_.generation_ms},
          {"predicted_per_token_ms", per_token(stats_.generation_ms, gen_n)},
          {"predicted_per_second", per_second(stats_.generation_ms, gen_n)}};
}

ApiError Generation::failure() const {
  if (finish_reason_ == "error") return ApiError(ErrorKind::internal, "generation failed: " + error_);
  return ApiError(ErrorKind::unavailable, "the server is shutting down; the generation was cancelled");
}

}  // namespace qrig::server
