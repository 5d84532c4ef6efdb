// Pass: how Gated DeltaNet runs. Steps of at least `gdn_recurrent_below` tokens use the chunked algorithm
// (64-token chunks); shorter ones (decode, speculative verify) use the recurrent step.
#include <fmt/format.h>

#include "compiler/passes/passes.h"

namespace qrig::compiler::passes {

void schedule_gdn(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  p.gdn_chunk = 64;
  p.gdn_recurrent_below = 16;
  for (auto& op : p.graph.ops)
    if (op.kind == "gdn") {
      op.set("chunk", p.gdn_chunk);
      op.set("recurrent_below", p.gdn_recurrent_below);
    }
  p.notes.push_back(fmt::format("gdn: chunked ({} tokens) for steps of >= {} tokens, recurrent below", p.gdn_chunk,
                                p.gdn_recurrent_below));
}

}  // namespace qrig::compiler::passes
