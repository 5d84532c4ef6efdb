// Pass: name the kernel variant of every op. CPU plans use the reference ops; CUDA plans name template
// variants with every parameter spelled out (the name is the cubin cache key).
#include <algorithm>

#include <fmt/format.h>

#include "compiler/passes/passes.h"

namespace qrig::compiler::passes {

void choose_kernels(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  if (p.backend == "cuda") {
    const int64_t asked = cx.options.precise_rows;
    p.precise_rows = std::min(asked < 0 ? kDefaultPreciseRows : asked, p.max_batch_tokens);
    p.notes.push_back(
        p.precise_rows >= p.max_batch_tokens
            ? "activations: two int8 planes (~15 bits) in every matmul"
            : fmt::format("activations: two int8 planes (~15 bits) in matmuls of <= {} rows (decode), one (int8, as "
                          "llama.cpp) above (prefill)",
                          p.precise_rows));
  }
  for (auto& op : p.graph.ops) op.set("kernel", fmt::format("{}.{}", p.backend == "cpu" ? "cpu" : p.kernel_family, op.kind));
  p.notes.push_back(p.backend == "cpu" ? "kernels: cpu reference ops (fp32, weights dequantized on the fly)"
                                       : "kernels: default family (dp4a matmuls, fp32 norms/GDN/attention, fp16 KV); variants chosen for the device's SMs");
}

}  // namespace qrig::compiler::passes
