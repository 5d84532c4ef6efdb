// TokenGrammar::regex and TokenGrammar::choice: plain-text outputs (not JSON) under a regular expression or a
// list of strings, as byte automata (grammar_dfa.h) turned into right-linear rules. They back vLLM's
// guided_regex / guided_choice and structured_outputs.regex / .choice.
#include "text/grammar.h"
#include "text/grammar_dfa.h"
#include "text/grammar_regex.h"
#include "text/grammar_rules.h"

namespace qrig::text {

namespace {

std::unique_ptr<TokenGrammar> from_dfa(const grammar::ByteDfa& d, const std::string& what,
                                       std::shared_ptr<const TokenVocab> vocab) {
  if (grammar::is_empty(d)) throw GrammarError(what + " matches no text");
  grammar::GrammarBuilder b;
  const uint32_t root = grammar::dfa_rule(b, d);
  return std::make_unique<TokenGrammar>(b.finish(root), std::move(vocab));
}

}  // namespace

std::unique_ptr<TokenGrammar> TokenGrammar::regex(const std::string& pattern, std::shared_ptr<const TokenVocab> vocab) {
  return from_dfa(grammar::pattern_dfa("^(?:" + pattern + ")$"), "the regular expression", std::move(vocab));
}

std::unique_ptr<TokenGrammar> TokenGrammar::choice(const std::vector<std::string>& choices,
                                                   std::shared_ptr<const TokenVocab> vocab) {
  if (choices.empty()) throw GrammarError("the choice list is empty");
  grammar::ByteNfa nfa;
  nfa.start = nfa.add_state();
  nfa.accept = nfa.add_state();
  for (const std::string& c : choices) {
    const uint32_t from = nfa.add_state(), to = nfa.add_state();
    nfa.eps(nfa.start, from);
    nfa.literal(from, to, c);
    nfa.eps(to, nfa.accept);
  }
  return from_dfa(grammar::determinize(nfa, "the choice list"), "the choice list", std::move(vocab));
}

}  // namespace qrig::text
