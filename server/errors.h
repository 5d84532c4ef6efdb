// Every error the HTTP API returns: one kind per failure class, one table (errors.cpp) mapping each kind to
// its HTTP status and OpenAI error `type` / `code`, and the OpenAI error object
//   {"error": {"message": ..., "type": ..., "param": ... | null, "code": ... | null, <extra fields>}}
// (and Anthropic's shape for its Messages API routes).
// Handlers throw ApiError; the HTTP layer turns it into a response, so no handler formats errors itself.
#pragma once

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

namespace qrig::server {

enum class ErrorKind {
  invalid_request,    // 400: malformed JSON, wrong types, out-of-range values (with `param`)
  unsupported,        // 400: a valid OpenAI field or value this server does not implement (yet)
  context_overflow,   // 400: prompt (+ requested tokens) does not fit the context (n_prompt_tokens, n_ctx)
  authentication,     // 401: --api-key set and the request has a missing or wrong key
  not_found,          // 404: unknown route or model
  method_not_allowed, // 405: known route, wrong method
  request_timeout,    // 408: the request head or body did not arrive in time
  payload_too_large,  // 413: body over --max-body
  uri_too_long,       // 414: request target over 8192 bytes
  unsupported_media,  // 415: a compressed request body (Content-Encoding)
  expectation_failed, // 417: an Expect header other than 100-continue
  queue_full,         // 429: every slot busy and the queue is full (Retry-After)
  internal,           // 500: the engine failed while generating
  not_implemented,    // 501: a transfer coding other than chunked
  unavailable,        // 503: model still loading, or the server is shutting down
  http_version,       // 505: not HTTP/1.0 or 1.1
};

struct ErrorSpec {
  int status;
  const char* type;  // OpenAI error type
  const char* code;  // OpenAI error code, nullptr -> JSON null
};
const ErrorSpec& error_spec(ErrorKind kind);

// The kind for an HTTP status the connection layer produced on its own (400 on a malformed request, 408,
// 413, 414...). Statuses outside the table map to invalid_request (4xx) or internal (5xx).
ErrorKind kind_for_status(int status);

struct ApiError : std::runtime_error {
  ApiError(ErrorKind k, const std::string& message, std::string param_ = {})
      : std::runtime_error(message), kind(k), param(std::move(param_)) {}
  ErrorKind kind;
  std::string param;     // the request field at fault ("" -> null)
  nlohmann::json extra = nlohmann::json::object();  // merged into the error object (n_prompt_tokens...)
};

// {"error": {...}} for an ApiError.
nlohmann::json error_body(const ApiError& e);

// Anthropic's error shape for the Messages API: {"type": "error", "error": {"type", "message"}}, the type
// from the HTTP status as Anthropic names them (invalid_request_error, authentication_error,
// not_found_error, request_too_large, rate_limit_error, api_error, overloaded_error).
nlohmann::json anthropic_error_body(const ApiError& e);

}  // namespace qrig::server
