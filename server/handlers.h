// Internal to server/: the state the route handlers share (options, the served model, metrics, the
// draining flag) and the handlers, one file per endpoint family.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/errors.h"
#include "server/http_message.h"
#include "server/http_server.h"
#include "server/metrics.h"

namespace qrig::server {

struct Context {
  ServerOptions opt;
  std::vector<std::string> api_keys;  // api_keys_of(opt): empty means no authentication
  std::shared_ptr<Metrics> metrics = std::make_shared<Metrics>();
  std::atomic<bool> draining{false};
  mutable std::mutex mu;
  std::shared_ptr<const ServedModel> model;  // null while loading

  std::shared_ptr<const ServedModel> get_model() const {
    std::lock_guard<std::mutex> lk(mu);
    return model;
  }
};

using ModelPtr = std::shared_ptr<const ServedModel>;

void send_json(Response& res, int status, const nlohmann::json& body);
void send_json(Response& res, int status, const nlohmann::ordered_json& body);
// anthropic: the error in Anthropic's shape (the Messages API routes).
void send_error(Response& res, const ApiError& e, bool anthropic = false);
// Fields of the request nobody reads: reported in the X-Qrig-Ignored-Fields header and logged (at most
// about 1 KiB of names, escaped, then how many more).
void report_ignored(const Request& req, Response& res, const std::string& fields);
// Text safe for one log line or header value: bytes outside printable ASCII (newlines, escapes, NUL,
// non-ASCII) as \xHH, backslash doubled; cut after max_bytes ("...").
std::string log_escape(std::string_view s, size_t max_bytes);

// How often a waiting handler looks at its client (and how late a disconnect is noticed at worst).
constexpr int kPollMs = 50;

void handle_chat_completions(Context& ctx, const ModelPtr& model, const Request& req, Response& res);
void handle_completions(Context& ctx, const ModelPtr& model, const Request& req, Response& res);
void handle_messages(Context& ctx, const ModelPtr& model, const Request& req, Response& res);
void handle_count_tokens(Context& ctx, const ModelPtr& model, const Request& req, Response& res);
void handle_responses(Context& ctx, const ModelPtr& model, const Request& req, Response& res);
void handle_tokenize(Context& ctx, const ModelPtr& model, const Request& req, Response& res);
void handle_detokenize(Context& ctx, const ModelPtr& model, const Request& req, Response& res);

}  // namespace qrig::server
