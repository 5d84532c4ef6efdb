// Pass: choose the backend and kernel family from the rig. Tensor-core families are never chosen for a rig
// whose probe says tensor cores are throttled; the default CUDA family uses DP4A and HFMA2/FP32 only.
#include <algorithm>

#include <fmt/format.h>

#include "compiler/passes/passes.h"

namespace qrig::compiler::passes {

void select_backend(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  if (cx.options.force_backend == "cpu" || !cx.rig.has_cuda()) {
    p.backend = "cpu";
    p.kernel_family = "reference";
    p.arch_target.clear();
    p.notes.push_back(cx.rig.has_cuda() ? "backend: cpu (forced by --backend cpu)"
                                        : "backend: cpu (the rig has no CUDA device)");
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
  p.arch_target = first->arch;
  p.device_sms = first->sms;
  for (const auto& d : cx.rig.devices)
    if (d.kind == "cuda" && d.sms > 0) p.device_sms = std::min<int64_t>(p.device_sms > 0 ? p.device_sms : d.sms, d.sms);
  p.kernel_family = "dp4a";
  bool throttled = false;
  for (const auto& d : cx.rig.devices) throttled |= d.kind == "cuda" && d.tensor_cores_throttled;
  p.notes.push_back(fmt::format("backend: cuda {} ({}), kernel family dp4a (DP4A + HFMA2/FP32, no tensor cores){}",
                                p.arch_target, first->name,
                                throttled ? "; the rig reports throttled tensor cores" : ""));
}

}  // namespace qrig::compiler::passes
