// The table of harmless and refused request fields (see request_fields.h). Sources of the field lists:
// OpenAI's chat / completions API reference, llama.cpp's tools/server/README.md (POST /completion options and
// the OpenAI-compatible chat options), vLLM's ChatCompletionRequest / CompletionRequest (sampling and extra
// parameters, the legacy guided_* fields). The honoured fields are not here: the endpoints read them.
#include "server/request_fields.h"

#include <fmt/format.h>

#include "server/errors.h"

namespace qrig::server {

namespace {

// When a field is inert (refused rows): the value keeps the output as the server would make it anyway.
enum class Inert { never, is_false, is_true, is_zero, non_positive, zero_or_one, is_one, is_empty, medium };

bool inert(const Json& v, Inert how) {
  if (v.is_null()) return true;
  switch (how) {
    case Inert::never: return false;
    case Inert::is_false: return v.is_boolean() && !v.get<bool>();
    case Inert::is_true: return v.is_boolean() && v.get<bool>();
    case Inert::is_zero: return v.is_number() && v.get<double>() == 0.0;
    case Inert::non_positive: return v.is_number() && v.get<double>() <= 0.0;
    case Inert::zero_or_one: return v.is_number() && (v.get<double>() == 0.0 || v.get<double>() == 1.0);
    case Inert::is_one: return v.is_number() && v.get<double>() == 1.0;
    case Inert::is_empty: return (v.is_array() || v.is_object() || v.is_string()) && v.empty();
    case Inert::medium: return v.is_string() && v.get<std::string>() == "medium";
  }
  return false;
}

constexpr unsigned kChat = 1, kCompletions = 2, kBoth = kChat | kCompletions;

struct Row {
  const char* name;
  unsigned endpoints;
  bool harmless;   // accepted, no effect; otherwise refused unless inert
  Inert inert;     // refused rows: which values are accepted
  const char* why; // refused rows: the reason in the error; harmless rows: what the field does here
};

constexpr Row kRows[] = {
    // OpenAI
    {"metadata", kBoth, true, Inert::never, "stored nowhere"},
    {"store", kBoth, true, Inert::never, "nothing is stored"},
    {"service_tier", kBoth, true, Inert::never, "one tier"},
    {"safety_identifier", kBoth, true, Inert::never, "not used"},
    {"prompt_cache_key", kBoth, true, Inert::never, "prefix reuse is automatic"},
    {"prompt_cache_retention", kBoth, true, Inert::never, "prefix reuse is automatic"},
    {"functions", kChat, false, Inert::never, "the legacy function API is not served; use 'tools'"},
    {"function_call", kChat, false, Inert::never, "the legacy function API is not served; use 'tool_choice'"},
    {"audio", kChat, false, Inert::never, "this server generates text only"},
    {"prediction", kChat, false, Inert::never, "predicted outputs are not implemented"},
    {"web_search_options", kChat, false, Inert::never, "this server has no web search"},
    {"verbosity", kChat, false, Inert::medium, "output verbosity levels are not implemented (only \"medium\")"},
    {"best_of", kCompletions, false, Inert::is_one, "only best_of = 1 is supported"},
    {"suffix", kCompletions, false, Inert::is_empty, "fill-in-the-middle is not supported"},
    {"grammar", kBoth, false, Inert::never, "GBNF grammars are not supported; use a JSON schema or guided_regex"},
    // llama.cpp
    {"dynatemp_range", kBoth, false, Inert::is_zero, "dynamic temperature is not implemented"},
    {"dynatemp_exponent", kBoth, true, Inert::never, "no effect while dynatemp_range is 0"},
    {"n_indent", kBoth, false, Inert::is_zero, "minimum indentation is not implemented"},
    {"n_keep", kBoth, true, Inert::never, "the context is never shifted: nothing is discarded"},
    {"n_cache_reuse", kBoth, true, Inert::never, "prefix reuse is automatic"},
    {"cache_prompt", kBoth, true, Inert::never, "prefix reuse is automatic (it changes no output)"},
    {"id_slot", kBoth, true, Inert::never, "the engine picks the slot"},
    {"dry_multiplier", kBoth, false, Inert::is_zero, "DRY sampling is not implemented"},
    {"dry_base", kBoth, true, Inert::never, "no effect while dry_multiplier is 0"},
    {"dry_allowed_length", kBoth, true, Inert::never, "no effect while dry_multiplier is 0"},
    {"dry_penalty_last_n", kBoth, true, Inert::never, "no effect while dry_multiplier is 0"},
    {"dry_sequence_breakers", kBoth, true, Inert::never, "no effect while dry_multiplier is 0"},
    {"mirostat", kBoth, false, Inert::is_zero, "Mirostat sampling is not implemented"},
    {"mirostat_tau", kBoth, true, Inert::never, "no effect while mirostat is 0"},
    {"mirostat_eta", kBoth, true, Inert::never, "no effect while mirostat is 0"},
    {"n_probs", kBoth, false, Inert::is_zero, "use 'logprobs' / 'top_logprobs'"},
    {"min_keep", kBoth, false, Inert::zero_or_one, "min_keep above 1 is not implemented"},
    {"t_max_predict_ms", kBoth, false, Inert::is_zero, "a generation time limit is not implemented"},
    {"return_tokens", kBoth, false, Inert::is_false, "token ids are not returned; use logprobs"},
    {"samplers", kBoth, false, Inert::never, "the sampler order is fixed (docs/server.md)"},
    {"timings_per_token", kBoth, true, Inert::never, "every response carries timings in its last chunk"},
    {"return_progress", kBoth, false, Inert::is_false, "prompt progress events are not implemented"},
    {"sse_ping_interval", kBoth, true, Inert::never, "no pings in OpenAI streams"},
    {"post_sampling_probs", kBoth, false, Inert::is_false, "log-probabilities are taken before truncation"},
    {"response_fields", kBoth, false, Inert::never, "responses are not reshaped"},
    {"lora", kBoth, false, Inert::is_empty, "LoRA adapters are not supported"},
    {"top_n_sigma", kBoth, false, Inert::non_positive, "top-n-sigma sampling is not implemented"},
    {"parse_tool_calls", kChat, false, Inert::is_true, "tool calls are always parsed when 'tools' are given"},
    {"thinking_forced_open", kChat, false, Inert::is_false, "use 'enable_thinking' / 'chat_template_kwargs'"},
    {"reasoning_control", kChat, false, Inert::is_false, "reasoning control is not implemented"},
    // vLLM
    {"use_beam_search", kBoth, false, Inert::is_false, "beam search is not implemented"},
    {"watermarking", kBoth, false, Inert::is_false, "watermarking is not implemented"},
    {"length_penalty", kBoth, false, Inert::is_one, "length_penalty applies to beam search, which is not implemented"},
    {"prompt_logprobs", kBoth, false, Inert::never, "prompt log-probabilities are not implemented"},
    {"logprob_token_ids", kBoth, false, Inert::never, "log-probabilities of chosen ids are not implemented"},
    {"bad_words", kBoth, false, Inert::is_empty, "bad_words is not implemented; use logit_bias"},
    {"echo", kChat, false, Inert::is_false, "echo is served by /v1/completions"},
    {"add_special_tokens", kBoth, true, Inert::never, "Qwen adds no BOS: the chat template writes every special token"},
    {"documents", kChat, false, Inert::is_empty, "the Qwen3.5 chat template has no documents section"},
    {"chat_template", kChat, false, Inert::never, "the chat template is the model's (Qwen3.5, built in)"},
    {"media_io_kwargs", kChat, true, Inert::never, "no media input is accepted"},
    {"mm_processor_kwargs", kBoth, true, Inert::never, "no media input is accepted"},
    {"priority", kBoth, true, Inert::never, "requests are served first come, first served"},
    {"request_id", kBoth, true, Inert::never, "responses get their own ids"},
    {"session_id", kBoth, true, Inert::never, "not used"},
    {"return_tokens_as_token_ids", kBoth, false, Inert::is_false, "tokens are returned as text"},
    {"return_token_ids", kBoth, false, Inert::is_false, "token ids are not returned; use /tokenize"},
    {"routed_experts_prompt_start", kBoth, true, Inert::never, "routed experts are not returned"},
    {"return_token_offsets", kBoth, true, Inert::never, "render endpoints only"},
    {"return_prompt_text", kBoth, false, Inert::is_false, "the prompt text is not returned; use /tokenize"},
    {"return_mm_kwargs", kBoth, true, Inert::never, "render endpoints only"},
    {"cache_salt", kBoth, true, Inert::never, "prefix reuse is per slot and never crosses requests' text"},
    {"kv_transfer_params", kBoth, false, Inert::never, "disaggregated serving is not implemented"},
    {"ec_transfer_params", kBoth, false, Inert::never, "disaggregated serving is not implemented"},
    {"vllm_xargs", kBoth, false, Inert::never, "vLLM extensions are not available"},
    {"repetition_detection", kBoth, false, Inert::never, "repetition detection is not implemented"},
    {"stream_interval", kBoth, true, Inert::never, "streams send every token as it comes"},
    {"logits_processors", kBoth, false, Inert::is_empty, "custom logits processors are not available"},
    {"structural_tag", kBoth, false, Inert::never, "structural tags are not supported; use guided_json or tools"},
    {"prompt_embeds", kCompletions, false, Inert::never, "prompt embeddings are not accepted"},
    {"guided_grammar", kBoth, false, Inert::never, "grammars are not supported; use guided_json or guided_regex"},
    {"guided_decoding_backend", kBoth, true, Inert::never, "one constrained decoder (text/grammar.h)"},
    {"guided_whitespace_pattern", kBoth, false, Inert::never, "JSON is written compact (text/grammar.h)"},
};

}  // namespace

void append_name(std::string& list, const std::string& name) {
  if (!list.empty()) list += ",";
  list += name;
}

void check_table_fields(const Json& body, Endpoint ep, const FieldPolicy& policy, std::set<std::string>& known,
                        std::string& ignored) {
  const unsigned bit = ep == Endpoint::chat ? kChat : kCompletions;
  for (const Row& r : kRows) {
    if (!(r.endpoints & bit)) continue;
    known.insert(r.name);
    if (r.harmless) continue;
    auto it = body.find(r.name);
    if (it == body.end() || inert(*it, r.inert)) continue;
    if (policy.ignore_unsupported) {
      append_name(ignored, r.name);
      continue;
    }
    throw ApiError(ErrorKind::unsupported, fmt::format("'{}' is not supported: {}", r.name, r.why), r.name);
  }
}

std::set<std::string> table_field_names(Endpoint ep, bool refused_only) {
  const unsigned bit = ep == Endpoint::chat ? kChat : kCompletions;
  std::set<std::string> out;
  for (const Row& r : kRows)
    if ((r.endpoints & bit) && !(refused_only && r.harmless)) out.insert(r.name);
  return out;
}

}  // namespace qrig::server
