// Pass: how Gated DeltaNet runs. Steps of at least `gdn_recurrent_below` tokens use the chunked algorithm
// (64-token chunks); shorter ones (decode, speculative verify) use the recurrent step.
#include <fmt/format.h>

#include "compiler/passes/passes.h"

namespace qrig::compiler::passes {

void schedule_gdn(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  p.gdn_chunk = 64;
  // On the GPU the recurrent kernel beats the chunked pair up to ~64 tokens (H200: 49.6 us vs 51.5 us at
  // T = 64, 15 vs 40 us at T = 16; tests/gpu/bench_gpu_gdn.cpp); the CPU reference switches at 16.
  p.gdn_recurrent_below = p.backend == "cuda" ? 64 : 16;
  for (auto& op : p.graph.ops)
    if (op.kind == "gdn") {
      op.set("chunk", p.gdn_chunk);
      op.set("recurrent_below", p.gdn_recurrent_below);
    }
  p.notes.push_back(fmt::format("gdn: chunked ({} tokens) for steps of >= {} tokens, recurrent below", p.gdn_chunk,
                                p.gdn_recurrent_below));
}

}  // namespace qrig::compiler::passes
