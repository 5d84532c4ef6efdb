// The request and response as the route handlers see them, independent of the connection layer
// (server/connection_server.h reads and writes them over the wire): a request whose head and body have been
// read and checked in full, and a response that is either a whole body or a stream of chunks produced by a
// pump function on the handler's thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace qrig::server {

struct RequestRecord;  // server/request_log.h

// Where a streamed response's bytes go. write() returns false once the client is gone (the stream must
// stop); done() ends the stream normally.
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  virtual bool write(const char* data, size_t size) = 0;
  virtual void done() = 0;
};

struct Request {
  std::string method;        // as sent (case-sensitive: "GET", "POST"...)
  std::string target;        // the request target as sent ("/v1/models/x?y=1")
  std::string path;          // the target's path, percent-decoded ("/v1/models/x")
  int version = 11;          // 10 or 11
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string remote_addr;
  std::vector<std::string> matches;  // route captures (/v1/models/{id}: matches[1] = id)
  int socket = -1;                   // the client's socket, to notice a client that is gone
  const std::atomic<bool>* stopping = nullptr;  // set when the server stops at once

  // The first header of that name (case-insensitive), "" if none.
  std::string header(const std::string& name) const;
  bool has_header(const std::string& name) const;
  // False once the client has closed or reset its connection, or the server is stopping (no blocking).
  bool client_alive() const;
};

struct Response {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;  // besides Content-Type/Length, Connection
  std::string content_type;
  std::string body;
  // A streamed response (chunked): pump is called on the handler's thread until it calls sink.done() or
  // returns false (abort: the connection closes without the final chunk); then stream_end(ok) runs once,
  // ok = the stream ended with done().
  std::function<bool(StreamSink&)> pump;
  std::function<void(bool ok)> stream_end;
  // What the request's generations reported, for the request log (server/request_log.h); may be null.
  std::shared_ptr<RequestRecord> record;

  void set_header(const std::string& name, const std::string& value);  // replaces one of that name
  std::string header(const std::string& name) const;
  void set_content(std::string b, std::string type) {
    body = std::move(b);
    content_type = std::move(type);
  }
  void set_stream(std::string type, std::function<bool(StreamSink&)> p, std::function<void(bool)> end) {
    content_type = std::move(type);
    pump = std::move(p);
    stream_end = std::move(end);
  }
  bool streaming() const { return static_cast<bool>(pump); }
};

// Whether the peer of `fd` is still connected (no blocking): false once it closed or reset the connection.
bool socket_alive(int fd);

}  // namespace qrig::server
