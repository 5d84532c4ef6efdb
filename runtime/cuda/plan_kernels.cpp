// Kernel variants of a CUDA plan (see plan_kernels.h).
#include "runtime/cuda/plan_kernels.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

namespace qrig::cuda {

namespace {

// The last dimension of a value's type (the row length of [T][C] activations).
int64_t row_length(const ir::Graph& g, const std::string& value, const ir::Op& op) {
  const ir::Type* t = g.type_of(value);
  if (!t || t->shape.empty() || t->shape.back() <= 0)
    throw KernelError(fmt::format("plan: {} has an argument %{} without a fixed row length", op.describe(), value));
  return t->shape.back();
}

int64_t result_length(const ir::Op& op) {
  if (op.type.shape.empty() || op.type.shape.back() <= 0)
    throw KernelError(fmt::format("plan: {} has no fixed row length", op.describe()));
  return op.type.shape.back();
}

}  // namespace

PlanKernels plan_kernels(const ir::Plan& plan) {
  if (plan.backend != "cuda")
    throw KernelError(fmt::format("plan for rig '{}' targets the {} backend, not cuda", plan.rig_name, plan.backend));
  if (plan.kernel_family != "dp4a")
    throw KernelError(fmt::format("plan kernel family '{}' has no CUDA kernels (only dp4a)", plan.kernel_family));
  std::set<std::string> names, missing;
  std::vector<Variant> variants;
  auto add = [&](Variant v) {
    if (names.insert(v.name).second) variants.push_back(std::move(v));
  };
  for (const ir::Op& op : plan.graph.ops) {
    if (op.kind == "embed") {
      add(embed_q8_0_variant(result_length(op)));
    } else if (op.kind == "rmsnorm") {
      add(rmsnorm_f32_variant(result_length(op)));
    } else if (op.kind == "matmul") {
      // Decode (one row per sequence): quantize the activation, dp4a GEMV. Prefill needs a GEMM.
      const int64_t k = row_length(plan.graph, op.args.at(0), op);
      if (k % 32 != 0)
        throw KernelError(fmt::format("plan: {} has an input of {} values, not a multiple of 32", op.describe(), k));
      add(quant_act_q8_variant());
      add(gemv_q8_0_variant(k));
      missing.insert("matmul (prefill GEMM)");
    } else {
      missing.insert(op.kind);
    }
  }
  std::sort(variants.begin(), variants.end());
  return {std::move(variants), {missing.begin(), missing.end()}};
}

}  // namespace qrig::cuda
