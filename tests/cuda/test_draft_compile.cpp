// CI without a GPU for what the CUDA backend needs for speculative decoding (docs/speculative.md): the draft head's
// concat kernel (templates/concat_f32.cu) and the verify step's conv and recurrent GDN kernels, which keep the
// recurrent state after each position for a rollback (templates/conv1d_silu_f32.cu, gdn_recurrent.cu), compile
// with NVRTC for sm_70 (NVRTC 11.8: PTX with nothing newer than sm_70), sm_75 and sm_90 with no spills, no stack
// frame and the declared block size, at the tiny fixture's, 9B's and 27B's GDN dims. Also the host side: the
// launchers refuse what the kernels cannot keep before any launch, and the executor's layout of a plan that drafts
// holds draft_tokens copies of every slot's recurrent states (a memory table without them is refused).
#include <catch2/catch.hpp>

#include <map>

#include "kernels/gdn.h"
#include "kernels/pointwise.h"
#include "runtime/bound_graph.h"
#include "runtime/cuda/gdn.h"
#include "runtime/cuda/layout.h"
#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/pointwise.h"
#include "tests/cuda/compiled_checks.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/kernel_sets.h"
#include "tests/missing_input.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::kernels;

TEST_CASE("the draft head's concat and the verify step's state-keeping conv and GDN compile for sm_70, sm_75, sm_90",
          "[cuda][draft]") {
  bool sm70_nvrtc = false;
  for (const NvrtcLib& l : nvrtc_libraries()) sm70_nvrtc |= l.supports(70);
  QRIG_REQUIRE_INPUT(sm70_nvrtc, "an NVRTC that targets sm_70 (found: " << nvrtc_versions() << "); "
                                                                         << nvrtc_install_hint(70));
  std::map<std::string, Variant> all;
  const Variant concat = concat_f32_variant();
  all.emplace(concat.name, concat);
  const Variant conv = conv1d_silu_f32_variant(4);  // Qwen3.5's 4-tap GDN input conv
  all.emplace(conv.name, conv);
  // The recurrent kernel of the tiny fixture's, 9B's and 27B's GDN (Hk/Hv 2/4, 16/32, 16/48, dims 128) and of
  // the odd dims the GPU tests use.
  for (const GdnDims& d : std::vector<GdnDims>{{2, 4, 128, 128}, {16, 32, 128, 128}, {16, 48, 128, 128}, {1, 3, 64, 32}})
    for (const Variant& v : gdn_variants(d, 64))
      if (v.kernel == "gdn_recurrent") all.emplace(v.name, v);
  REQUIRE(all.size() == 4);  // dims 128 give one recurrent variant whatever the head counts, + the odd dims'
  CHECK(concat.name == "concat_f32_t256");
  CHECK(parse_variant(concat.name) == concat);

  std::vector<cuda::test::CompileJob> jobs;
  for (const auto& [name, v] : all)
    for (int sm : {70, 75, 90}) jobs.push_back({v, sm});
  const std::vector<CompiledKernel> out = cuda::test::compile_and_check("draft-compile", jobs);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const CompiledKernel& k = out[i];
    if (k.cubin.empty()) continue;  // reported by compile_and_check
    INFO(k.variant.name << " for feature sm_" << jobs[i].sm << "\n" << k.log);
    if (jobs[i].sm == 70) CHECK(k.arch.target_sm <= 75);
    CHECK(parse_ptxas_report(k.log).stack_frame_bytes == 0);
  }
}

TEST_CASE("the state-keeping launches and the concat check their arguments before any launch", "[cuda][draft]") {
  const KernelLoader fake = [&](const Variant& v) { return LoadedKernel{v, Kernel{}}; };
  alignas(256) static float buf[1024];
  float* p = buf;
  StreamHandle s = nullptr;

  // GDN: the recurrent kernel keeps at most T - 1 states, 16-byte aligned, a whole state apart; the chunked pair
  // keeps none.
  const GdnDims d{1, 3, 64, 32};
  const GdnKernels g = cuda::test::gdn_kernels(fake, d, 64, 64, 8);  // recurrent below 8 tokens
  const int64_t state = d.Hv * d.dk * d.dv;
  CHECK_THROWS_WITH(g.run(p, p, p, p, p, 4, p, p, nullptr, s, p, 4, state), Catch::Contains("after 4 of 4"));
  CHECK_THROWS_WITH(g.run(p, p, p, p, p, 4, p, p, nullptr, s, p, -1, state), Catch::Contains("after -1 of 4"));
  CHECK_THROWS_AS(g.run(p, p, p, p, p, 4, p, p, nullptr, s, p + 1, 3, state), KernelError);    // kept misaligned
  CHECK_THROWS_AS(g.run(p, p, p, p, p, 4, p, p, nullptr, s, nullptr, 3, state), KernelError);  // no kept buffer
  CHECK_THROWS_WITH(g.run(p, p, p, p, p, 4, p, p, nullptr, s, p, 3, state - 4), Catch::Contains("floats apart"));
  CHECK_THROWS_WITH(g.run(p, p, p, p, p, 9, p, p, p, s, p, 8, state), Catch::Contains("chunked pair"));

  // Conv: at most T - 1 windows of K - 1 rows of C channels.
  const LoadedKernel conv = fake(conv1d_silu_f32_variant(4));
  float* out = buf + 512;
  CHECK_THROWS_AS(launch_conv1d_silu_f32(conv, p, 3, 8, p, p, out, s, p, 3, 24), KernelError);
  CHECK_THROWS_AS(launch_conv1d_silu_f32(conv, p, 3, 8, p, p, out, s, nullptr, 2, 24), KernelError);
  CHECK_THROWS_AS(launch_conv1d_silu_f32(conv, p, 3, 8, p, p, out, s, p, 2, 23), KernelError);  // windows overlap

  // Concat: both parts non-empty, out aliasing neither.
  const LoadedKernel cat = fake(concat_f32_variant());
  CHECK_THROWS_AS(launch_concat_f32(cat, p, 8, p + 8, 8, 2, p, s), KernelError);
  CHECK_THROWS_AS(launch_concat_f32(cat, p, 0, p + 8, 8, 2, out, s), KernelError);
  CHECK_THROWS_AS(launch_concat_f32(cat, p, 8, p + 8, 8, 0, out, s), KernelError);
  CHECK_THROWS_AS(launch_concat_f32(fake(add_f32_variant()), p, 8, p + 8, 8, 2, out, s), KernelError);
}

TEST_CASE("a plan that drafts gets draft_tokens copies of each slot's recurrent states; its memory table must count "
          "them", "[cuda][draft][fixtures]") {
  compiler::CompileOptions o;
  o.max_gpus = 1;  // the runtime runs single-GPU plans
  ir::Plan p = presets::compile_preset("tiny", "h200", o);
  const gguf::File f = gguf::File::open(presets::kFixtures + "tiny.gguf");
  const runtime::BoundGraph g(p);
  const DeviceLayout plain = device_layout(p, g, f);
  CHECK(plain.kept_floats == 0);
  CHECK_NOTHROW(check_layout(plain, p));
  p.draft_tokens = 3;  // what the draft pass decides on a backend that drafts
  const DeviceLayout drafting = device_layout(p, g, f);
  REQUIRE(plain.rec_floats > 0);
  CHECK(drafting.kept_floats == 3 * plain.rec_floats);
  CHECK(drafting.slot_bytes == plain.slot_bytes + 3 * plain.rec_floats * 4);
  // The memory pass counts them for a plan that drafts (plan_memory.cpp draft_rollback); this table does not.
  CHECK_THROWS_WITH(check_layout(drafting, p), Catch::Contains("slot states"));
  p.memory.devices[0].states += p.max_sequences * 3 * plain.rec_floats * 4;
  CHECK_NOTHROW(check_layout(drafting, p));
}
