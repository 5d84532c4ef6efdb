// The connection layer under cpp-httplib. Debian's httplib 0.11 bounds a header line (8 KiB) but neither the
// number of header lines nor their total size, and gives handlers no access to their socket. TransportServer
// replaces its per-connection loop (Server::process_and_close_socket, virtual) with one that reads through
// BoundedSocketStream: request line + headers are capped at kMaxHeaderBytes (more -> 400 and the connection
// closes), the socket is known to the handler thread (client_socket(), to notice a client that is gone), and
// keep-alive connections close as soon as the server drains. Requests themselves are still parsed, routed and
// answered by httplib (Server::process_request).
#pragma once

#include <atomic>
#include <cstddef>
#include <string>

#include <httplib.h>

namespace qrig::server {

constexpr size_t kMaxHeaderBytes = 64 * 1024;

class TransportServer : public httplib::Server {
 public:
  explicit TransportServer(const std::atomic<bool>& draining) : draining_(draining) {}

 private:
  bool process_and_close_socket(socket_t sock) override;
  const std::atomic<bool>& draining_;
};

// The client socket of the request this thread is serving (-1 outside a request).
int client_socket();

// Whether the peer of `fd` is still connected (no blocking): false once it closed or reset the connection.
bool socket_alive(int fd);

}  // namespace qrig::server
