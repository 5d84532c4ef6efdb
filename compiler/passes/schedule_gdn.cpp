// Pass: how Gated DeltaNet runs. Steps of at least `gdn_recurrent_below` tokens of a sequence use the chunked
// algorithm (64-token chunks); shorter ones (decode, speculative verify) use the recurrent step. Where the
// recurrent kernel stops paying is tuning data on the GPU (kernels/tuning.h); the CPU reference switches at 16.
#include <fmt/format.h>

#include "compiler/passes/passes.h"

namespace qrig::compiler::passes {

void schedule_gdn(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  p.gdn_chunk = 64;
  p.gdn_recurrent_below = p.kernel_family == "reference" ? 16 : cx.tuning.gdn_recurrent_below;
  for (auto& op : p.graph.ops)
    if (op.kind == ir::OpKind::gdn) {
      op.set("chunk", p.gdn_chunk);
      op.set("recurrent_below", p.gdn_recurrent_below);
    }
  p.notes.push_back(fmt::format("gdn: chunked ({} tokens) for steps of >= {} tokens per sequence, recurrent below",
                                p.gdn_chunk, p.gdn_recurrent_below));
}

}  // namespace qrig::compiler::passes
