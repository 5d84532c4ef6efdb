// Wire helpers: JSON text for responses (never throws on odd strings: invalid UTF-8 is replaced), and
// Server-Sent Events framing as OpenAI streams it: each event one "data: <json>" line and a blank line,
// the stream closed by "data: [DONE]".
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace qrig::server {

std::string json_text(const nlohmann::json& j);
std::string json_text(const nlohmann::ordered_json& j);

std::string sse_event(const nlohmann::json& j);  // "data: {...}\n\n"
std::string sse_done();                           // "data: [DONE]\n\n"

}  // namespace qrig::server
