// Prometheus text rendering of engine stats, generation histograms and HTTP request counts (see metrics.h).
#include "server/metrics.h"

#include <algorithm>

#include <fmt/format.h>

namespace qrig::server {

namespace {

// vLLM's bucket bounds (vllm/v1/metrics/loggers.py), so that the same quantiles come out under either name.
const std::vector<double> kTtftBounds = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,   0.75,
                                         1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kTpotBounds = {0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,  0.4, 0.5,
                                         0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kRequestBounds = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                            30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

void head(std::string& out, const std::string& name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void metric(std::string& out, const std::string& name, const char* type, const char* help, double value,
            const std::string& labels = "") {
  head(out, name, type, help);
  out += labels.empty() ? fmt::format("{} {}\n", name, value) : fmt::format("{}{{{}}} {}\n", name, labels, value);
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

// vLLM's finished_reason values: stop, length, abort.
std::string vllm_reason(const std::string& r) {
  if (r == "length") return "length";
  if (r == "cancelled" || r == "error") return "abort";
  return "stop";  // stop strings, end of generation, tool_calls
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), buckets_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t k = (size_t)(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++buckets_[k];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  const std::string sep = labels.empty() ? "" : ",";
  int64_t cum = 0;
  for (size_t k = 0; k < bounds_.size(); ++k) {
    cum += buckets_[k];
    out += fmt::format("{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep, bounds_[k], cum);
  }
  cum += buckets_.back();
  out += fmt::format("{}_bucket{{{}{}le=\"+Inf\"}} {}\n", name, labels, sep, cum);
  const std::string l = labels.empty() ? "" : "{" + labels + "}";
  out += fmt::format("{}_sum{} {}\n{}_count{} {}\n", name, l, sum_, name, l, count_);
}

std::vector<std::string> metrics_compat_names(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string part = list.substr(start, end - start);
    part.erase(0, part.find_first_not_of(' '));
    part.erase(part.find_last_not_of(' ') + 1);
    if (!part.empty()) out.push_back(part);
    start = end + 1;
  }
  return out;
}

Metrics::Metrics() : ttft_(kTtftBounds), tpot_(kTpotBounds), e2e_(kRequestBounds), queue_(kRequestBounds) {}

bool Metrics::compat(const char* name) const { return std::find(compat_.begin(), compat_.end(), name) != compat_.end(); }

void Metrics::count_request(const std::string& route, int status) {
  std::lock_guard<std::mutex> lk(mu_);
  ++requests_[{route, status}];
}

void Metrics::observe(const FinishedGeneration& g) {
  std::lock_guard<std::mutex> lk(mu_);
  ++finished_[g.finish_reason];
  if (!g.timed) return;
  const runtime::DoneEvent& d = g.engine;
  ++prefix_queries_;
  prefix_hits_ += d.cached_tokens > 0;
  queue_.observe(d.queue_ms / 1000.0);
  e2e_.observe((d.prompt_ms + d.generation_ms) / 1000.0);
  if (d.generated_tokens > 0) ttft_.observe(d.prompt_ms / 1000.0);
  if (d.generated_tokens > 1) tpot_.observe(d.generation_ms / 1000.0 / (double)(d.generated_tokens - 1));
}

void Metrics::reclassify(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = finished_.find(from);
  if (it == finished_.end() || it->second == 0) return;
  if (--it->second == 0) finished_.erase(it);
  ++finished_[to];
}

std::string Metrics::render(const runtime::Engine* engine, const std::string& model, bool ready) const {
  std::string out;
  metric(out, "qrig_ready", "gauge", "1 when the model is loaded and requests are served", ready ? 1 : 0);
  std::lock_guard<std::mutex> lk(mu_);
  if (engine) {
    const runtime::EngineStats s = engine->stats();
    const double kv_ratio = s.kv_tokens_capacity > 0 ? (double)s.kv_tokens_used / (double)s.kv_tokens_capacity : 0.0;
    const double prompt_tps = s.prompt_seconds_total > 0 ? (double)s.prompt_tokens_total / s.prompt_seconds_total : 0.0;
    const double gen_tps =
        s.generation_seconds_total > 0 ? (double)s.generated_tokens_total / s.generation_seconds_total : 0.0;
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
    metric(out, "qrig_decode_steps_total", "counter", "Engine steps that produced generated tokens",
           (double)s.decode_steps_total);
    metric(out, "qrig_draft_tokens_total", "counter", "Draft tokens the MTP head proposed (speculative decoding)",
           (double)s.drafted_total);
    metric(out, "qrig_draft_tokens_accepted_total", "counter", "Draft tokens the target model accepted",
           (double)s.accepted_total);
    metric(out, "qrig_prompt_tokens_per_second", "gauge", "Average prompt throughput since start", prompt_tps);
    metric(out, "qrig_generation_tokens_per_second", "gauge", "Average generation throughput per request since start",
           gen_tps);
    metric(out, "qrig_requests_running", "gauge", "Requests holding a slot", (double)s.running);
    metric(out, "qrig_requests_queued", "gauge", "Requests waiting for a slot", (double)s.queued);
    metric(out, "qrig_slots", "gauge", "Sequence slots (--parallel)", (double)engine->slots());
    metric(out, "qrig_kv_cache_tokens_used", "gauge", "Tokens held in the slots' caches", (double)s.kv_tokens_used);
    metric(out, "qrig_kv_cache_tokens_capacity", "gauge", "Tokens the slots' caches can hold",
           (double)s.kv_tokens_capacity);
    metric(out, "qrig_kv_cache_usage_ratio", "gauge", "kv_cache_tokens_used / kv_cache_tokens_capacity", kv_ratio);
    // The shared prefix cache (runtime/prefix_cache.h): what it holds and what it did.
    metric(out, "qrig_prefix_cache_bytes", "gauge", "Bytes the shared prefix cache holds (KV spans + snapshots)",
           (double)s.prefix.bytes);
    metric(out, "qrig_prefix_cache_budget_bytes", "gauge", "The shared prefix cache's budget (the plan's)",
           (double)s.prefix.budget);
    metric(out, "qrig_prefix_cache_nodes", "gauge", "Nodes of the shared prefix index", (double)s.prefix.nodes);
    metric(out, "qrig_prefix_cache_restores_total", "counter", "Prompts started from the shared prefix index",
           (double)s.prefix.hits);
    metric(out, "qrig_prefix_cache_restored_tokens_total", "counter", "Prompt tokens those restores skipped",
           (double)s.prefix.hit_tokens);
    metric(out, "qrig_prefix_cache_snapshots_total", "counter", "Snapshots taken into the shared prefix index",
           (double)s.prefix.inserts);
    metric(out, "qrig_prefix_cache_evictions_total", "counter",
           "Entries of the shared prefix index evicted for room (least recently used first)",
           (double)s.prefix.evictions);

    if (compat("llamacpp")) {  // llama-server's /metrics names (no labels, as it has none)
      metric(out, "llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.",
             (double)s.prompt_tokens_total);
      metric(out, "llamacpp:prompt_seconds_total", "counter", "Prompt process time", s.prompt_seconds_total);
      metric(out, "llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.",
             (double)s.generated_tokens_total);
      metric(out, "llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time",
             s.generation_seconds_total);
      metric(out, "llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", prompt_tps);
      metric(out, "llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.", gen_tps);
      metric(out, "llamacpp:kv_cache_usage_ratio", "gauge", "KV-cache usage. 1 means 100 percent usage.", kv_ratio);
      metric(out, "llamacpp:kv_cache_tokens", "gauge", "KV-cache tokens.", (double)s.kv_tokens_used);
      metric(out, "llamacpp:requests_processing", "gauge", "Number of requests processing.", (double)s.running);
      metric(out, "llamacpp:requests_deferred", "gauge", "Number of requests deferred.", (double)s.queued);
    }
    if (compat("vllm")) {  // vLLM's names and labels (model_name)
      const std::string vl = fmt::format("model_name=\"{}\"", label(model));
      metric(out, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
             (double)s.running, vl);
      metric(out, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
             (double)s.queued, vl);
      metric(out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", kv_ratio, vl);
      metric(out, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
             (double)(s.prompt_tokens_total + s.cached_tokens_total), vl);
      metric(out, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
             (double)s.generated_tokens_total, vl);
      metric(out, "vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.",
             (double)(s.prompt_tokens_total + s.cached_tokens_total), vl);
      metric(out, "vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
             (double)s.cached_tokens_total, vl);
    }
  }
  if (ready) {
    // Per generation, labelled with the model (also without an engine: the numbers are the server's own).
    const std::string ml = fmt::format("model=\"{}\"", label(model));
    metric(out, "qrig_model_info", "gauge", "The model served (its name in the API)", 1, ml);
    head(out, "qrig_finish_reason_total", "counter", "Generations finished, by the API's finish reason");
    for (const auto& [reason, n] : finished_)
      out += fmt::format("qrig_finish_reason_total{{{},reason=\"{}\"}} {}\n", ml, label(reason), n);
    metric(out, "qrig_prefix_cache_queries_total", "counter", "Generations that looked for a cached prompt prefix",
           (double)prefix_queries_, ml);
    metric(out, "qrig_prefix_cache_hits_total", "counter", "Generations that reused a cached prompt prefix",
           (double)prefix_hits_, ml);
    head(out, "qrig_time_to_first_token_seconds", "histogram", "Seconds from submission to the first token");
    ttft_.render(out, "qrig_time_to_first_token_seconds", ml);
    head(out, "qrig_time_per_output_token_seconds", "histogram", "Seconds per output token after the first");
    tpot_.render(out, "qrig_time_per_output_token_seconds", ml);
    head(out, "qrig_e2e_request_latency_seconds", "histogram", "Seconds from submission to the end of the generation");
    e2e_.render(out, "qrig_e2e_request_latency_seconds", ml);
    head(out, "qrig_request_queue_time_seconds", "histogram", "Seconds waiting for a sequence slot");
    queue_.render(out, "qrig_request_queue_time_seconds", ml);

    if (compat("vllm")) {
      const std::string vl = fmt::format("model_name=\"{}\"", label(model));
      std::map<std::string, int64_t> by_reason;
      for (const auto& [reason, n] : finished_) by_reason[vllm_reason(reason)] += n;
      head(out, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
      for (const auto& [reason, n] : by_reason)
        out += fmt::format("vllm:request_success_total{{finished_reason=\"{}\",{}}} {}\n", reason, vl, n);
      head(out, "vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.");
      ttft_.render(out, "vllm:time_to_first_token_seconds", vl);
      head(out, "vllm:time_per_output_token_seconds", "histogram", "Histogram of time per output token in seconds.");
      tpot_.render(out, "vllm:time_per_output_token_seconds", vl);
      head(out, "vllm:e2e_request_latency_seconds", "histogram", "Histogram of e2e request latency in seconds.");
      e2e_.render(out, "vllm:e2e_request_latency_seconds", vl);
      head(out, "vllm:request_queue_time_seconds", "histogram", "Histogram of time spent in WAITING phase for request.");
      queue_.render(out, "vllm:request_queue_time_seconds", vl);
    }
  }
  head(out, "qrig_http_requests_total", "counter", "HTTP requests answered, by route and status");
  for (const auto& [key, n] : requests_)
    out += fmt::format("qrig_http_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", label(key.first), key.second, n);
  return out;
}

}  // namespace qrig::server
