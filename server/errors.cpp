// The one table of API errors: kind -> HTTP status, OpenAI error type and code (see errors.h).
// Types follow OpenAI where it has one and llama.cpp's server where OpenAI has none
// (exceed_context_size_error, unavailable_error), so clients written for either recognise them.
#include "server/errors.h"

namespace qrig::server {

namespace {

struct Row {
  ErrorKind kind;
  ErrorSpec spec;
};

constexpr Row kTable[] = {
    {ErrorKind::invalid_request, {400, "invalid_request_error", nullptr}},
    {ErrorKind::unsupported, {400, "invalid_request_error", "unsupported_value"}},
    {ErrorKind::context_overflow, {400, "exceed_context_size_error", "context_length_exceeded"}},
    {ErrorKind::authentication, {401, "authentication_error", "invalid_api_key"}},
    {ErrorKind::not_found, {404, "not_found_error", nullptr}},
    {ErrorKind::method_not_allowed, {405, "invalid_request_error", "method_not_allowed"}},
    {ErrorKind::request_timeout, {408, "invalid_request_error", "request_timeout"}},
    {ErrorKind::payload_too_large, {413, "invalid_request_error", "payload_too_large"}},
    {ErrorKind::uri_too_long, {414, "invalid_request_error", "uri_too_long"}},
    {ErrorKind::unsupported_media, {415, "invalid_request_error", "unsupported_content_encoding"}},
    {ErrorKind::expectation_failed, {417, "invalid_request_error", "expectation_failed"}},
    {ErrorKind::queue_full, {429, "rate_limit_error", "queue_full"}},
    {ErrorKind::internal, {500, "server_error", nullptr}},
    {ErrorKind::not_implemented, {501, "invalid_request_error", "not_implemented"}},
    {ErrorKind::unavailable, {503, "unavailable_error", nullptr}},
    {ErrorKind::http_version, {505, "invalid_request_error", "http_version_not_supported"}},
};

}  // namespace

const ErrorSpec& error_spec(ErrorKind kind) {
  for (const Row& r : kTable)
    if (r.kind == kind) return r.spec;
  return kTable[0].spec;  // unreachable: every kind has a row (tested)
}

ErrorKind kind_for_status(int status) {
  for (const Row& r : kTable)
    if (r.spec.status == status && r.kind != ErrorKind::unsupported && r.kind != ErrorKind::context_overflow)
      return r.kind;
  return status >= 500 ? ErrorKind::internal : ErrorKind::invalid_request;
}

nlohmann::json error_body(const ApiError& e) {
  const ErrorSpec& s = error_spec(e.kind);
  nlohmann::json err = {{"message", e.what()},
                        {"type", s.type},
                        {"param", e.param.empty() ? nlohmann::json() : nlohmann::json(e.param)},
                        {"code", s.code ? nlohmann::json(s.code) : nlohmann::json()}};
  if (e.extra.is_object())
    for (auto it = e.extra.begin(); it != e.extra.end(); ++it) err[it.key()] = it.value();
  return {{"error", std::move(err)}};
}

nlohmann::json anthropic_error_body(const ApiError& e) {
  const int status = error_spec(e.kind).status;
  const char* type = status == 401   ? "authentication_error"
                     : status == 403 ? "permission_error"
                     : status == 404 ? "not_found_error"
                     : status == 413 ? "request_too_large"
                     : status == 429 ? "rate_limit_error"
                     : status == 503 ? "overloaded_error"
                     : status >= 500 ? "api_error"
                                     : "invalid_request_error";
  std::string message = e.what();
  if (!e.param.empty() && message.find(e.param) == std::string::npos) message = e.param + ": " + message;
  return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

}  // namespace qrig::server
