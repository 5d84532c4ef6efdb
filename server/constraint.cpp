// GrammarConstraint: TokenGrammar behind runtime::TokenConstraint, with the optional reasoning prefix.
#include "server/constraint.h"

namespace qrig::server {

namespace {
const std::string kThinkEnd = "</think>";
}

GrammarConstraint::GrammarConstraint(std::unique_ptr<text::TokenGrammar> grammar,
                                     std::shared_ptr<const text::Tokenizer> tok, bool thinking_prefix)
    : grammar_(std::move(grammar)), tok_(std::move(tok)), phase_(thinking_prefix ? Phase::reasoning : Phase::grammar) {}

bool GrammarConstraint::allowed(std::vector<bool>& mask) {
  switch (phase_) {
    case Phase::grammar:
      grammar_->allowed(mask);
      return true;
    case Phase::reasoning:
      // Anything but the end: the answer must still come. Control tokens other than end-of-generation
      // stay allowed as the unconstrained output would have them.
      for (size_t i = 0; i < mask.size(); ++i) mask[i] = !tok_->is_eog((int32_t)i);
      return true;
    case Phase::separator:
      // Tokens whose bytes are a non-empty prefix of what is left of the separator.
      for (size_t i = 0; i < mask.size(); ++i) {
        const std::string& b = tok_->token_to_bytes((int32_t)i);
        mask[i] = !b.empty() && separator_.compare(0, b.size(), b) == 0 && b.size() <= separator_.size() &&
                  !tok_->is_eog((int32_t)i);
      }
      return true;
  }
  return false;
}

void GrammarConstraint::accept(int32_t token) {
  switch (phase_) {
    case Phase::grammar:
      grammar_->accept(token);
      return;
    case Phase::reasoning:
      tail_ += tok_->token_to_bytes(token);
      if (size_t at = tail_.find(kThinkEnd); at != std::string::npos) {
        // Bytes after "</think>" in the same token count towards the separator.
        std::string rest = tail_.substr(at + kThinkEnd.size());
        separator_ = "\n\n";
        size_t n = 0;
        while (n < rest.size() && n < separator_.size() && rest[n] == '\n') ++n;
        separator_.erase(0, n);
        phase_ = separator_.empty() ? Phase::grammar : Phase::separator;
        return;
      }
      if (tail_.size() > kThinkEnd.size()) tail_.erase(0, tail_.size() - kThinkEnd.size());
      return;
    case Phase::separator:
      separator_.erase(0, tok_->token_to_bytes(token).size());
      if (separator_.empty()) phase_ = Phase::grammar;
      return;
  }
}

}  // namespace qrig::server
