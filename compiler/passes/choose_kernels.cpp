// Pass: name the kernel variant of every op. CPU plans use the reference ops; CUDA plans name template
// variants with every parameter spelled out (the name is the cubin cache key).
#include <fmt/format.h>

#include "compiler/passes/passes.h"

namespace qrig::compiler::passes {

void choose_kernels(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  for (auto& op : p.graph.ops) op.set("kernel", fmt::format("{}.{}", p.backend == "cpu" ? "cpu" : p.kernel_family, op.kind));
  p.notes.push_back(p.backend == "cpu" ? "kernels: cpu reference ops (fp32, weights dequantized on the fly)"
                                       : "kernels: default family (dp4a matmuls, fp32 norms/GDN/attention, fp16 KV); variants chosen for the device's SMs");
}

}  // namespace qrig::compiler::passes
