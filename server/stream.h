// What the streamed endpoints (chat completions, completions) share around their own chunk formats: a pump step
// that never throws (the connection layer calls pumps outside any handler's try), the end of a stream (error
// event, or final chunk + optional usage chunk + [DONE]) and writing a step's bytes (a dead client cancels the
// generation).
#pragma once

#include <string>
#include <utility>

#include "server/http_message.h"
#include <nlohmann/json.hpp>

#include "server/errors.h"
#include "server/generation.h"
#include "server/sse.h"

namespace qrig::server {

// A streamed chunk: the envelope (id, object, created, model) around one choice; "usage": null on every chunk
// when the client asked for usage (stream_options.include_usage), as OpenAI streams it.
inline nlohmann::json stream_chunk(const std::string& id, const char* object, int64_t created, const std::string& model,
                                   nlohmann::json choice, bool usage_null) {
  nlohmann::json c = {{"id", id}, {"object", object}, {"created", created}, {"model", model},
                      {"choices", nlohmann::json::array({std::move(choice)})}};
  if (usage_null) c["usage"] = nullptr;
  return c;
}

// Runs inner(sink); an exception ends the stream with an internal-error event and cancels the generation.
template <class Inner>
bool guarded_pump(Generation& gen, bool& finished, StreamSink& sink, Inner&& inner) {
  try {
    return inner(sink);
  } catch (const std::exception& e) {
    gen.cancel();
    finished = true;
    const std::string w = sse_event(error_body(ApiError(ErrorKind::internal, std::string("internal error: ") + e.what())));
    sink.write(w.data(), w.size());
    return false;
  }
}

// The events that end a stream whose generation finished with `reason`: an error event when it failed or the
// engine cancelled it, nothing when we cancelled it (the client is gone); otherwise final_chunk with the
// timings, then (when usage is not null) a chunk with the same envelope, no choices and the usage, then [DONE].
inline std::string stream_end(Generation& gen, const std::string& reason, nlohmann::json final_chunk,
                              nlohmann::json usage) {
  if (reason == "error" || reason == "cancelled")
    return gen.cancelled_by_engine() || reason == "error" ? sse_event(error_body(gen.failure())) : std::string();
  final_chunk["timings"] = gen.timings();
  std::string wire = sse_event(final_chunk);
  if (!usage.is_null()) {
    final_chunk["choices"] = nlohmann::json::array();
    final_chunk["usage"] = std::move(usage);
    wire += sse_event(final_chunk);
  }
  return wire + sse_done();
}

// Writes a step's bytes; a failed write (client gone) cancels the generation. The last step closes the sink.
inline bool write_step(Generation& gen, bool& finished, StreamSink& sink, const std::string& wire, bool done) {
  if (!wire.empty() && !sink.write(wire.data(), wire.size())) {
    gen.cancel();
    finished = true;
    return false;
  }
  if (done) {
    finished = true;
    sink.done();
  }
  return true;
}

}  // namespace qrig::server
