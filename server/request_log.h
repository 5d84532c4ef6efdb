// The request log of `qrig serve`: one line per HTTP request on stderr, with the time, the request id (the
// client's X-Request-Id when it is a plain token, else a fresh one; sent back in the X-Request-Id header), the
// client, method, path, status and duration, and for requests that generated: prompt / cached / generated
// tokens, speeds and the finish reason; the error message of a 4xx/5xx or of a stream that ended in an error;
// "client disconnected" when the client left before the whole response. Everything a client sent is escaped,
// so nothing it sends can forge or break a line.
//
// The generations a handler runs report into the record of the request being handled: the HTTP layer makes it
// current on the handler's thread (RequestScope) and server::Generation picks it up when it is created.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace qrig::server {

struct Request;
struct Response;

struct RequestRecord {
  // Called by each generation when it ends (any thread).
  void add_generation(int64_t prompt, int64_t cached, int64_t generated, double prompt_ms, double generation_ms,
                      double queue_ms, const std::string& finish_reason, const std::string& error);

  // Speculative decoding of a generation (runtime::DoneEvent's decode_steps, drafted, accepted).
  void add_draft(int64_t steps, int64_t drafted, int64_t accepted);

  // A generation that reported `from` ended as `to` after all.
  void reclassify(const std::string& from, const std::string& to);

  mutable std::mutex mu;
  int generations = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  double prompt_ms = 0, generation_ms = 0, queue_ms = 0;  // the longest of its generations
  std::vector<std::string> finish_reasons;  // per generation, in the order they ended
  std::string error;          // the first generation error
  int64_t decode_steps = 0, drafted = 0, accepted = 0;  // summed over its generations
};

// Makes `record` the one Generation objects created on this thread report into, for the scope's lifetime.
class RequestScope {
 public:
  explicit RequestScope(std::shared_ptr<RequestRecord> record);
  ~RequestScope();
  RequestScope(const RequestScope&) = delete;
  RequestScope& operator=(const RequestScope&) = delete;
  static std::shared_ptr<RequestRecord> current();

 private:
  std::shared_ptr<RequestRecord> previous_;
};

// The id of a request: its X-Request-Id header when that is 1..128 characters of [A-Za-z0-9._:-], else a new
// random "req-..." id.
std::string request_id(const Request& req);

// How the response ended, as the connection layer saw it.
struct Delivery {
  double ms = 0;           // from the first byte of the request to the end of the response
  bool complete = true;    // the whole response reached the socket
  bool client_gone = false;  // the client had closed its connection (status 499, or a write that failed)
};

// The log line (with its newline) for a request answered with `res`; `record` may be null.
std::string request_log_line(const Request& req, const Response& res, const RequestRecord* record, const Delivery& d);

}  // namespace qrig::server
