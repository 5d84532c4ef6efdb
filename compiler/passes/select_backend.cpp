// Pass: choose the backend and kernel family from the rig. Tensor-core families are never chosen for a rig
// whose probe says tensor cores are throttled; the default CUDA family uses DP4A and HFMA2/FP32 only. The
// CPU runs the reference family (fp32 throughout) or, asked to, the dp4a family's numerics (int8 matmul
// inputs, fp16 keys and values: "dp4a-emulated"), which shows how much of a GPU difference is the family's
// arithmetic rather than a kernel. Also fixes the tuning data the kernel choices model the GPU with.
#include <algorithm>

#include <fmt/format.h>

#include "compiler/passes/passes.h"
#include "kernels/matmul.h"

namespace qrig::compiler::passes {

namespace {

// The GPU executor runs Q8_0 matrices (repacked at load) and the block types the dp4a family decodes (Q4_0 ..
// Q6_K, IQ4_NL, IQ4_XS: kernels/matmul.h wq_*), as matmuls and as the embedding: a CUDA plan for a model with a
// matrix of any other type is refused here, naming the tensor and its type, before any pass sizes or places it.
// The CPU backend runs every type qrig dequantizes.
void require_cuda_weight_types(const CompileContext& cx) {
  for (const ir::Op& op : cx.plan.graph.ops) {
    if (op.kind != ir::OpKind::embed && op.kind != ir::OpKind::matmul) continue;
    const gguf::TensorInfo* t = cx.file.find_tensor(op.s("weight"));
    if (!t) throw CompileError(fmt::format("{}: tensor '{}' is missing", op.describe(), op.s("weight")));
    if (t->type == gguf::TensorType::Q8_0 || kernels::wq_dp4a_type((int64_t)t->type)) continue;
    const char* type = gguf::tensor_type_name(t->type);
    throw CompileError(fmt::format("{}: weight {} is {}; the CUDA backend has kernels for Q8_0, Q4_0, Q4_1, Q5_0, "
                                   "Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS matrices (none for {} yet): "
                                   "compile with --backend cpu, which runs {}",
                                   op.describe(), t->name, type, type, gguf::dequantizable_types()));
  }
}

}  // namespace

void select_backend(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  const bool emulate = cx.options.family == "dp4a-emulated";
  if (!cx.options.family.empty() && !emulate)
    throw CompileError(fmt::format("unknown kernel family '{}' (dp4a-emulated runs the dp4a numerics on the cpu)",
                                   cx.options.family));
  if (cx.options.force_backend == "cpu" || !cx.rig.has_cuda() || emulate) {
    if (emulate && cx.options.force_backend == "cuda")
      throw CompileError("the dp4a-emulated family runs on the cpu backend");
    if (cx.options.ptx_jit) throw CompileError("PTX loading (--ptx) is for CUDA plans; this plan runs on the cpu");
    p.backend = "cpu";
    p.kernel_family = emulate ? "dp4a-emulated" : "reference";
    p.arch_target.clear();
    p.notes.push_back(emulate ? "backend: cpu running the dp4a family's numerics (int8 matmul inputs, fp16 keys and "
                                "values), to compare with a GPU"
                      : cx.rig.has_cuda() ? "backend: cpu (forced by --backend cpu)"
                                          : "backend: cpu (the rig has no CUDA device)");
    cx.tuning = kernels::default_tuning(90);
    return;
  }
  if (!cx.options.force_backend.empty() && cx.options.force_backend != "cuda")
    throw CompileError(fmt::format("unknown backend '{}' (cpu or cuda)", cx.options.force_backend));
  const RigDevice* first = nullptr;
  for (const auto& d : cx.rig.devices)
    if (d.kind == "cuda") {
      if (first && d.arch != first->arch)
        throw CompileError(fmt::format("rig mixes {} and {}: one plan targets one architecture", first->arch, d.arch));
      if (!first) first = &d;
    }
  p.backend = "cuda";
  require_cuda_weight_types(cx);
  p.arch_target = first->arch;
  p.device_sms = first->sms;
  for (const auto& d : cx.rig.devices)
    if (d.kind == "cuda" && d.sms > 0) p.device_sms = std::min<int64_t>(p.device_sms > 0 ? p.device_sms : d.sms, d.sms);
  if (p.device_sms <= 0) throw CompileError(fmt::format("rig '{}': the CUDA devices need sms > 0", cx.rig.name));
  p.kernel_family = "dp4a";
  bool throttled = false;
  for (const auto& d : cx.rig.devices) throttled |= d.kind == "cuda" && d.tensor_cores_throttled;
  const int sm = std::stoi(p.arch_target.substr(3));
  cx.tuning = cx.rig.tuning_for(sm);
  p.tuning_source = cx.tuning.source;
  p.notes.push_back(fmt::format("backend: cuda {} ({}), kernel family dp4a (DP4A + HFMA2/FP32, no tensor cores){}",
                                p.arch_target, first->name,
                                throttled ? "; the rig reports throttled tensor cores" : ""));
  p.notes.push_back("tuning: " + cx.tuning.source);
  p.kernel_code = cx.options.ptx_jit ? "ptx" : "cubin";
  if (cx.options.ptx_jit)
    p.notes.push_back(fmt::format("kernels: loaded as {} PTX through the driver's JIT, so any GPU of {} or newer runs "
                                  "this plan (for checking the {} kernel family on another GPU; its speed there is "
                                  "not a {} GPU's)", p.arch_target, p.arch_target, p.arch_target, p.arch_target));
}

}  // namespace qrig::compiler::passes
