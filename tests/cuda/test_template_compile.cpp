// CI without a GPU: every kernel variant that a plan for rigs/h200.toml or rigs/cmp-100-210-x4.toml requests
// (tiny, 9B and 27B models) compiles with NVRTC for sm_75, sm_80, sm_86, sm_89 and sm_90 (by the newest NVRTC
// found: 13 in CI), and for the CMP rig's sm_70 with an NVRTC that targets it (11.8 from Debian non-free in
// CI: scripts/install-deps.sh). Each cubin's PTX declares the variant's block size (__launch_bounds__), ptxas
// reports no register spills, no default-family kernel uses tensor cores on any arch; every kernel of the
// CMP plans has PTX saying `.target sm_70` with no instruction newer than sm_70, and an sm_70 cubin.
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include <fmt/format.h>

#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/plan_kernels.h"
#include "runtime/cuda/ptx_scan.h"
#include "tests/cuda/compiled_checks.h"
#include "kernels/matmul.h"
#include "kernels/pointwise.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/missing_input.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::kernels;

namespace {

const std::vector<std::string> kModels = {"tiny", "9b", "27b"};
const std::vector<std::string> kRigNames = {"h200", "cmp-100-210-x4"};
const std::vector<int> kCiArchs = {75, 80, 86, 89, 90};

using Job = cuda::test::CompileJob;

// Compiles every job; a failure fails the test case.
std::vector<CompiledKernel> compile_all(KernelCompiler& c, const std::vector<Job>& jobs) {
  std::vector<std::string> errors;
  auto out = cuda::test::compile_all(c, jobs, errors);
  for (const auto& e : errors) FAIL_CHECK(e);
  return out;
}

}  // namespace

TEST_CASE("every variant of the preset plans compiles for every CI arch; the CMP plans' kernels are sm_70 code",
          "[cuda][fixtures]") {
  bool sm70_nvrtc = false;
  for (const NvrtcLib& l : nvrtc_libraries()) sm70_nvrtc |= l.supports(70);
  QRIG_REQUIRE_INPUT(sm70_nvrtc, "an NVRTC that targets sm_70 (found: "
                                     << nvrtc_versions() << "); " << nvrtc_install_hint(70));
  // The variants per plan, and which feature set each plan compiles for.
  std::map<std::string, Variant> all;
  std::vector<Job> jobs;
  std::set<std::string> cmp_variants;
  int cmp_sm = 0;
  for (const auto& rig : kRigNames)
    for (const auto& model : kModels) {
      const ir::Plan& p = cuda::test::preset_plan(model, rig);
      for (const Variant& v : plan_kernels(p)) {
        all.emplace(v.name, v);
        if (rig == "cmp-100-210-x4") {
          cmp_variants.insert(v.name);
          cmp_sm = parse_sm(p.arch_target);
        }
      }
    }
  REQUIRE(cmp_sm == 70);
  REQUIRE(all.size() >= 14);
  for (const auto& [name, v] : all)
    for (int sm : kCiArchs) jobs.push_back({v, sm});
  for (const auto& name : cmp_variants) jobs.push_back({all.at(name), cmp_sm});

  cuda::test::ScratchDir dir("template-compile");
  KernelCompiler compiler(dir.path);
  const auto kernels = compile_all(compiler, jobs);
  CHECK(compiler.compiles() == (int64_t)jobs.size());  // each (variant, feature set) compiled exactly once

  int cmp_scanned = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const CompiledKernel& k = kernels[i];
    if (k.cubin.empty()) continue;  // reported by compile_all
    cuda::test::check_compiled_kernel(k, jobs[i].sm);  // cmp_sm is 70: the CMP plans' PTX holds nothing newer
    INFO(k.variant.name << " for sm_" << jobs[i].sm << " by NVRTC " << k.arch.nvrtc);
    CHECK(k.arch.target_sm == jobs[i].sm);  // real code for every architecture, sm_70 included
    CHECK(ptx_target(k.ptx) == fmt::format("sm_{}", jobs[i].sm));
    CHECK(cubin_sm(k.cubin) == jobs[i].sm);
    if (jobs[i].sm == cmp_sm) {
      ++cmp_scanned;
      REQUIRE(k.arch.lib);
      CHECK(k.arch.lib->major <= 12);  // NVRTC 13 cannot target sm_70
    } else {
      CHECK(k.arch.nvrtc == nvrtc_libraries().front().version());  // the newest NVRTC builds sm_75 and up
    }
  }
  CHECK(cmp_scanned == (int)cmp_variants.size());
  CHECK(compiler.notes().empty());  // nothing degraded

  // Warm: asking again compiles nothing, even with compiling forbidden.
  compiler.forbid_jit();
  const auto again = compile_all(compiler, jobs);
  CHECK(compiler.compiles() == (int64_t)jobs.size());
  CHECK(compiler.memory_hits() == (int64_t)jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) CHECK(again[i].cubin == kernels[i].cubin);
}
