// ServedModel::init: what the server derives once from the model's tokenizer (see served_model.h).
#include "server/served_model.h"

namespace qrig::server {

void ServedModel::init() {
  eog = tokenizer->eog_ids();
  tool_call_token = tokenizer->find_token("<tool_call>");
  grammar_vocab = text::TokenVocab::of(*tokenizer);
  silent_token.assign((size_t)tokenizer->n_vocab(), false);
  for (int32_t id = 0; id < tokenizer->n_vocab(); ++id) {
    if (tokenizer->token_type(id) != text::TokenType::Control) continue;
    const std::string& t = tokenizer->token_to_bytes(id);
    silent_token[(size_t)id] = t != "<think>" && t != "</think>" && t != "<tool_call>" && t != "</tool_call>";
  }
}

}  // namespace qrig::server
