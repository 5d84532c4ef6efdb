// Pass: the element types of the KV cache, keys and values separately. The CPU reference keeps fp32
// (exactness); the dp4a family (on the GPU, or emulated on the cpu) stores fp16 keys and fp16 values.
#include <fmt/format.h>

#include "compiler/passes/passes.h"

namespace qrig::compiler::passes {

void choose_kv_format(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  const bool reference = p.kernel_family == "reference";
  p.k_dtype = reference ? "f32" : "f16";
  p.v_dtype = reference ? "f32" : "f16";
  auto dtype = [](const std::string& s) { return s == "f32" ? ir::DType::f32 : ir::DType::f16; };
  for (auto& st : p.graph.states) {
    if (st.name.rfind("k.", 0) == 0) st.type.dtype = dtype(p.k_dtype);
    if (st.name.rfind("v.", 0) == 0) st.type.dtype = dtype(p.v_dtype);
  }
  p.notes.push_back(fmt::format("kv cache: {} keys, {} values{}", p.k_dtype, p.v_dtype,
                                reference ? " (reference precision)" : ""));
}

}  // namespace qrig::compiler::passes
