// Prometheus metrics (GET /metrics, text exposition format 0.0.4): the engine's counters and gauges
// (tokens, throughput, requests running/queued, KV usage) plus the HTTP layer's request counts by route and
// status. Metric names are documented in docs/server.md.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "runtime/engine.h"

namespace qrig::server {

class Metrics {
 public:
  // route: the endpoint pattern ("/v1/chat/completions"), or "other" for unknown paths (bounded labels).
  void count_request(const std::string& route, int status);
  // The exposition text. `engine` may be null while the model loads (engine metrics are then omitted).
  std::string render(const runtime::Engine* engine, bool ready) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
};

}  // namespace qrig::server
