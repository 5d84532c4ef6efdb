// Prometheus text rendering of engine stats and HTTP request counts (see metrics.h).
#include "server/metrics.h"

#include <fmt/format.h>

namespace qrig::server {

void Metrics::count_request(const std::string& route, int status) {
  std::lock_guard<std::mutex> lk(mu_);
  ++requests_[{route, status}];
}

namespace {

void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
}

// Label values escape backslash, double quote and newline (exposition format rules).
std::string label(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\') o += "\\\\";
    else if (c == '"') o += "\\\"";
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o;
}

}  // namespace

std::string Metrics::render(const runtime::Engine* engine, bool ready) const {
  std::string out;
  metric(out, "qrig_ready", "gauge", "1 when the model is loaded and requests are served", ready ? 1 : 0);
  if (engine) {
    const runtime::EngineStats s = engine->stats();
    metric(out, "qrig_prompt_tokens_total", "counter", "Prompt tokens computed (cached tokens excluded)",
           (double)s.prompt_tokens_total);
    metric(out, "qrig_prompt_tokens_cached_total", "counter", "Prompt tokens reused from earlier requests' state",
           (double)s.cached_tokens_total);
    metric(out, "qrig_generated_tokens_total", "counter", "Tokens generated", (double)s.generated_tokens_total);
    metric(out, "qrig_requests_finished_total", "counter", "Generation requests the engine finished",
           (double)s.requests_total);
    metric(out, "qrig_prompt_seconds_total", "counter", "Seconds spent on prompts (queue wait included)",
           s.prompt_seconds_total);
    metric(out, "qrig_generation_seconds_total", "counter", "Seconds spent generating", s.generation_seconds_total);
    metric(out, "qrig_prompt_tokens_per_second", "gauge", "Average prompt throughput since start",
           s.prompt_seconds_total > 0 ? (double)s.prompt_tokens_total / s.prompt_seconds_total : 0.0);
    metric(out, "qrig_generation_tokens_per_second", "gauge", "Average generation throughput per request since start",
           s.generation_seconds_total > 0 ? (double)s.generated_tokens_total / s.generation_seconds_total : 0.0);
    metric(out, "qrig_requests_running", "gauge", "Requests holding a slot", (double)s.running);
    metric(out, "qrig_requests_queued", "gauge", "Requests waiting for a slot", (double)s.queued);
    metric(out, "qrig_slots", "gauge", "Sequence slots (--parallel)", (double)engine->slots());
    metric(out, "qrig_kv_cache_tokens_used", "gauge", "Tokens held in the slots' caches", (double)s.kv_tokens_used);
    metric(out, "qrig_kv_cache_tokens_capacity", "gauge", "Tokens the slots' caches can hold",
           (double)s.kv_tokens_capacity);
    metric(out, "qrig_kv_cache_usage_ratio", "gauge", "kv_cache_tokens_used / kv_cache_tokens_capacity",
           s.kv_tokens_capacity > 0 ? (double)s.kv_tokens_used / (double)s.kv_tokens_capacity : 0.0);
  }
  std::lock_guard<std::mutex> lk(mu_);
  out += "# HELP qrig_http_requests_total HTTP requests answered, by route and status\n"
         "# TYPE qrig_http_requests_total counter\n";
  for (const auto& [key, n] : requests_)
    out += fmt::format("qrig_http_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", label(key.first), key.second, n);
  return out;
}

}  // namespace qrig::server
