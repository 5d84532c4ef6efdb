// The kernel variants a CUDA plan names: every op's `kernel` and `decode_kernel` attributes (ir/kernel_attr.h) and the graph's
// output-row kernels (argmax_kernel, top_k_kernels). This is what `qrig compile` precompiles, what CI compiles
// for every architecture, and exactly what the executor loads when it binds the plan (a test compares them):
// the runtime reads these names and chooses none.
#pragma once

#include <string>
#include <vector>

#include "ir/plan.h"
#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/variant.h"

namespace qrig::cuda {

// Sorted by name, each once. Throws KernelError when the plan is not a CUDA plan of the dp4a family, an op
// that needs kernels names none, or a name is not a valid variant.
std::vector<Variant> plan_kernels(const ir::Plan& plan);

// The NVRTC and code target of a plan's kernels: what it recorded (kernel_nvrtc, kernel_target; that NVRTC
// need not be on this machine when the kernels are cached), else the choice here (choose_arch). Throws
// KernelError when nothing can compile the plan's architecture, naming what to install.
ArchChoice plan_arch(const ir::Plan& plan);
// Makes this machine's choice part of the plan: kernel_nvrtc, kernel_target and a note saying which NVRTC
// builds what (and when it is degraded, what to install). `qrig compile` calls it before writing the plan.
ArchChoice record_plan_arch(ir::Plan& plan);

struct PrecompileResult {
  int64_t variants = 0, compiled = 0, cached = 0;
  std::vector<std::string> notes;  // arch substitutions
};
// Compiles (or finds in the cache) every variant of plan_kernels(plan) for plan_arch(plan), on up to
// `threads` threads. Throws KernelError listing every variant that failed.
PrecompileResult precompile_plan_kernels(const ir::Plan& plan, KernelCompiler& compiler, int threads);

}  // namespace qrig::cuda
