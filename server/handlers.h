// Internal to server/: the state the route handlers share (options, the served model, metrics, the
// draining flag) and the handlers, one file per endpoint family.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/errors.h"
#include "server/http_server.h"
#include "server/metrics.h"

namespace qrig::server {

struct Context {
  ServerOptions opt;
  Metrics metrics;
  std::atomic<bool> draining{false};
  mutable std::mutex mu;
  std::shared_ptr<const ServedModel> model;  // null while loading

  std::shared_ptr<const ServedModel> get_model() const {
    std::lock_guard<std::mutex> lk(mu);
    return model;
  }
};

using ModelPtr = std::shared_ptr<const ServedModel>;

void send_json(httplib::Response& res, int status, const nlohmann::json& body);
void send_json(httplib::Response& res, int status, const nlohmann::ordered_json& body);
void send_error(httplib::Response& res, const ApiError& e);
// Fields of the request nobody reads: reported in the X-Qrig-Ignored-Fields header and logged.
void report_ignored(const httplib::Request& req, httplib::Response& res, const std::string& fields);

// How often a waiting handler looks at its client (and how late a disconnect is noticed at worst).
constexpr int kPollMs = 50;

void handle_chat_completions(Context& ctx, const ModelPtr& model, const httplib::Request& req, httplib::Response& res);
void handle_completions(Context& ctx, const ModelPtr& model, const httplib::Request& req, httplib::Response& res);
void handle_tokenize(Context& ctx, const ModelPtr& model, const httplib::Request& req, httplib::Response& res);
void handle_detokenize(Context& ctx, const ModelPtr& model, const httplib::Request& req, httplib::Response& res);

}  // namespace qrig::server
