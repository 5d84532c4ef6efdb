// Request / Response helpers and socket_alive (see http_message.h).
#include "server/http_message.h"

#include <poll.h>
#include <sys/socket.h>

#include <cctype>
#include <cerrno>
#include <string_view>

namespace qrig::server {

namespace {

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower((unsigned char)a[i]) != std::tolower((unsigned char)b[i])) return false;
  return true;
}

}  // namespace

std::string Request::header(const std::string& name) const {
  for (const auto& [n, v] : headers)
    if (iequal(n, name)) return v;
  return "";
}

bool Request::has_header(const std::string& name) const {
  for (const auto& [n, v] : headers)
    if (iequal(n, name)) return true;
  return false;
}

bool Request::client_alive() const { return !(stopping && *stopping) && socket_alive(socket); }

void Response::set_header(const std::string& name, const std::string& value) {
  for (auto& [n, v] : headers)
    if (iequal(n, name)) {
      v = value;
      return;
    }
  headers.emplace_back(name, value);
}

std::string Response::header(const std::string& name) const {
  for (const auto& [n, v] : headers)
    if (iequal(n, name)) return v;
  return "";
}

bool socket_alive(int fd) {
  if (fd < 0) return true;
  pollfd p{fd, POLLIN, 0};
  int r = poll(&p, 1, 0);
  if (r < 0) return errno == EINTR;
  if (r == 0) return true;  // nothing to read: still connected
  if (p.revents & (POLLERR | POLLNVAL)) return false;
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return true;    // the client sent more (a pipelined request): still there
  if (n == 0) return false;  // orderly shutdown
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

}  // namespace qrig::server
