// Internal to server/: a chat-completions request read and validated (tools, tool_choice, logprobs,
// response_format and the other output constraints, the rendered and tokenized prompt, sampling), and
// ChatOutput, which turns generated text into message deltas (reasoning / content / tool calls) for both the
// streamed and the whole response. The Anthropic Messages and OpenAI Responses endpoints convert their
// requests into a chat body and use the same two.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/constraint.h"
#include "server/generation.h"
#include "server/request_fields.h"
#include "server/request_parse.h"
#include "text/output_parser.h"

namespace qrig::server {

struct ToolChoice {
  enum class Mode { none, automatic, required, named };
  Mode mode = Mode::automatic;
  std::string name;  // named
};

struct ChatRequest {
  nlohmann::json tools;  // the request's tools array, or null when it has none
  ToolChoice choice;
  bool parallel_tool_calls = true;
  bool thinking = false;  // the prompt opens a <think> block (output starts in the reasoning)
  bool include_reasoning = true;  // false (vLLM include_reasoning): the reasoning is left out of the response
  bool parse_reasoning = true;    // false (llama.cpp reasoning_format "none"): the reasoning stays in the content
  bool continued = false;         // the last (assistant) message is continued
  GenParams gen;
  ConstraintMaker make_constraint;  // tool_choice required/named, the output spec, allowed ids, thinking budget
  std::vector<int32_t> prompt;
  std::string ignored;  // unknown (or, with FieldPolicy::ignore_unsupported, refused) fields, comma-separated
};

// Throws ApiError for anything invalid or unsupported (see docs/server.md).
ChatRequest parse_chat_request(const Json& body, const ServedModel& model, const FieldPolicy& policy = {});

// What the chat template would render silently but is a malformed request: a user, system or tool message
// without content, a reasoning_content that is not a string. Throws ApiError(invalid_request, "messages").
void check_messages(const Json& messages);

class ChatOutput {
 public:
  ChatOutput(const ChatRequest& req, const ServedModel& model);
  // The parser's view of the output: reasoning first (thinking), and tool calls when the request allows them.
  // The deltas for one generation step (the parser's held-back text is released when step.done), and how
  // many of the step's tokens they used. Applies parallel_tool_calls = false: the output ends with the first
  // complete call (later tokens are dropped, the generation is stopped, finish reason "tool_calls").
  struct Fed {
    std::vector<text::Delta> deltas;
    size_t tokens_used = 0;
  };
  Fed feed(const Generation::Step& step, Generation& gen);
  // The OpenAI finish_reason once the generation is done ("tool_calls" when a call was made).
  std::string finish_reason(const Generation& gen) const;
  // Tokens generated inside the reasoning (before </think>); 0 when the request has no reasoning.
  int64_t reasoning_tokens() const { return reasoning_tokens_; }
  // OpenAI chat logprobs entries ({token, logprob, bytes, top_logprobs}) for some tokens.
  nlohmann::json logprob_entries(const std::vector<runtime::TokenEvent>& tokens) const;

 private:
  const ServedModel& model_;
  text::OutputStreamParser parser_;
  bool thinking_;
  bool parallel_;
  bool include_reasoning_;
  std::optional<int32_t> think_end_;
  bool think_closed_ = false;
  int64_t reasoning_tokens_ = 0;
  bool any_call_ = false, finished_ = false;
};

}  // namespace qrig::server
