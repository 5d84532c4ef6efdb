// The pieces of the metrics on their own (issue 14): histograms render cumulative Prometheus buckets with a
// value on a bound counted in that bound's bucket, finish reasons move when a generation turns out to have
// ended otherwise, compat names only when asked.
#include <catch2/catch.hpp>

#include <string>

#include "server/metrics.h"

using namespace qrig;
using namespace qrig::server;
using Catch::Matchers::Contains;

TEST_CASE("histograms render cumulative buckets, +Inf, sum and count", "[server][metrics]") {
  Histogram h({0.1, 1.0, 10.0});
  for (double v : {0.05, 0.1, 0.5, 1.0, 3.0, 100.0}) h.observe(v);
  std::string out;
  h.render(out, "x_seconds", "model=\"m\"");
  CHECK(out ==
        "x_seconds_bucket{model=\"m\",le=\"0.1\"} 2\n"
        "x_seconds_bucket{model=\"m\",le=\"1\"} 4\n"
        "x_seconds_bucket{model=\"m\",le=\"10\"} 5\n"
        "x_seconds_bucket{model=\"m\",le=\"+Inf\"} 6\n"
        "x_seconds_sum{model=\"m\"} 104.65\n"
        "x_seconds_count{model=\"m\"} 6\n");
  std::string bare;
  Histogram({1.0}).render(bare, "y", "");
  CHECK(bare == "y_bucket{le=\"1\"} 0\ny_bucket{le=\"+Inf\"} 0\ny_sum 0\ny_count 0\n");
}

TEST_CASE("finish reasons count per generation and move when a generation ends otherwise", "[server][metrics]") {
  Metrics m;
  runtime::DoneEvent d;
  d.prompt_tokens = 10;
  d.cached_tokens = 4;
  d.generated_tokens = 3;
  d.prompt_ms = 50;
  d.generation_ms = 20;
  d.queue_ms = 5;
  m.observe({"stop", true, d});
  m.observe({"stop", true, d});
  m.observe({"cancelled", false, {}});  // abandoned before its end was seen: no timings
  m.reclassify("stop", "tool_calls");
  // While loading only qrig_ready and the HTTP counts render.
  const std::string loading = m.render(nullptr, "", false);
  CHECK_THAT(loading, Contains("qrig_ready 0\n"));
  CHECK_THAT(loading, !Contains("qrig_finish_reason_total{"));
  const std::string t = m.render(nullptr, "my \"model\"", true);
  const std::string ml = "model=\"my \\\"model\\\"\"";  // the label value escaped
  CHECK_THAT(t, Contains("qrig_model_info{" + ml + "} 1\n"));
  CHECK_THAT(t, Contains("qrig_finish_reason_total{" + ml + ",reason=\"stop\"} 1\n"));
  CHECK_THAT(t, Contains("qrig_finish_reason_total{" + ml + ",reason=\"tool_calls\"} 1\n"));
  CHECK_THAT(t, Contains("qrig_finish_reason_total{" + ml + ",reason=\"cancelled\"} 1\n"));
  // Timings of the two generations whose end was seen: e2e 70 ms, ttft 50 ms, tpot 10 ms, queue 5 ms.
  CHECK_THAT(t, Contains("qrig_e2e_request_latency_seconds_count{" + ml + "} 2\n"));
  CHECK_THAT(t, Contains("qrig_e2e_request_latency_seconds_bucket{" + ml + ",le=\"0.3\"} 2\n"));
  CHECK_THAT(t, Contains("qrig_time_to_first_token_seconds_bucket{" + ml + ",le=\"0.04\"} 0\n"));
  CHECK_THAT(t, Contains("qrig_time_to_first_token_seconds_bucket{" + ml + ",le=\"0.06\"} 2\n"));
  CHECK_THAT(t, Contains("qrig_time_per_output_token_seconds_bucket{" + ml + ",le=\"0.01\"} 2\n"));
  CHECK_THAT(t, Contains("qrig_request_queue_time_seconds_sum{" + ml + "} 0.01\n"));
  CHECK_THAT(t, Contains("qrig_prefix_cache_queries_total{" + ml + "} 2\n"));
  CHECK_THAT(t, Contains("qrig_prefix_cache_hits_total{" + ml + "} 2\n"));
  CHECK_THAT(t, !Contains("vllm:"));
  m.set_compat("vllm");
  const std::string v = m.render(nullptr, "m", true);
  CHECK_THAT(v, Contains("vllm:request_success_total{finished_reason=\"stop\",model_name=\"m\"} 2\n"));  // tool_calls is a stop
  CHECK_THAT(v, Contains("vllm:request_success_total{finished_reason=\"abort\",model_name=\"m\"} 1\n"));
  CHECK_THAT(v, Contains("vllm:e2e_request_latency_seconds_count{model_name=\"m\"} 2\n"));
  CHECK(metrics_compat_names("llamacpp, vllm,") == std::vector<std::string>{"llamacpp", "vllm"});
  CHECK(metrics_compat_names("").empty());
}
