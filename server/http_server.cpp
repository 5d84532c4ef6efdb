// HttpServer: the application on top of the connection layer (server/connection_server.h): routes, the API
// key (checked before routes are matched, so a client without the key learns nothing, not even which routes
// exist), CORS, error objects for the connection layer's own failures, the request log (escaped: nothing a
// client sends can forge a log line; server/request_log.h) and per-route metrics, and draining for graceful
// shutdown.
#include "server/http_server.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

#include "server/connection_server.h"
#include "server/handlers.h"
#include "server/request_log.h"
#include "server/sse.h"

namespace qrig::server {

using nlohmann::json;

void send_json(Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(json_text(body), "application/json");
}

void send_json(Response& res, int status, const nlohmann::ordered_json& body) {
  res.status = status;
  res.set_content(json_text(body), "application/json");
}

// The Messages API routes answer errors in Anthropic's shape.
bool is_anthropic_route(const std::string& path) { return path == "/v1/messages" || path == "/v1/messages/count_tokens"; }

void send_error(Response& res, const ApiError& e, bool anthropic) {
  send_json(res, error_spec(e.kind).status, anthropic ? anthropic_error_body(e) : error_body(e));
  if (e.kind == ErrorKind::queue_full) res.set_header("Retry-After", "1");
  if (e.kind == ErrorKind::authentication) res.set_header("WWW-Authenticate", "Bearer");
}

std::string log_escape(std::string_view s, size_t max_bytes) {
  std::string o;
  for (unsigned char c : s) {
    if (o.size() >= max_bytes) {
      o += "...";
      break;
    }
    if (c == '\\') o += "\\\\";
    else if (c >= 0x20 && c < 0x7f) o += (char)c;
    else o += fmt::format("\\x{:02x}", c);
  }
  return o;
}

void report_ignored(const Request& req, Response& res, const std::string& fields) {
  if (fields.empty()) return;
  // Bounded and escaped: a request with 100,000 unknown keys gets a short header, and key names cannot
  // break the header or the log line.
  constexpr size_t kMaxShown = 1024;
  std::string shown;
  size_t names = 1, shown_names = 0;
  for (char c : fields) names += c == ',';
  size_t start = 0;
  while (start <= fields.size()) {
    size_t end = fields.find(',', start);
    if (end == std::string::npos) end = fields.size();
    std::string name = log_escape(std::string_view(fields).substr(start, end - start), 256);
    if (shown.size() + name.size() + 1 > kMaxShown) break;
    if (!shown.empty()) shown += ",";
    shown += name;
    ++shown_names;
    start = end + 1;
  }
  if (shown_names < names) shown += fmt::format(",... ({} more)", names - shown_names);
  res.set_header("X-Qrig-Ignored-Fields", shown);
  fmt::print(stderr, "qrig serve: {} {}: ignored unknown request fields: {}\n", log_escape(req.method, 32),
             log_escape(req.path, 512), shown);
}

namespace {

const char* const kPostRoutes[] = {"/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions",
                                   "/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/responses",
                                   "/tokenize", "/detokenize"};
const char* const kGetRoutes[] = {"/health", "/v1/health", "/metrics", "/v1/models", "/models"};

bool is_route(const std::string& path, bool post) {
  if (post) return std::any_of(std::begin(kPostRoutes), std::end(kPostRoutes), [&](const char* r) { return path == r; });
  return std::any_of(std::begin(kGetRoutes), std::end(kGetRoutes), [&](const char* r) { return path == r; }) ||
         (path.rfind("/v1/models/", 0) == 0 && path.size() > 11);
}

bool is_health(const std::string& path) { return path == "/health" || path == "/v1/health"; }

// Bounded label set for the metrics: the route, or "other".
std::string route_label(const std::string& path) {
  if (is_route(path, true) || is_route(path, false))
    return path.rfind("/v1/models/", 0) == 0 ? std::string("/v1/models/{id}") : path;
  return "other";
}

// Constant time in the key's length: no early exit on the first differing byte.
bool same_key(const std::string& key, const std::string& given) {
  unsigned diff = given.size() != key.size();
  for (size_t i = 0; i < key.size(); ++i) diff |= (unsigned char)key[i] ^ (unsigned char)(i < given.size() ? given[i] : 0);
  return diff == 0;
}

// The key from "Authorization: Bearer KEY" or (Anthropic's clients) "x-api-key: KEY", one of `keys`.
bool authorized(const std::vector<std::string>& keys, const Request& req) {
  std::string h = req.header("Authorization");
  std::string given;
  if (h.size() >= 7 && std::equal(h.begin(), h.begin() + 7, "bearer ", [](char a, char b) { return std::tolower((unsigned char)a) == b; })) {
    given = h.substr(7);
    while (!given.empty() && given.front() == ' ') given.erase(given.begin());
  } else if (req.has_header("x-api-key")) {
    given = req.header("x-api-key");
  } else {
    return false;
  }
  bool ok = false;
  for (const std::string& k : keys) ok |= same_key(k, given);  // every key compared: no timing hint which matched
  return ok;
}

// The request headers the OpenAI and Anthropic SDKs send from a browser. A preflight that asks for more
// (the SDKs add x-stainless-* headers over time) gets the names it asked for too, when they are plain header
// tokens: the server reads none of them, so allowing them exposes nothing.
constexpr const char* kCorsHeaders =
    "Authorization, Content-Type, X-Api-Key, Anthropic-Version, Anthropic-Beta, "
    "Anthropic-Dangerous-Direct-Browser-Access, OpenAI-Organization, OpenAI-Project, OpenAI-Beta, Idempotency-Key, "
    "X-Stainless-Arch, X-Stainless-Lang, X-Stainless-OS, X-Stainless-Package-Version, X-Stainless-Retry-Count, "
    "X-Stainless-Runtime, X-Stainless-Runtime-Version, X-Stainless-Timeout, X-Stainless-Helper-Method";

bool header_token_list(const std::string& s) {
  if (s.empty() || s.size() > 2048) return false;
  for (unsigned char c : s)
    if (!(std::isalnum(c) || c == '-' || c == '_' || c == ',' || c == ' ')) return false;
  return true;
}

void cors_preflight(const Request& req, Response& res) {
  res.status = 204;
  res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
  std::string allowed = kCorsHeaders;
  const std::string asked = req.header("Access-Control-Request-Headers");
  if (header_token_list(asked)) allowed += ", " + asked;
  res.set_header("Access-Control-Allow-Headers", allowed);
  res.set_header("Access-Control-Max-Age", "86400");
}

// Checks on the request head, before its body is read: draining, CORS preflight, the API key, the route and
// the method. True when it answered.
bool check_head(Context& ctx, const Request& req, Response& res) {
  if (ctx.draining) {
    res.set_header("Connection", "close");
    send_error(res, ApiError(ErrorKind::unavailable, "the server is shutting down"));
    return true;
  }
  if (req.method == "OPTIONS") {
    cors_preflight(req, res);
    return true;
  }
  const bool post_route = is_route(req.path, true), get_route = is_route(req.path, false);
  const bool public_route = get_route && (is_health(req.path) || (ctx.opt.metrics_public && req.path == "/metrics"));
  if (!ctx.api_keys.empty() && !public_route && !authorized(ctx.api_keys, req)) {
    send_error(res, ApiError(ErrorKind::authentication, req.has_header("Authorization") || req.has_header("x-api-key")
                                                            ? "invalid API key"
                                                            : "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"),
               is_anthropic_route(req.path));
    return true;
  }
  if (!post_route && !get_route) {
    send_error(res, ApiError(ErrorKind::not_found, fmt::format("no route for {} {}", req.method, req.path)));
    return true;
  }
  const bool get_like = req.method == "GET" || req.method == "HEAD";
  if ((post_route && req.method != "POST") || (get_route && !get_like)) {
    send_error(res, ApiError(ErrorKind::method_not_allowed, fmt::format("{} does not accept {}", req.path, req.method)),
               is_anthropic_route(req.path));
    res.set_header("Allow", post_route ? "POST, OPTIONS" : "GET, OPTIONS");
    return true;
  }
  return false;
}

using Handler = void (*)(Context&, const ModelPtr&, const Request&, Response&);

// An API route: draining -> 503, loading -> 503, then the handler; errors it throws become error responses.
void run_api(Context& ctx, Handler h, const Request& req, Response& res) {
  try {
    if (ctx.draining) {
      res.set_header("Connection", "close");
      throw ApiError(ErrorKind::unavailable, "the server is shutting down");
    }
    ModelPtr model = ctx.get_model();
    if (!model) throw ApiError(ErrorKind::unavailable, "the model is loading");
    h(ctx, model, req, res);
  } catch (const ApiError& e) {
    res = Response{};
    send_error(res, e, is_anthropic_route(req.path));
  } catch (const std::exception& e) {
    res = Response{};
    send_error(res, ApiError(ErrorKind::internal, std::string("internal error: ") + e.what()), is_anthropic_route(req.path));
  }
}

void handle_models(Context&, const ModelPtr& m, const Request& req, Response& res) {
  json entry = {{"id", m->id},
                {"object", "model"},
                {"created", m->created},
                {"owned_by", "qrig"},
                {"meta", {{"n_ctx", m->engine->context_length()},
                          {"n_vocab", m->tokenizer->n_real()},
                          {"slots", m->engine->slots()},
                          {"path", m->path}}}};
  if (req.path.rfind("/v1/models/", 0) == 0) {
    const std::string id = req.path.substr(11);
    if (id != m->id) throw ApiError(ErrorKind::not_found, fmt::format("the model '{}' does not exist", id), "model");
    send_json(res, 200, entry);
    return;
  }
  send_json(res, 200, json{{"object", "list"}, {"data", json::array({entry})}});
}

// Public (no key): load balancers and the tests poll it. 503 while loading or shutting down.
void handle_health(Context& ctx, Response& res) {
  ModelPtr m = ctx.get_model();
  if (ctx.draining) return send_error(res, ApiError(ErrorKind::unavailable, "the server is shutting down"));
  if (!m) return send_error(res, ApiError(ErrorKind::unavailable, "the model is loading"));
  runtime::EngineStats st = m->engine->stats();
  send_json(res, 200, json{{"status", "ok"},
                           {"slots_idle", m->engine->slots() - st.running},
                           {"slots_processing", st.running},
                           {"requests_queued", st.queued}});
}

void route(Context& ctx, const Request& req, Response& res) {
  const std::string& p = req.path;
  if (p == "/v1/chat/completions" || p == "/chat/completions") return run_api(ctx, handle_chat_completions, req, res);
  if (p == "/v1/completions" || p == "/completions") return run_api(ctx, handle_completions, req, res);
  if (p == "/v1/messages") return run_api(ctx, handle_messages, req, res);
  if (p == "/v1/messages/count_tokens") return run_api(ctx, handle_count_tokens, req, res);
  if (p == "/v1/responses" || p == "/responses") return run_api(ctx, handle_responses, req, res);
  if (p == "/tokenize") return run_api(ctx, handle_tokenize, req, res);
  if (p == "/detokenize") return run_api(ctx, handle_detokenize, req, res);
  if (p == "/v1/models" || p == "/models" || p.rfind("/v1/models/", 0) == 0) return run_api(ctx, handle_models, req, res);
  if (is_health(p)) return handle_health(ctx, res);
  if (p == "/metrics") {
    ModelPtr m = ctx.get_model();
    res.set_content(ctx.metrics->render(m ? m->engine.get() : nullptr, m ? m->id : "", m != nullptr),
                    "text/plain; version=0.0.4");
    return;
  }
  send_error(res, ApiError(ErrorKind::not_found, fmt::format("no route for {} {}", req.method, req.path)));
}

}  // namespace

std::vector<std::string> api_keys_of(const ServerOptions& o) {
  std::vector<std::string> keys;
  auto add = [&](std::string k) {
    while (!k.empty() && std::isspace((unsigned char)k.back())) k.pop_back();
    while (!k.empty() && std::isspace((unsigned char)k.front())) k.erase(k.begin());
    if (!k.empty()) keys.push_back(std::move(k));
  };
  size_t start = 0;
  while (start <= o.api_key.size() && !o.api_key.empty()) {
    size_t comma = o.api_key.find(',', start);
    if (comma == std::string::npos) comma = o.api_key.size();
    add(o.api_key.substr(start, comma - start));
    start = comma + 1;
  }
  if (!o.api_key_file.empty()) {
    std::ifstream in(o.api_key_file);
    if (!in) throw std::runtime_error(fmt::format("cannot read the API key file '{}'", o.api_key_file));
    const size_t before = keys.size();
    for (std::string line; std::getline(in, line);)
      if (line.find_first_not_of(" \t\r") != std::string::npos && line[line.find_first_not_of(" \t\r")] != '#') add(line);
    if (keys.size() == before) throw std::runtime_error(fmt::format("the API key file '{}' holds no key", o.api_key_file));
  }
  return keys;
}

int http_thread_count(const ServerOptions& o) {
  if (o.http_threads > 0) return std::min(o.http_threads, kMaxHttpThreads);
  return (int)std::clamp<int64_t>(o.slots + o.max_queue + 8, 16, kMaxHttpThreads);
}

HttpServer::HttpServer(ServerOptions opt) : ctx_(std::make_unique<Context>()) {
  ctx_->opt = std::move(opt);
  const ServerOptions& o = ctx_->opt;
  ctx_->api_keys = api_keys_of(o);
  ctx_->metrics->set_compat(o.metrics_compat);
  ConnectionLimits lim;
  lim.head_timeout_ms = (int64_t)o.head_timeout_s * 1000;
  lim.io_timeout_ms = (int64_t)o.timeout_s * 1000;
  lim.max_body = o.max_body_bytes;
  lim.max_header_bytes = kMaxHeaderBytes;
  lim.max_connections = o.max_connections;
  lim.workers = http_thread_count(o);
  lim.default_headers = {{"Server", "qrig"}, {"Access-Control-Allow-Origin", "*"}};

  Context& ctx = *ctx_;
  ConnectionServer::Handlers h;
  h.early = [&ctx](const Request& req, Response& res) {
    if (!check_head(ctx, req, res)) return false;
    res.set_header("X-Request-Id", request_id(req));
    return true;
  };
  h.on_worker = [](const Request& req) { return is_route(req.path, true); };
  h.handle = [&ctx](Request& req, Response& res) {
    // The generations the handler runs report into this request's record (server/request_log.h).
    auto record = std::make_shared<RequestRecord>();
    {
      RequestScope scope(record);
      route(ctx, req, res);
    }
    res.record = std::move(record);
    res.set_header("X-Request-Id", request_id(req));
  };
  h.error = [](int status, const std::string& message, Response& res) {
    send_error(res, ApiError(kind_for_status(status), message));
    res.status = status;
  };
  h.log = [&ctx](const Request& req, const Response& res, double ms, bool complete) {
    ctx.metrics->count_request(route_label(req.path), res.status);
    if (!ctx.opt.log_requests) return;
    Delivery d;
    d.ms = ms;
    d.complete = complete && res.status != 499;
    d.client_gone = res.status == 499 || (!complete && !req.client_alive());
    const std::string line = request_log_line(req, res, res.record.get(), d);
    std::fputs(line.c_str(), stderr);
  };
  conn_ = std::make_unique<ConnectionServer>(std::move(lim), std::move(h));
}

HttpServer::~HttpServer() { conn_.reset(); }

int HttpServer::bind() { return conn_->bind(ctx_->opt.host, ctx_->opt.port); }

void HttpServer::run() { conn_->run(); }

void HttpServer::set_model(std::shared_ptr<ServedModel> model) {
  if (model) model->metrics = ctx_->metrics;
  std::lock_guard<std::mutex> lk(ctx_->mu);
  ctx_->model = std::move(model);
}

std::shared_ptr<const ServedModel> HttpServer::model() const { return ctx_->get_model(); }

void HttpServer::drain() {
  ctx_->draining = true;
  conn_->drain();
}

void HttpServer::cancel_all() {
  drain();
  if (auto m = ctx_->get_model()) m->engine->shutdown(false);
}

void HttpServer::stop() { conn_->stop(); }

int HttpServer::open_connections() const { return conn_->open_connections(); }

int HttpServer::http_threads_started() const { return conn_->worker_threads(); }

}  // namespace qrig::server
