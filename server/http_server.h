// The OpenAI-compatible HTTP server (`qrig serve`): routes, API-key check, limits, error responses from the
// one error table, request log, metrics, and graceful draining, over the connection layer of
// server/connection_server.h. It listens before the model is loaded (GET /health answers 503 until
// set_model) and drives the runtime only through runtime::Engine.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/served_model.h"

namespace qrig::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                         // 0: any free port (bind() returns it)
  std::string api_key;                     // empty: no authentication; several keys: a comma-separated list
  std::string api_key_file;                // more keys, one per line (# comments); unreadable or empty: an error
  size_t max_body_bytes = 16u << 20;       // larger request bodies -> 413
  int timeout_s = 600;                     // writing a response / reading a whole body
  int head_timeout_s = 10;                 // a request head must arrive within this; longest gap in a body
  int http_threads = 0;                    // request threads; 0: slots + max_queue + 8, in [16, kMaxHttpThreads]
  int max_connections = 1024;              // open connections at most
  int64_t max_queue = 64;                  // only used for the http_threads default
  int64_t slots = 4;                       // idem
  bool log_requests = true;                // one line per request on stderr (server/request_log.h)
  bool ignore_unsupported_fields = false;  // fields that would change the output but are not implemented:
                                           // ignored and reported (X-Qrig-Ignored-Fields) instead of a 400
  bool metrics_public = false;             // GET /metrics answers without the API key
  std::string metrics_compat;              // also llama-server's / vLLM's metric names: "llamacpp", "vllm", both
};

constexpr int kMaxHttpThreads = 1024;
constexpr size_t kMaxHeaderBytes = 64 * 1024;
// The accepted API keys: api_key's list and api_key_file's lines. Throws std::runtime_error when the file
// cannot be read or holds no key.
std::vector<std::string> api_keys_of(const ServerOptions& opt);
// The request threads for these options (--threads-http, or its default).
int http_thread_count(const ServerOptions& opt);

class ConnectionServer;

struct Context;

class HttpServer {
 public:
  explicit HttpServer(ServerOptions opt);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (no SO_REUSEPORT: a port in use is an error). Returns the bound port; throws
  // std::runtime_error when it cannot bind.
  int bind();
  // Serves until drain() or stop() (blocking; call it on its own thread). Returns when every connection is
  // closed and every request thread has finished; at once when stop() came first.
  void run();

  // The model is loaded: /health turns 200 and the API answers.
  void set_model(std::shared_ptr<ServedModel> model);
  std::shared_ptr<const ServedModel> model() const;

  // Graceful: new requests get 503 (and Connection: close), the listening socket stops accepting, requests
  // in flight run to their end, idle keep-alive connections still answer (503) for a second and then close;
  // run() returns once every connection has closed. Safe from any thread, repeatedly.
  void drain();
  // Cancels every generation in flight (their streams end with an error event, non-streamed requests get
  // 503) and stops accepting. Used when draining takes too long.
  void cancel_all();
  // Immediate stop: every connection is closed (in-flight streams are cut). Safe before run() too.
  void stop();

  int open_connections() const;
  int http_threads_started() const;

 private:
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<ConnectionServer> conn_;
};

}  // namespace qrig::server
