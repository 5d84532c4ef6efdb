// Reading request bodies: bounded JSON parsing, typed field readers whose errors name the field (`param`),
// and the fields chat and text completions share (sampling, max tokens, stop, logprobs, stream, n...).
//
// Policy, documented in docs/server.md:
// - a body that is not JSON, not an object, nested deeper than kMaxDepth, or holds invalid UTF-8 -> 400;
// - a field of the wrong type or out of range -> 400 with param = the field; null means "not set";
// - an OpenAI field this server does not implement -> 400 (ErrorKind::unsupported), never silently dropped;
// - a field nobody knows (typo, other vendors' extensions) is ignored but reported back in the response
//   header X-Qrig-Ignored-Fields and in the server log.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/sampler.h"

namespace qrig::server {

using Json = nlohmann::ordered_json;

constexpr int kMaxDepth = 64;

// Throws ApiError(invalid_request) for malformed JSON, invalid UTF-8, nesting deeper than kMaxDepth or a
// non-object top level.
Json parse_body(const std::string& body);

// Field readers: nullopt when the key is absent or null; ApiError(invalid_request, param=key) otherwise when
// the type or range is wrong. Integers accept integral floats (100.0).
std::optional<bool> get_bool(const Json& obj, const std::string& key, const std::string& param = {});
std::optional<int64_t> get_int(const Json& obj, const std::string& key, int64_t lo, int64_t hi,
                               const std::string& param = {});
std::optional<double> get_number(const Json& obj, const std::string& key, double lo, double hi,
                                 const std::string& param = {});
std::optional<std::string> get_string(const Json& obj, const std::string& key, const std::string& param = {});

constexpr int64_t kMaxSamples = 16;  // n at most

// Generation parameters shared by /v1/chat/completions and /v1/completions.
struct GenParams {
  runtime::SamplingParams sampling;
  int64_t max_tokens = -1;           // -1: up to the context
  std::vector<std::string> stop;     // stop strings
  int32_t top_logprobs = -1;         // -1: no logprobs; 0: chosen token only; n: n alternatives too
  bool stream = false;
  bool include_usage = false;        // stream_options.include_usage
  bool skip_special_tokens = true;   // vLLM's field: false renders control tokens as text
  int64_t n = 1;                     // samples of the prompt (OpenAI n, llama.cpp n_cmpl), one prefill
  bool ignore_eos = false;           // end-of-generation tokens do not stop the output (vLLM, llama.cpp)
  bool draft = true;                 // speculative decoding where the plan drafts (qrig's "draft" field)
  int64_t min_tokens = 0;            // end-of-generation and stop_token_ids held back until this many (vLLM)
  std::vector<int32_t> stop_token_ids;  // more ids that end the output (vLLM)
  bool include_stop_str = false;     // the matched stop string stays in the output (vLLM include_stop_str_in_output)
  int64_t truncate_prompt_tokens = 0;  // > 0: keep only this many prompt tokens (vLLM); -1: the context
  bool truncate_left = true;         // truncation_side "left" (keep the last tokens) or "right"
  std::vector<int32_t> allowed_token_ids;  // non-empty: only these ids may be generated (vLLM)
};

// Reads the shared fields into `out`, starting from out.sampling as the defaults (so set them first, e.g.
// SamplingParams::qwen_defaults). Adds every key it consumed to `known`. n_real_vocab bounds token ids
// (logit_bias, stop_token_ids, allowed_token_ids). default_max_tokens applies when neither max_tokens,
// max_completion_tokens nor n_predict is given.
void parse_common(const Json& body, GenParams& out, int32_t n_real_vocab, int64_t default_max_tokens,
                  std::set<std::string>& known);

// The prompt after truncate_prompt_tokens (unchanged when it is 0).
std::vector<int32_t> truncated_prompt(std::vector<int32_t> prompt, const GenParams& g, int64_t n_ctx);

// The keys of `body` not in `known`, comma-separated ("" if none).
std::string unknown_fields(const Json& body, const std::set<std::string>& known);

}  // namespace qrig::server
