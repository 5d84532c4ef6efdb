// Constrained decoding for the server: adapts text::TokenGrammar (token masks over the vocabulary) to the
// engine's runtime::TokenConstraint, and builds the constraint a chat request asks for:
//   - tool_choice "required" / a named function: TokenGrammar::tool_call (its own thinking prefix);
//   - response_format json_object / json_schema: TokenGrammar::json_schema. With thinking on, the JSON must
//     come after the reasoning, as the chat template lays it out: free text (end-of-generation refused) up
//     to "</think>", then "\n\n", then the grammar. That prefix is ThinkingPrefix below.
// The constraint runs on the engine thread, one per request.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/engine.h"
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

}  // namespace qrig::server
