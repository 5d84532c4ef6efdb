// HttpServer: cpp-httplib setup (limits, timeouts, connection threads), routes, API key, CORS, the request
// log and per-route metrics, httplib's own failures (404, 413, bad request lines) as OpenAI error objects,
// and draining for graceful shutdown.
#include "server/http_server.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <fmt/format.h>
#include <sys/socket.h>

#include "server/handlers.h"
#include "server/sse.h"
#include "server/transport.h"

namespace qrig::server {

using nlohmann::json;

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(json_text(body), "application/json");
}

void send_json(httplib::Response& res, int status, const nlohmann::ordered_json& body) {
  res.status = status;
  res.set_content(json_text(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, error_spec(e.kind).status, error_body(e));
  if (e.kind == ErrorKind::queue_full) res.set_header("Retry-After", "1");
  if (e.kind == ErrorKind::authentication) res.set_header("WWW-Authenticate", "Bearer");
}

void report_ignored(const httplib::Request& req, httplib::Response& res, const std::string& fields) {
  if (fields.empty()) return;
  res.set_header("X-Qrig-Ignored-Fields", fields);
  fmt::print(stderr, "qrig serve: {} {}: ignored unknown request fields: {}\n", req.method, req.path, fields);
}

namespace {

const char* const kPostRoutes[] = {"/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions",
                                   "/tokenize", "/detokenize"};
const char* const kGetRoutes[] = {"/health", "/v1/health", "/metrics", "/v1/models", "/models"};

bool is_route(const std::string& path, bool post) {
  if (post) return std::any_of(std::begin(kPostRoutes), std::end(kPostRoutes), [&](const char* r) { return path == r; });
  return std::any_of(std::begin(kGetRoutes), std::end(kGetRoutes), [&](const char* r) { return path == r; }) ||
         path.rfind("/v1/models/", 0) == 0;
}

// Bounded label set for the metrics: the route, or "other".
std::string route_label(const std::string& path) {
  if (is_route(path, true) || is_route(path, false))
    return path.rfind("/v1/models/", 0) == 0 ? std::string("/v1/models/{id}") : path;
  return "other";
}

thread_local std::chrono::steady_clock::time_point t_start;
thread_local bool t_started = false;

bool authorized(const std::string& key, const httplib::Request& req) {
  std::string h = req.get_header_value("Authorization");
  if (h.size() < 7 || !std::equal(h.begin(), h.begin() + 7, "bearer ", [](char a, char b) { return std::tolower((unsigned char)a) == b; }))
    return false;
  std::string given = h.substr(7);
  while (!given.empty() && given.front() == ' ') given.erase(given.begin());
  // Constant time in the key's length: no early exit on the first differing byte.
  unsigned diff = given.size() != key.size();
  for (size_t i = 0; i < key.size(); ++i) diff |= (unsigned char)key[i] ^ (unsigned char)(i < given.size() ? given[i] : 0);
  return diff == 0;
}

}  // namespace

HttpServer::HttpServer(ServerOptions opt) : ctx_(std::make_unique<Context>()) {
  ctx_->opt = std::move(opt);
  svr_ = std::make_unique<TransportServer>(ctx_->draining);
  const ServerOptions& o = ctx_->opt;
  size_t threads = o.http_threads > 0 ? (size_t)o.http_threads
                                      : (size_t)std::max<int64_t>(16, o.slots + o.max_queue + 8);
  svr_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr_->set_payload_max_length(o.max_body_bytes);
  svr_->set_read_timeout(o.timeout_s, 0);
  svr_->set_write_timeout(o.timeout_s, 0);
  svr_->set_keep_alive_max_count(1000);
  svr_->set_keep_alive_timeout(5);
  svr_->set_tcp_nodelay(true);
  svr_->set_default_headers({{"Server", "qrig"}, {"Access-Control-Allow-Origin", "*"}});
  setup_routes();
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  svr_->set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);  // restart quickly, but no SO_REUSEPORT
    listen_fd_ = sock;
  });
  const ServerOptions& o = ctx_->opt;
  int port = o.port;
  if (port == 0) {
    port = svr_->bind_to_any_port(o.host);
    if (port <= 0) throw std::runtime_error(fmt::format("cannot listen on {} (any port)", o.host));
  } else if (!svr_->bind_to_port(o.host, port)) {
    throw std::runtime_error(fmt::format("cannot listen on {}:{} (address in use, or not an address of this machine)",
                                         o.host, port));
  }
  return port;
}

void HttpServer::run() { svr_->listen_after_bind(); }

void HttpServer::set_model(std::shared_ptr<ServedModel> model) {
  std::lock_guard<std::mutex> lk(ctx_->mu);
  ctx_->model = std::move(model);
}

std::shared_ptr<const ServedModel> HttpServer::model() const { return ctx_->get_model(); }

void HttpServer::drain() {
  ctx_->draining = true;
  int fd = listen_fd_.exchange(-1);
  if (fd >= 0) ::shutdown(fd, SHUT_RDWR);  // accept() fails: httplib's loop ends, then joins its threads
}

void HttpServer::cancel_all() {
  drain();
  if (auto m = ctx_->get_model()) m->engine->shutdown(false);
}

void HttpServer::stop() {
  if (svr_) svr_->stop();
}

void HttpServer::setup_routes() {
  Context& ctx = *ctx_;
  httplib::Server& s = *svr_;

  s.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    t_start = std::chrono::steady_clock::now();
    t_started = true;
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_logger([&ctx](const httplib::Request& req, const httplib::Response& res) {
    double ms = t_started ? std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start).count() : 0;
    t_started = false;
    try {
      ctx.metrics.count_request(route_label(req.path), res.status);
      if (ctx.opt.log_requests)
        fmt::print(stderr, "qrig serve: {} {} {} {} {:.1f} ms\n", req.remote_addr, req.method, req.path, res.status, ms);
    } catch (...) {
    }
  });
  // Failures httplib produces itself (no route, body too large, unparsable request) get an error object;
  // responses our handlers already filled are left alone.
  s.set_error_handler(httplib::Server::HandlerWithResponse([&ctx](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.is_chunked_content_provider_) return httplib::Server::HandlerResponse::Unhandled;
    std::string message;
    ErrorKind kind = kind_for_status(res.status);
    if (res.status == 404 && (is_route(req.path, true) || is_route(req.path, false))) {
      kind = ErrorKind::method_not_allowed;
      res.set_header("Allow", is_route(req.path, true) ? "POST, OPTIONS" : "GET, OPTIONS");
      message = fmt::format("{} does not accept {}", req.path, req.method);
    } else if (res.status == 404) {
      message = fmt::format("no route for {} {}", req.method, req.path);
    } else if (res.status == 413) {
      message = fmt::format("the request body is larger than the server's limit of {} bytes (--max-body)",
                            ctx.opt.max_body_bytes);
    } else if (res.status == 499) {
      message = "the client closed the connection";
    } else if (res.status == 414) {
      message = "the request URI is longer than 8192 bytes";
    } else if (res.status == 400) {
      message = fmt::format("malformed HTTP request, or a header line over 8 KiB, or headers over {} KiB in all",
                            kMaxHeaderBytes / 1024);
    } else {
      message = fmt::format("the HTTP request could not be processed (status {})", res.status);
    }
    ApiError e(kind, message);
    res.status = error_spec(kind).status;
    res.set_content(json_text(error_body(e)), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(ErrorKind::internal, "internal error: " + what));
  });

  using Handler = void (*)(Context&, const ModelPtr&, const httplib::Request&, httplib::Response&);
  // Every API route: draining -> 503, API key -> 401, loading -> 503, then the handler; errors it throws
  // become error responses.
  auto api = [&ctx](Handler h) {
    return [&ctx, h](const httplib::Request& req, httplib::Response& res) {
      try {
        if (ctx.draining) {
          res.set_header("Connection", "close");
          throw ApiError(ErrorKind::unavailable, "the server is shutting down");
        }
        if (!ctx.opt.api_key.empty() && !authorized(ctx.opt.api_key, req))
          throw ApiError(ErrorKind::authentication,
                         req.has_header("Authorization") ? "invalid API key"
                                                         : "missing API key: send 'Authorization: Bearer <key>'");
        ModelPtr model = ctx.get_model();
        if (!model) throw ApiError(ErrorKind::unavailable, "the model is loading");
        h(ctx, model, req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const std::exception& e) {
        send_error(res, ApiError(ErrorKind::internal, std::string("internal error: ") + e.what()));
      }
    };
  };

  for (const char* path : {"/v1/chat/completions", "/chat/completions"}) s.Post(path, api(handle_chat_completions));
  for (const char* path : {"/v1/completions", "/completions"}) s.Post(path, api(handle_completions));
  s.Post("/tokenize", api(handle_tokenize));
  s.Post("/detokenize", api(handle_detokenize));

  auto models = [](Context&, const ModelPtr& m, const httplib::Request& req, httplib::Response& res) {
    json entry = {{"id", m->id},
                  {"object", "model"},
                  {"created", m->created},
                  {"owned_by", "qrig"},
                  {"meta", {{"n_ctx", m->engine->context_length()},
                            {"n_vocab", m->tokenizer->n_real()},
                            {"slots", m->engine->slots()},
                            {"path", m->path}}}};
    if (req.matches.size() > 1) {
      if (req.matches[1].str() != m->id)
        throw ApiError(ErrorKind::not_found, fmt::format("the model '{}' does not exist", req.matches[1].str()), "model");
      send_json(res, 200, entry);
      return;
    }
    send_json(res, 200, json{{"object", "list"}, {"data", json::array({entry})}});
  };
  s.Get("/v1/models", api(models));
  s.Get("/models", api(models));
  s.Get("/v1/models/(.+)", api(models));

  s.Get("/metrics", [&ctx](const httplib::Request& req, httplib::Response& res) {
    if (!ctx.opt.api_key.empty() && !authorized(ctx.opt.api_key, req))
      return send_error(res, ApiError(ErrorKind::authentication, "invalid or missing API key"));
    ModelPtr m = ctx.get_model();
    res.set_content(ctx.metrics.render(m ? m->engine.get() : nullptr, m != nullptr), "text/plain; version=0.0.4");
  });

  // Public (no key): load balancers and the tests poll it. 503 while loading or shutting down.
  auto health = [&ctx](const httplib::Request&, httplib::Response& res) {
    ModelPtr m = ctx.get_model();
    if (ctx.draining) return send_error(res, ApiError(ErrorKind::unavailable, "the server is shutting down"));
    if (!m) return send_error(res, ApiError(ErrorKind::unavailable, "the model is loading"));
    runtime::EngineStats st = m->engine->stats();
    send_json(res, 200, json{{"status", "ok"},
                             {"slots_idle", m->engine->slots() - st.running},
                             {"slots_processing", st.running},
                             {"requests_queued", st.queued}});
  };
  s.Get("/health", health);
  s.Get("/v1/health", health);

  // CORS preflight for browser clients.
  s.Options(".*", [](const httplib::Request&, httplib::Response& res) {
    res.status = 204;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
    res.set_header("Access-Control-Max-Age", "86400");
  });
}

}  // namespace qrig::server
