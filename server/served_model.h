// What the server serves: the engine (runtime's narrow interface), the model's tokenizer and the names the
// API shows. The CLI builds it once the model is loaded and hands it to HttpServer::set_model.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "text/grammar_vocab.h"
#include "text/tokenizer.h"

namespace qrig::server {

class Metrics;  // server/metrics.h

struct ServedModel {
  std::shared_ptr<runtime::Engine> engine;
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::string id;        // the model name in /v1/models and in every response ("model")
  std::string path;      // the GGUF or plan the model came from (shown in /v1/models)
  int64_t created = 0;   // unix seconds the model was loaded
  // Where every generation reports how it ended (latency histograms, finish reasons); set by
  // HttpServer::set_model. May be null (then nothing is reported).
  std::shared_ptr<Metrics> metrics;

  // Derived from the tokenizer by init(): end-of-generation ids, the single-token "<tool_call>" (if the
  // vocabulary has one) that tool_choice "none" bans, and the vocabulary as constrained decoding sees it.
  std::vector<int32_t> eog;
  std::optional<int32_t> tool_call_token;
  std::shared_ptr<const text::TokenVocab> grammar_vocab;
  // Control tokens that add no output text by default (<|im_start|>, vision and FIM markers...): every control
  // token except the tags the output parser reads (<think>, </think>, <tool_call>, </tool_call>), which real
  // Qwen3.5 GGUFs also mark as control.
  std::vector<bool> silent_token;
  void init();
};

}  // namespace qrig::server
