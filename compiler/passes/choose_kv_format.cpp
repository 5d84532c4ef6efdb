// Pass: KV cache element type. The CPU reference keeps fp32 (exactness); CUDA plans store fp16 K and V.
#include <fmt/format.h>

#include "compiler/passes/passes.h"

namespace qrig::compiler::passes {

void choose_kv_format(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  p.kv_dtype = p.backend == "cpu" ? "f32" : "f16";
  const ir::DType dt = p.kv_dtype == "f32" ? ir::DType::f32 : ir::DType::f16;
  for (auto& st : p.graph.states)
    if (st.name.rfind("kv.", 0) == 0) st.type.dtype = dt;
  p.notes.push_back(fmt::format("kv cache: {} keys and values{}", p.kv_dtype,
                                p.backend == "cpu" ? " (reference precision)" : ""));
}

}  // namespace qrig::compiler::passes
