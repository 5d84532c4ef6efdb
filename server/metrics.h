// Prometheus metrics (GET /metrics, text exposition format 0.0.4): the engine's counters and gauges (tokens,
// throughput, requests running/queued, KV usage), per-generation latency histograms (time to first token, time
// per output token, end to end, queue time), finish reasons and prefix-cache hits labelled with the model, and
// the HTTP layer's request counts by route and status. The metrics that mean what llama-server's (`llamacpp:*`)
// or vLLM's (`vllm:*`) mean can be served under those names as well (--metrics-compat), so that existing
// dashboards work. Metric names are documented in docs/server.md.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/engine.h"

namespace qrig::server {

// A Prometheus histogram: fixed upper bounds, counts per bucket, sum and count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // `name`_bucket{labels,le=...} (cumulative, then +Inf), `name`_sum, `name`_count; `labels` is `k="v",...` or "".
  void render(std::string& out, const std::string& name, const std::string& labels) const;
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> buckets_;  // per bound, not cumulative; one more for +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

// What one finished generation tells the metrics (server/generation.cpp reports it).
struct FinishedGeneration {
  std::string finish_reason;  // the API's: stop, length, tool_calls, cancelled, error...
  bool timed = false;         // the engine's numbers below are known (its end was seen)
  runtime::DoneEvent engine;  // tokens and milliseconds as the engine measured them
};

// "llamacpp,vllm" -> {"llamacpp", "vllm"} (empty parts dropped).
std::vector<std::string> metrics_compat_names(const std::string& list);

class Metrics {
 public:
  Metrics();
  // route: the endpoint pattern ("/v1/chat/completions"), or "other" for unknown paths (bounded labels).
  void count_request(const std::string& route, int status);
  void observe(const FinishedGeneration& g);
  // A generation observed with finish reason `from` ended as `to` after all (one count moves).
  void reclassify(const std::string& from, const std::string& to);
  void set_compat(const std::string& list) { compat_ = metrics_compat_names(list); }

  // The exposition text. `engine` may be null while the model loads (engine metrics are then omitted); `model`
  // is the model's name in the API (the `model` / `model_name` label).
  std::string render(const runtime::Engine* engine, const std::string& model, bool ready) const;

 private:
  bool compat(const char* name) const;
  mutable std::mutex mu_;
  std::vector<std::string> compat_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  std::map<std::string, int64_t> finished_;  // by finish reason
  int64_t prefix_queries_ = 0, prefix_hits_ = 0;
  Histogram ttft_, tpot_, e2e_, queue_;
};

}  // namespace qrig::server
