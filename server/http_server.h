// The OpenAI-compatible HTTP server (`qrig serve`): routes, API-key check, limits, error responses from the
// one error table, request log, metrics, and graceful draining. It listens before the model is loaded
// (GET /health answers 503 until set_model) and drives the runtime only through runtime::Engine.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "server/served_model.h"

namespace httplib {
class Server;
}

namespace qrig::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                         // 0: any free port (bind() returns it)
  std::string api_key;                     // empty: no authentication
  size_t max_body_bytes = 16u << 20;       // larger request bodies -> 413
  int timeout_s = 600;                     // socket read/write timeout
  int http_threads = 0;                    // connection threads; 0: slots + max_queue + 8 (at least 16)
  int64_t max_queue = 64;                  // only used for the http_threads default
  int64_t slots = 4;                       // idem
  bool log_requests = true;                // one line per request on stderr
};

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
  // Serves until drain() or stop() (blocking; call it on its own thread). Returns when every connection
  // thread has finished.
  void run();

  // The model is loaded: /health turns 200 and the API answers.
  void set_model(std::shared_ptr<ServedModel> model);
  std::shared_ptr<const ServedModel> model() const;

  // Graceful: new requests get 503 (and Connection: close), the listening socket stops accepting, requests
  // in flight run to their end; run() returns once they have. Safe from any thread, repeatedly.
  void drain();
  // Cancels every generation in flight (their streams end with an error event, non-streamed requests get
  // 503) and stops accepting. Used when draining takes too long.
  void cancel_all();
  // Immediate stop of the listener (in-flight streams are cut by the HTTP library).
  void stop();

 private:
  void setup_routes();
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<httplib::Server> svr_;
  std::atomic<int> listen_fd_{-1};
};

}  // namespace qrig::server
