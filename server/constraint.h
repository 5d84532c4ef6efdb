// Constrained decoding for the server: adapts text::TokenGrammar (token masks over the vocabulary) to the
// engine's runtime::TokenConstraint, and builds the constraints a request asks for:
//   - tool_choice "required" / a named function: TokenGrammar::tool_call (its own thinking prefix);
//   - the output's shape (OutputSpec): response_format json_object / json_schema, llama.cpp's json_schema,
//     vLLM's guided_json / guided_regex / guided_choice and structured_outputs: TokenGrammar::json_schema,
//     ::regex, ::choice. With thinking on, the constrained text must come after the reasoning, as the chat
//     template lays it out: free text (end-of-generation refused) up to "</think>", then "\n\n", then the
//     grammar. That prefix is GrammarConstraint's reasoning phase;
//   - allowed_token_ids (vLLM): only those ids;
//   - a thinking budget (Anthropic thinking.budget_tokens, vLLM thinking_token_budget): after that many
//     reasoning tokens "</think>" is the only token allowed, so the answer follows.
// Several at once are combined by ConstraintChain (the intersection of their masks). The constraints run on
// the engine thread, one set per sequence.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/engine.h"
#include "server/request_parse.h"
#include "server/served_model.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

namespace qrig::server {

class GrammarConstraint final : public runtime::TokenConstraint {
 public:
  // thinking_prefix: the output starts inside <think>: the grammar applies after "</think>\n\n".
  GrammarConstraint(std::unique_ptr<text::TokenGrammar> grammar, std::shared_ptr<const text::Tokenizer> tok,
                    bool thinking_prefix);
  bool allowed(std::vector<bool>& mask) override;
  void accept(int32_t token) override;

 private:
  enum class Phase { reasoning, separator, grammar };
  std::unique_ptr<text::TokenGrammar> grammar_;
  std::shared_ptr<const text::Tokenizer> tok_;
  Phase phase_;
  std::string tail_;       // last bytes of the reasoning (to spot "</think>" however it was tokenized)
  std::string separator_;  // what is left of "\n\n"
};

// Only `ids` may come (a fixed mask).
class AllowedTokens final : public runtime::TokenConstraint {
 public:
  AllowedTokens(const std::vector<int32_t>& ids, size_t n_real);
  bool allowed(std::vector<bool>& mask) override;
  void accept(int32_t) override {}

 private:
  std::vector<bool> allowed_;
};

// After `budget` tokens inside the reasoning (the output starts inside <think>), only "</think>" (a single
// token in Qwen's vocabulary) may come; once it has, nothing is constrained.
class ThinkingBudget final : public runtime::TokenConstraint {
 public:
  ThinkingBudget(int64_t budget, int32_t think_end) : budget_(budget), think_end_(think_end) {}
  bool allowed(std::vector<bool>& mask) override;
  void accept(int32_t token) override;

 private:
  int64_t budget_, used_ = 0;
  int32_t think_end_;
  bool closed_ = false;
};

// The intersection of several constraints' masks (the parts that constrain at this point).
class ConstraintChain final : public runtime::TokenConstraint {
 public:
  explicit ConstraintChain(std::vector<std::shared_ptr<runtime::TokenConstraint>> parts) : parts_(std::move(parts)) {}
  bool allowed(std::vector<bool>& mask) override;
  void accept(int32_t token) override;

 private:
  std::vector<std::shared_ptr<runtime::TokenConstraint>> parts_;
  std::vector<bool> scratch_;
};

// What a request asks the output to be.
struct OutputSpec {
  enum class Kind { none, json, regex, choice };
  Kind kind = Kind::none;
  nlohmann::ordered_json schema;     // json: the schema ({} = any JSON object)
  std::string regex;                 // regex: the whole output matches it
  std::vector<std::string> choices;  // choice: the output is one of them
  std::string param;                 // the request field it came from (named in errors)
};

// Reads response_format (OpenAI; llama.cpp's {"type": "json_object" | "json_schema", "schema"} too),
// json_schema (llama.cpp), guided_json / guided_regex / guided_choice (vLLM, legacy) and structured_outputs
// (vLLM: json, regex, choice, json_object). At most one may be given. Adds the keys to `known`. Throws ApiError.
OutputSpec parse_output_spec(const Json& body, std::set<std::string>& known);

// A maker of one sequence's constraint set (tool calls or the output spec, allowed ids, thinking budget);
// null when nothing is constrained. Called once per sample (constraints hold per-sequence state).
using ConstraintMaker = std::function<std::shared_ptr<runtime::TokenConstraint>()>;

// The grammar of `spec` (not none): throws ApiError(invalid_request, param = spec.param) when it cannot be
// honoured. thinking: the output starts inside <think>.
ConstraintMaker output_constraint(const OutputSpec& spec, const ServedModel& model, bool thinking);
// Combines makers (empty ones skipped) into one: null result when every part is.
ConstraintMaker combine(std::vector<ConstraintMaker> parts);

}  // namespace qrig::server
