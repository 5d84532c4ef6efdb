// The checks every no-GPU compile test makes on an NVRTC result: one entry point named like the template with
// the variant's block size in its PTX (__launch_bounds__), ptxas reports registers and no spills, no tensor-core
// instruction in the default family on any arch, and nothing newer than sm_70 when compiled for the sm_70
// feature set (the CMP rigs); the grid-dependency wait exactly on sm_90+ code. Area tests add their own checks after calling it.
#pragma once

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/ptx_scan.h"
#include "runtime/cuda/variant.h"
#include "tests/cuda/cuda_test_util.h"

namespace qrig::cuda::test {

inline void check_compiled_kernel(const CompiledKernel& k, int feature_sm) {
  INFO(k.variant.name << " for feature sm_" << feature_sm << " (code sm_" << k.arch.target_sm << ")\n" << k.log);
  const auto entries = ptx_entries(k.ptx);
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].name == k.variant.kernel);
  CHECK(entries[0].maxntid == k.variant.threads());
  const PtxasReport r = parse_ptxas_report(k.log);
  CHECK(r.registers > 0);
  CHECK(r.spill_store_bytes == 0);
  CHECK(r.spill_load_bytes == 0);
  // Every kernel waits for the one before it on sm_90+ code (a plan with programmatic_launch overlaps their
  // launches) and has no such instruction below.
  // (except the templates launched plainly by design: TemplateInfo::plain_launch).
  const TemplateInfo* info = find_template_info(k.variant.kernel);
  CHECK(waits_for_previous_grid(k.ptx) == (k.arch.target_sm >= 90 && !(info && info->plain_launch)));
  for (const auto& f : scan_ptx_newer_than_sm70(k.ptx)) {
    INFO("PTX line " << f.line << ": " << f.instruction << " (" << f.why << ")");
    CHECK(f.why.find("tensor-core") == std::string::npos);  // never in the default family, on any arch
    CHECK(feature_sm != 70);                                // nothing newer than sm_70 in an sm_70 build
  }
}

// Compiles every job into a fresh cache (tests/cuda/cuda_test_util.h compile_all), fails the test for each
// compile error and makes check_compiled_kernel's checks on every result; returns the results in job order (an
// empty cubin where compiling failed) for the area's own checks.
inline std::vector<CompiledKernel> compile_and_check(const std::string& tag, const std::vector<CompileJob>& jobs) {
  ScratchDir dir(tag);
  KernelCompiler compiler(dir.path);
  std::vector<std::string> errors;
  std::vector<CompiledKernel> out = compile_all(compiler, jobs, errors);
  for (const auto& e : errors) FAIL_CHECK(e);
  for (size_t i = 0; i < jobs.size(); ++i)
    if (!out[i].cubin.empty()) check_compiled_kernel(out[i], jobs[i].sm);
  return out;
}

}  // namespace qrig::cuda::test
