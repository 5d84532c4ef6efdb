// The one error type of constrained decoding (text/grammar*.h): a schema or tool set that cannot be turned
// into a grammar, or a token that the grammar does not allow. The server maps it to a 400 response when it
// comes from building a grammar.
#pragma once

#include <stdexcept>

namespace qrig::text {

struct GrammarError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace qrig::text
