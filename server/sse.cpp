// JSON text and SSE framing (see sse.h).
#include "server/sse.h"

namespace qrig::server {

std::string json_text(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string json_text(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string sse_event(const nlohmann::json& j) {
  // json_text never emits a raw newline (they are escaped inside strings), so one data line is enough.
  return "data: " + json_text(j) + "\n\n";
}

std::string sse_done() { return "data: [DONE]\n\n"; }

}  // namespace qrig::server
