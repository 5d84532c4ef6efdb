// CI without a GPU for the top-k candidate selection (runtime/cuda/sampling.h): its two kernel variants
// compile with NVRTC for every CI arch and the CMP rigs' sm_70 feature set, with the declared block size, no
// register spills and nothing newer than sm_70 in the sm_70 PTX; every CUDA plan precompiles them; the
// float operations of the penalties are the unfused ones; and the host-side argument checks throw before
// anything reaches a GPU.
#include <catch2/catch.hpp>

#include <algorithm>

#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/plan_kernels.h"
#include "runtime/cuda/pointwise.h"
#include "runtime/cuda/sampling.h"
#include "runtime/cuda/templates.h"
#include "kernels/pointwise.h"
#include "kernels/sampling.h"
#include "tests/cuda/compiled_checks.h"
#include "tests/cuda/cuda_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::kernels;

TEST_CASE("top-k selection variants compile for every CI arch; the sm_70 feature set is sm_70-only",
          "[cuda][sampling]") {
  const auto vs = top_k_variants();
  REQUIRE(vs.size() == 2);
  CHECK(vs[0].name == "topk_chunk_f32_e8_t256");
  CHECK(vs[1].name == "topk_merge_f32_t1024");
  for (const Variant& v : vs) CHECK(parse_variant(v.name) == v);
  CHECK(top_k_chunk_ids() == 2048);

  std::vector<test::CompileJob> jobs;
  for (const Variant& v : vs)
    for (int sm : {70, 75, 80, 86, 89, 90}) jobs.push_back({v, sm});
  const std::vector<CompiledKernel> out = test::compile_and_check("sampling-compile", jobs);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const CompiledKernel& k = out[i];
    if (k.cubin.empty()) continue;  // reported by compile_and_check
    // The penalties are applied with explicitly rounded instructions (mul.rn / add.rn / sub.rn / div.rn,
    // which ptxas never contracts into an fma), like the host's unfused float operations.
    if (k.variant.kernel == "topk_chunk_f32") {
      INFO(k.variant.name << " sm_" << jobs[i].sm);
      CHECK(k.ptx.find("mul.rn.f32") != std::string::npos);
      CHECK(k.ptx.find("sub.rn.f32") != std::string::npos);
      CHECK(k.ptx.find("div.rn.f32") != std::string::npos);
    }
  }
}

TEST_CASE("every CUDA plan precompiles the top-k selection kernels", "[cuda][sampling][fixtures]") {
  for (const std::string rig : {"h200", "cmp-100-210-x4"}) {
    INFO(rig);
    const std::vector<Variant> pk = plan_kernels(test::preset_plan("tiny", rig));
    for (const Variant& v : top_k_variants())
      CHECK(std::any_of(pk.begin(), pk.end(), [&](const Variant& x) { return x.name == v.name; }));
  }
}

TEST_CASE("top-k selection argument checks (no GPU: they throw before any allocation)", "[cuda][sampling]") {
  std::vector<std::string> asked;
  const KernelLoader fake = [&](const Variant& v) {
    asked.push_back(v.name);
    return LoadedKernel{v, Kernel{}};
  };
  std::vector<std::string> names;
  for (const Variant& v : top_k_variants()) names.push_back(v.name);
  CHECK_THROWS_AS(TopKSelector(fake, names, 0, 1000, 1001, 4, 64), KernelError);  // more real ids than rows
  CHECK_THROWS_AS(TopKSelector(fake, names, 0, 1000, 0, 4, 64), KernelError);
  CHECK_THROWS_AS(TopKSelector(fake, names, 0, 1000, 1000, 0, 64), KernelError);
  CHECK_THROWS_AS(TopKSelector(fake, names, 0, 1000, 1000, 70000, 64), KernelError);
  CHECK_THROWS_AS(TopKSelector(fake, names, 0, 1000, 1000, 4, -1), KernelError);
  CHECK_THROWS_AS(TopKSelector(fake, {names[0]}, 0, 1000, 1000, 4, 64), KernelError);  // the merge is missing
  CHECK(asked.empty());
  const KernelLoader wrong = [&](const Variant&) { return LoadedKernel{argmax_f32_variant(), Kernel{}}; };
  CHECK_THROWS_AS(TopKSelector(wrong, names, 0, 1000, 1000, 4, 64), KernelError);
  // Another chunk size than the buffers are sized for.
  CHECK_THROWS_AS(TopKSelector(fake, {"topk_chunk_f32_e4_t256", names[1]}, 0, 1000, 1000, 4, 64), KernelError);
}
