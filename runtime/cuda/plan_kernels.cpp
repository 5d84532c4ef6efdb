// The kernel variants a CUDA plan names (plan_kernels.h), and precompiling them.
#include "runtime/cuda/plan_kernels.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "ir/kernel_attr.h"

namespace qrig::cuda {

std::vector<Variant> plan_kernels(const ir::Plan& plan) {
  if (plan.backend != "cuda")
    throw KernelError(fmt::format("plan for rig '{}' targets the {} backend, not cuda", plan.rig_name, plan.backend));
  if (plan.kernel_family != "dp4a")
    throw KernelError(fmt::format("plan kernel family '{}' has no CUDA kernels (only dp4a)", plan.kernel_family));
  std::map<std::string, Variant> all;
  auto add = [&](const std::string& name) { all.try_emplace(name, parse_variant(name)); };
  const ir::Graph& g = plan.graph;
  // The main graph's ops, and a plan that drafts its MTP head's (draft.ir).
  for (const ir::Graph* graph : {&plan.graph, &plan.draft}) {
    if (graph == &plan.draft && plan.draft_tokens <= 0) continue;
    for (const ir::Op& op : graph->ops) {
      if (!op.has("kernel")) {
        if (op.kind != ir::OpKind::gather_rows && op.kind != ir::OpKind::bridge)
          throw KernelError(fmt::format("plan: {} names no kernel (recompile the plan)", op.describe()));
        continue;
      }
      for (const char* attr : {"kernel", "decode_kernel"})  // decode_kernel: the batched decode variants
        if (op.has(attr))
          for (const auto& r : ir::parse_launch_ranges(op.s(attr)))
            for (const auto& part : r.parts)
              for (const auto& name : part) add(name);
    }
  }
  const ir::AttrValue* argmax = g.attr("argmax_kernel");
  const ir::AttrValue* topk = g.attr("top_k_kernels");
  if (!argmax || !std::holds_alternative<std::string>(*argmax) || !topk ||
      !std::holds_alternative<std::vector<std::string>>(*topk))
    throw KernelError("plan: the graph names no argmax_kernel / top_k_kernels (recompile the plan)");
  add(std::get<std::string>(*argmax));
  for (const auto& n : std::get<std::vector<std::string>>(*topk)) add(n);
  std::vector<Variant> out;
  for (auto& [name, v] : all) out.push_back(std::move(v));
  return out;
}

}  // namespace qrig::cuda

#include <atomic>
#include <mutex>
#include <thread>

namespace qrig::cuda {

ArchChoice plan_arch(const ir::Plan& plan) {
  const int feature = parse_sm(plan.arch_target);
  if (plan.kernel_nvrtc.empty()) return choose_arch(feature);
  return choose_arch(feature, plan.kernel_nvrtc, parse_sm(plan.kernel_target));
}

ArchChoice record_plan_arch(ir::Plan& plan) {
  const ArchChoice a = choose_arch(parse_sm(plan.arch_target));
  plan.kernel_nvrtc = a.nvrtc;
  plan.kernel_target = fmt::format("sm_{}", a.target_sm);
  plan.notes.push_back(a.substituted() ? a.note
                                       : fmt::format("kernels: {} code ({}) by NVRTC {} ({})", plan.kernel_target,
                                                     plan.kernel_code == "ptx" ? "PTX, loaded through the driver's JIT"
                                                                               : "cubins, PTX kept",
                                                     a.nvrtc, a.lib ? a.lib->path : "not on this machine"));
  return a;
}

PrecompileResult precompile_plan_kernels(const ir::Plan& plan, KernelCompiler& compiler, int threads) {
  const std::vector<Variant> variants = plan_kernels(plan);
  const ArchChoice arch = plan_arch(plan);
  PrecompileResult r;
  r.variants = (int64_t)variants.size();
  std::atomic<size_t> next{0};
  std::atomic<int64_t> compiled{0}, cached{0};
  std::mutex mu;
  std::vector<std::string> errors;
  auto work = [&] {
    for (size_t i; (i = next++) < variants.size();) {
      try {
        CompiledKernel k = compiler.get(variants[i], arch);
        (k.from_disk ? cached : compiled)++;
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(e.what());
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, threads); ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (!errors.empty()) {
    std::string all;
    for (const auto& e : errors) all += "\n  " + e;
    throw KernelError(fmt::format("{} of {} kernel variants failed to compile:{}", errors.size(), r.variants, all));
  }
  r.compiled = compiled;
  r.cached = cached;
  r.notes = compiler.notes();
  return r;
}

}  // namespace qrig::cuda
