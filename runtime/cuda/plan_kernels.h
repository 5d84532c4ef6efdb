// The kernel variants a CUDA plan needs, read from its graph's shapes: what `qrig compile` will precompile
// and CI compiles for every architecture; the executor loads the same variants when it binds the plan. Ops
// with no GPU kernel are listed as missing, so callers can tell "compiled everything" from "compiled
// everything that exists".
#pragma once

#include <string>
#include <vector>

#include "ir/plan.h"
#include "runtime/cuda/variant.h"

namespace qrig::cuda {

struct PlanKernels {
  std::vector<Variant> variants;     // sorted by name, each once
  std::vector<std::string> missing;  // op kinds (or "kind (what)") without a GPU kernel yet, each once
};

// Throws KernelError when the plan is not a CUDA plan of the dp4a family or a shape is not what the
// kernels need (e.g. a matmul input that is not a multiple of 32).
PlanKernels plan_kernels(const ir::Plan& plan);

// Whether an rmsnorm op's result is a matmul input: its kernel then also quantizes the row for the matmul
// (rmsnorm_f32 with q = 1 or 2 planes, fused), and the plan needs those variants.
bool rmsnorm_feeds_matmul(const ir::Graph& g, const ir::Op& norm);

}  // namespace qrig::cuda

#include "runtime/cuda/nvrtc.h"

namespace qrig::cuda {

struct PrecompileResult {
  int64_t variants = 0, compiled = 0, cached = 0;
  std::vector<std::string> notes;  // arch substitutions
};
// Compiles (or finds in the cache) every variant of plan_kernels(plan) for the plan's feature set, on up to
// `threads` threads. Throws KernelError listing every variant that failed.
PrecompileResult precompile_plan_kernels(const ir::Plan& plan, KernelCompiler& compiler, int threads);

}  // namespace qrig::cuda
