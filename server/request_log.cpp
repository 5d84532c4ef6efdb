// The request log line and the per-request record generations report into (request_log.h).
#include "server/request_log.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/generation.h"
#include "server/handlers.h"
#include "server/http_message.h"

namespace qrig::server {

namespace {

thread_local std::shared_ptr<RequestRecord> t_current;

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}.{:03d}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, (int)ms);
}

bool plain_token(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  for (unsigned char c : s)
    if (!(std::isalnum(c) || c == '.' || c == '_' || c == ':' || c == '-')) return false;
  return true;
}

// The message of an error response body ({"error": {"message": ...}}), or "".
std::string error_message(const Response& res) {
  if (res.content_type.rfind("application/json", 0) != 0 || res.body.size() > (1u << 20)) return "";
  const nlohmann::json j = nlohmann::json::parse(res.body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string())
    return j["error"]["message"].get<std::string>();
  return "";
}

// log_escape, and a double quote as \x22, so that a quoted value ends where it says.
std::string quote_value(const std::string& s) {
  std::string e = log_escape(s, 1024), o = "\"";
  for (char c : e) o += c == '"' ? std::string("\\x22") : std::string(1, c);
  return o + "\"";
}

}  // namespace

void RequestRecord::add_generation(int64_t prompt, int64_t cached, int64_t generated, double p_ms, double g_ms,
                                   double q_ms, const std::string& finish, const std::string& err) {
  std::lock_guard<std::mutex> lk(mu);
  ++generations;
  prompt_tokens += prompt;
  cached_tokens += cached;
  generated_tokens += generated;
  prompt_ms = std::max(prompt_ms, p_ms);
  generation_ms = std::max(generation_ms, g_ms);
  queue_ms = std::max(queue_ms, q_ms);
  finish_reasons.push_back(finish);
  if (error.empty()) error = err;
}

void RequestRecord::add_draft(int64_t steps, int64_t d, int64_t a) {
  std::lock_guard<std::mutex> lk(mu);
  decode_steps += steps;
  drafted += d;
  accepted += a;
}

void RequestRecord::reclassify(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> lk(mu);
  for (auto& r : finish_reasons)
    if (r == from) {
      r = to;
      return;
    }
}

RequestScope::RequestScope(std::shared_ptr<RequestRecord> record) : previous_(std::move(t_current)) {
  t_current = std::move(record);
}
RequestScope::~RequestScope() { t_current = std::move(previous_); }
std::shared_ptr<RequestRecord> RequestScope::current() { return t_current; }

std::string request_id(const Request& req) {
  const std::string given = req.header("X-Request-Id");
  return plain_token(given) ? given : random_id("req-", 16);
}

std::string request_log_line(const Request& req, const Response& res, const RequestRecord* rec, const Delivery& d) {
  std::string id = res.header("X-Request-Id");
  if (id.empty()) id = "-";
  std::string line = fmt::format("qrig serve: {} {} {} {} {} {} {:.1f} ms", utc_now(), log_escape(id, 128),
                                 log_escape(req.remote_addr, 64), log_escape(req.method, 32), log_escape(req.path, 512),
                                 res.status, d.ms);
  std::string error;
  if (rec) {
    std::lock_guard<std::mutex> lk(rec->mu);
    if (rec->generations > 0) {
      const int64_t computed = rec->prompt_tokens - rec->cached_tokens;
      const double prefill_ms = rec->prompt_ms - rec->queue_ms;
      line += fmt::format(" prompt={} cached={} generated={}", rec->prompt_tokens, rec->cached_tokens,
                          rec->generated_tokens);
      if (prefill_ms > 0 && computed > 0) line += fmt::format(" prompt_tps={:.1f}", 1000.0 * (double)computed / prefill_ms);
      if (rec->generation_ms > 0 && rec->generated_tokens > 1)
        line += fmt::format(" gen_tps={:.1f}", 1000.0 * (double)(rec->generated_tokens - 1) / rec->generation_ms);
      if (rec->queue_ms >= 1) line += fmt::format(" queued={:.0f}ms", rec->queue_ms);
      if (rec->drafted > 0)  // speculative decoding: acceptance of the drafts, tokens per decode step
        line += fmt::format(" draft_accept={:.3f} tokens_per_step={:.2f}", (double)rec->accepted / (double)rec->drafted,
                            rec->decode_steps > 0 ? (double)rec->generated_tokens / (double)rec->decode_steps : 0.0);
      std::vector<std::string> distinct;
      for (const auto& r : rec->finish_reasons)
        if (std::find(distinct.begin(), distinct.end(), r) == distinct.end()) distinct.push_back(r);
      std::string reasons;
      for (const auto& r : distinct) reasons += (reasons.empty() ? "" : ",") + r;
      line += " finish=" + log_escape(reasons, 256);
    }
    error = rec->error;
  }
  if (res.status >= 400 && res.status != 499) {
    const std::string m = error_message(res);
    if (!m.empty()) error = m;
  }
  if (!error.empty()) line += " error=" + quote_value(error);
  if (d.client_gone) line += " client disconnected";
  else if (!d.complete) line += " response cut short";
  return line + "\n";
}

}  // namespace qrig::server
