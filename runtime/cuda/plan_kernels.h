// The kernel variants a CUDA plan needs, read from its graph's shapes: what `qrig compile` will precompile
// and CI compiles for every architecture. Until choose_kernels names full variants in the plan, the block
// sizes and tilings here are the default family's defaults (variant.h); ops with no GPU kernel yet are
// listed as missing, so callers can tell "compiled everything" from "compiled everything that exists".
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

}  // namespace qrig::cuda
