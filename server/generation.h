// One generation as the HTTP handlers see it: submits a runtime::Request to the engine, receives the
// engine's callbacks (engine thread) through a per-request queue, and turns tokens into output text on the
// HTTP thread: UTF-8-safe incremental decoding, stop strings (held back until they cannot match), the
// finish reason and the usage/timing numbers. Destroying it cancels what is still running, so a handler
// that leaves early (client gone, exception) never leaves work behind in the engine.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/errors.h"
#include "server/request_log.h"
#include "server/served_model.h"
#include "text/stop.h"

namespace qrig::server {

class Generation {
 public:
  struct Options {
    std::vector<std::string> stop;
    std::string prompt_param = "messages";  // the field blamed when the prompt does not fit
    bool skip_special = true;  // control tokens (<|im_start|>, vision markers...) add no text, like vLLM
    bool include_stop = false;  // a matched stop string stays in the text (vLLM include_stop_str_in_output)
  };
  // Submits the request. Throws ApiError: context_overflow (with n_prompt_tokens / n_ctx), queue_full,
  // unavailable (engine shutting down), invalid_request (empty prompt, token id out of range, sampling
  // parameters the sampler refuses).
  Generation(std::shared_ptr<const ServedModel> model, runtime::Request req, Options opt);
  // Samples of one prompt (OpenAI n): one prefill, through Engine::submit_group. Throws as the constructor.
  static std::vector<std::unique_ptr<Generation>> group(std::shared_ptr<const ServedModel> model,
                                                        std::vector<runtime::Request> reqs, const Options& opt);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  struct Step {
    std::vector<runtime::TokenEvent> tokens;  // the generated tokens consumed in this step, in order
    std::vector<std::string> pieces;          // the output text each token released (valid UTF-8, stop
                                              // strings removed; often "" while text is held back)
    std::string tail;                         // text released at the end (held-back bytes), when done
    bool done = false;                        // the generation has finished (finish_reason() is set)
    std::string text() const;                 // pieces + tail
  };
  // Waits up to `wait` for tokens or the end; returns what arrived (possibly nothing). Once done, returns
  // an empty step with done = true.
  Step next(std::chrono::milliseconds wait);

  // Stops generating. cancel(): the client is gone (finish reason "cancelled"). stop_early(reason): the
  // output is complete for the caller's purpose (e.g. "tool_calls" after the one allowed call). Tokens the
  // engine produces afterwards are dropped. Safe to call repeatedly.
  // unused_tokens: tokens of the last step that come after the point where the output ended (not counted
  // in completion_tokens).
  void cancel();
  void stop_early(const std::string& reason, size_t unused_tokens = 0);

  bool done() const { return done_; }
  // "stop", "length", "cancelled" (client gone or server shutting down), "error", or stop_early's reason.
  const std::string& finish_reason() const { return finish_reason_; }
  // The stop string that ended the output ("" if none did).
  const std::string& stop_string() const { return stop_.matched(); }
  const std::string& error() const { return error_; }
  // The engine cancelled the request on its own (server shutdown), not this object.
  bool cancelled_by_engine() const { return done_ && finish_reason_ == "cancelled" && !cancel_requested_; }

  int64_t prompt_tokens() const { return stats_.prompt_tokens; }
  int64_t cached_tokens() const { return stats_.cached_tokens; }
  int64_t completion_tokens() const { return completion_tokens_; }
  // OpenAI `usage` (prompt_tokens_details.cached_tokens; completion_tokens_details.reasoning_tokens when
  // reasoning_tokens >= 0) and llama.cpp-style `timings`.
  nlohmann::json usage(int64_t reasoning_tokens = -1) const;
  nlohmann::json timings() const;
  // The API error for a generation that ended in "error" (500) or was cancelled by the engine (503).
  ApiError failure() const;

 private:
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<runtime::TokenEvent> tokens;
    std::optional<runtime::DoneEvent> done;
  };
  void finish_text(Step& step);
  Generation(std::shared_ptr<const ServedModel> model, Options opt);  // not submitted yet
  static void check_prompt(const ServedModel& model, const runtime::Request& req, const Options& opt);
  runtime::Callbacks callbacks() const;
  // Tells the metrics and the request's log record how it ended (once: when done, or when destroyed before).
  void report_end();

  std::shared_ptr<const ServedModel> model_;
  std::shared_ptr<Queue> q_;
  uint64_t id_ = 0;
  text::StreamDecoder decoder_;
  text::StopMatcher stop_;
  bool skip_special_;
  bool include_stop_;
  bool stopped_ = false;            // stop string matched or stop_early: later tokens are dropped
  bool cancel_requested_ = false;
  bool done_ = false;
  std::string finish_reason_, early_reason_, error_;
  int64_t completion_tokens_ = 0;
  runtime::DoneEvent stats_;
  std::shared_ptr<RequestRecord> record_;  // the HTTP request this generation belongs to (may be null)
  bool reported_ = false;
};

// Random identifiers for responses ("chatcmpl-" + 24 alphanumerics...).
std::string random_id(const std::string& prefix, size_t n = 24);
int64_t unix_now();

// Token text and raw bytes for logprobs (text is the token's bytes with invalid UTF-8 replaced).
std::string token_text(const text::Tokenizer& tok, int32_t id);
nlohmann::json token_bytes(const text::Tokenizer& tok, int32_t id);

}  // namespace qrig::server
