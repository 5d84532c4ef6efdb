// CI without a GPU for what the CUDA backend needs for speculative decoding (docs/speculative.md): the draft head's
// concat kernel (templates/concat_f32.cu) and the verify step's conv and recurrent GDN kernels, which keep the
// recurrent state after each position for a rollback (templates/conv1d_silu_f32.cu, gdn_recurrent.cu), compile
// with NVRTC for sm_70 (NVRTC 11.8: PTX with nothing newer than sm_70), sm_75 and sm_90 with no spills, no stack
// frame and the declared block size, at the tiny fixture's, 9B's and 27B's GDN dims; and the variants a CUDA plan
// of tiny-mtp with --draft 1..4 names that no preset plan names (the head's kernels, the two-plane matmuls of verify
// steps' rows), for the same three. Also the host side: the launchers refuse what the kernels cannot keep before any
// launch; a drafting plan's kernels are exactly what the executor's binding loads (the draft graph's included), and
// its layout (draft_tokens copies of every slot's recurrent states, the head's caches, waiting rows and row buffers)
// is the plan's memory table (a table without them is refused).
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "compiler/compile.h"
#include "kernels/gdn.h"
#include "kernels/kv_format.h"
#include "kernels/pointwise.h"
#include "runtime/bound_graph.h"
#include "runtime/cuda/executor_impl.h"
#include "runtime/cuda/gdn.h"
#include "runtime/cuda/layout.h"
#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/plan_kernels.h"
#include "runtime/cuda/pointwise.h"
#include "tests/cuda/compiled_checks.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/kernel_sets.h"
#include "tests/missing_input.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::kernels;

namespace {
// Every variant for sm_70, sm_75 and sm_90 with compile_and_check's checks, and on top: the sm_70 feature set's code
// at most sm_75, no stack frame.
void compile_for_ci_archs(const std::string& tag, const std::map<std::string, Variant>& variants) {
  std::vector<cuda::test::CompileJob> jobs;
  for (const auto& [name, v] : variants)
    for (int sm : {70, 75, 90}) jobs.push_back({v, sm});
  const std::vector<CompiledKernel> out = cuda::test::compile_and_check(tag, jobs);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const CompiledKernel& k = out[i];
    if (k.cubin.empty()) continue;  // reported by compile_and_check
    INFO(k.variant.name << " for feature sm_" << jobs[i].sm << "\n" << k.log);
    if (jobs[i].sm == 70) CHECK(k.arch.target_sm <= 75);
    CHECK(parse_ptxas_report(k.log).stack_frame_bytes == 0);
  }
}
}  // namespace

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

  compile_for_ci_archs("draft-compile", all);
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

namespace {

// tiny-mtp compiled for a preset rig (one GPU) with --draft k.
ir::Plan draft_plan(const std::string& rig, int64_t k, const std::string& kv = "") {
  compiler::CompileOptions o;
  o.max_gpus = 1;  // the runtime runs single-GPU plans
  o.draft_tokens = k;
  o.kv = kv;
  const gguf::File f = gguf::File::open(presets::kFixtures + "tiny-mtp.gguf");
  return compiler::compile(f, compiler::Rig::load(presets::kRigs + rig + ".toml"), o);
}

}  // namespace

TEST_CASE("the kernels a CUDA plan with --draft names that no preset plan names compile for sm_70, sm_75, sm_90",
          "[cuda][draft][fixtures]") {
  bool sm70_nvrtc = false;
  for (const NvrtcLib& l : nvrtc_libraries()) sm70_nvrtc |= l.supports(70);
  QRIG_REQUIRE_INPUT(sm70_nvrtc, "an NVRTC that targets sm_70 (found: " << nvrtc_versions() << "); "
                                                                         << nvrtc_install_hint(70));
  // What the preset plans name is compiled for every CI architecture by test_template_compile.cpp; a drafting plan
  // adds its head's kernels (the main model's attention layer's, the concat) and the two-plane matmuls of the
  // verify steps' rows (precise_rows: slots x (k + 1)). Those not already named, for each k the draft pass allows.
  std::set<std::string> preset;
  for (const std::string rig : {"h200", "cmp-100-210-x4"})
    for (const std::string model : {"tiny", "9b", "27b"})
      for (const Variant& v : plan_kernels(cuda::test::preset_plan(model, rig))) preset.insert(v.name);
  std::map<std::string, Variant> fresh;
  int64_t named = 0;
  for (const std::string rig : {"h200", "cmp-100-210-x4"})
    for (int64_t k = 1; k <= 4; ++k) {
      const ir::Plan p = draft_plan(rig, k);
      REQUIRE(p.draft_tokens == k);
      for (const Variant& v : plan_kernels(p)) {
        ++named;
        if (!preset.count(v.name)) fresh.emplace(v.name, v);
      }
    }
  REQUIRE(fresh.count(concat_f32_variant().name));
  fresh.erase(concat_f32_variant().name);  // the first test case compiles it
  INFO(fresh.size() << " of the drafting plans' " << named << " variants (with repeats) are named by no preset plan");
  CHECK(fresh.size() >= 1);  // the two-plane matmuls of 5..20 rows
  CHECK(fresh.size() <= 8);  // few compiles
  compile_for_ci_archs("draft-plan-compile", fresh);
}

TEST_CASE("a CUDA plan with --draft: the executor binds the head's kernels, and its layout is the plan's memory table",
          "[cuda][draft][fixtures]") {
  const gguf::File f = gguf::File::open(presets::kFixtures + "tiny-mtp.gguf");
  for (const std::string rig : {"h200", "cmp-100-210-x4"})
    for (int64_t k : {1, 3, 4}) {
      INFO(rig << " --draft " << k);
      const ir::Plan p = draft_plan(rig, k);
      // The variants the plan names (what `qrig compile` precompiles) are those the executor's binding loads, the
      // draft graph's included.
      std::set<std::string> named;
      for (const auto& v : plan_kernels(p)) named.insert(v.name);
      const std::vector<std::string> loaded = runtime::kernels_loaded_by(p);
      CHECK(named == std::set<std::string>(loaded.begin(), loaded.end()));
      CHECK(named.count(concat_f32_variant().name));
      // Allocations: k copies of each slot's recurrent states, the head's caches and waiting rows, its row buffers.
      const runtime::BoundGraph g(p);
      const DeviceLayout L = device_layout(p, g, f);
      CHECK_NOTHROW(check_layout(L, p));
      const ir::DeviceMemory& m = p.memory.devices.at(0);
      CHECK(L.total() + m.snapshots == m.total);
      REQUIRE(L.rec_floats > 0);
      CHECK(L.kept_floats == k * L.rec_floats);
      CHECK(L.draft_width == 256);
      CHECK(L.draft_pending_rows == k + 2);
      REQUIRE(L.draft_cache_halves.size() == 2);
      for (int64_t h : L.draft_cache_halves) CHECK(h == p.context_length * 256);  // f16: a half per value
      int64_t draft_ropes = 0;
      for (const auto& w : L.weights) draft_ropes += w.kind == WeightUpload::rope_table && w.draft;
      CHECK(draft_ropes == 2);  // the head's q and k
      std::map<std::string, int> uploads;  // the embedding and the lm_head the head shares: uploaded once
      for (const auto& w : L.weights)
        for (const auto& t : w.tensors) ++uploads[t];
      CHECK(uploads["token_embd.weight"] == 1);
      CHECK(uploads["output.weight"] == 1);
      CHECK(uploads["blk.8.nextn.eh_proj.weight"] == 1);
      // A memory table without the head's part is refused, naming it.
      ir::Plan q = p;
      q.memory.devices[0].states -= p.max_sequences * p.memory.draft_pending_bytes;
      CHECK_THROWS_WITH(check_layout(L, q), Catch::Contains("slot states"));
      q = p;
      q.memory.devices[0].io -= 256 * 4;
      CHECK_THROWS_WITH(check_layout(L, q), Catch::Contains("step inputs and outputs"));
    }
  // The head's caches in a quantized format: sized as the format's rows.
  const ir::Plan q8 = draft_plan("h200", 2, "k8v8");
  const runtime::BoundGraph g(q8);
  const DeviceLayout L = device_layout(q8, g, f);
  CHECK_NOTHROW(check_layout(L, q8));
  for (int64_t h : L.draft_cache_halves)
    CHECK(h == (q8.context_length * kernels::kv_row_bytes(KvFormat::q8, 256, false) + 1) / 2);
  // A hand-made plan claiming drafting without a draft graph cannot be laid out.
  ir::Plan bad = presets::compile_preset("tiny", "h200", [] {
    compiler::CompileOptions o;
    o.max_gpus = 1;
    return o;
  }());
  bad.draft_tokens = 3;
  CHECK_THROWS(device_layout(bad, runtime::BoundGraph(bad), gguf::File::open(presets::kFixtures + "tiny.gguf")));
}
