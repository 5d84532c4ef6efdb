// Every valid qwen35 shape runs on the dp4a family, not only the presets: a model with 6 GDN value heads (so
// ssm_beta / ssm_alpha have 6 output rows, not a multiple of 4) and 3 key heads compiles for a GPU rig (the
// kernel pass names a variant for every op, the memory pass places every value), and its CPU emulation of the
// GPU family's numerics runs and stays within the family's tolerance of the fp32 reference on the same model.
// (On a GPU, tests/gpu runs the same model against this emulation.)
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "cli/synth.h"
#include "compiler/compile.h"
#include "ir/kernel_attr.h"
#include "runtime/cpu/executor.h"
#include "tests/runtime/cpu_test_util.h"

using namespace qrig;

namespace {

const std::string kRigs = std::string(QRIG_SOURCE_DIR) + "/rigs/";

std::string odd_model() {
  static const std::string path = [] {
    cli::SynthPreset p = cli::synth_preset("tiny");
    p.name = "odd";
    p.layers = 4;
    p.gdn_k_heads = 3;
    p.gdn_v_heads = 6;
    const std::string out = (std::filesystem::temp_directory_path() / "qrig-odd-shapes.gguf").string();
    cli::synth_model(p, 7).write(out);
    return out;
  }();
  return path;
}

ir::Plan compile_for(const compiler::Rig& rig, const std::string& family = "") {
  const gguf::File f = gguf::File::open(odd_model());
  compiler::CompileOptions o;
  o.context_length = 512;
  o.max_sequences = 1;
  o.family = family;
  return compiler::compile(f, rig, o);
}

}  // namespace

TEST_CASE("a model with 6 GDN value heads compiles for the GPU and its dp4a emulation runs", "[runtime]") {
  const ir::Plan gpu = compile_for(compiler::Rig::load(kRigs + "h200.toml"));
  REQUIRE(gpu.backend == "cuda");
  int six = 0;
  for (const auto& op : gpu.graph.ops) {
    if (op.kind == ir::OpKind::gather_rows) continue;
    INFO(op.describe());
    REQUIRE(op.has("kernel"));
    CHECK_NOTHROW(ir::parse_launch_ranges(op.s("kernel")));
    for (const auto& t : op.types) six += t.shape.back() == 6;
  }
  CHECK(six == 6);  // beta and alpha of the three GDN layers

  const compiler::Rig cpu = compiler::Rig::parse("[[device]]\nkind=\"cpu\"\nmemory_gib=2.0\n", "test");
  const ir::Plan ref = compile_for(cpu), emu = compile_for(cpu, "dp4a-emulated");
  runtime::CpuExecutor ex_ref(ref, runtime::open_plan_model(ref)), ex_emu(emu, runtime::open_plan_model(emu));
  std::vector<int32_t> tokens;
  for (int i = 0; i < 90; ++i) tokens.push_back((i * 37 + 11) % 1000);
  std::vector<int32_t> rows;
  for (int i = 0; i < 90; ++i) rows.push_back(i);
  auto run = [&](const runtime::CpuExecutor& e) {
    runtime::CpuSequence s = e.new_sequence();
    auto a = e.forward(s, std::vector<int32_t>(tokens.begin(), tokens.begin() + 70),
                       std::vector<int32_t>(rows.begin(), rows.begin() + 70));
    for (int t = 70; t < 90; ++t) {  // then one token at a time (recurrent GDN, two-plane matmuls)
      auto b = e.forward(s, {tokens[(size_t)t]}, {0});
      a.insert(a.end(), b.begin(), b.end());
    }
    return a;
  };
  const std::vector<float> want = run(ex_ref), got = run(ex_emu);
  REQUIRE(want.size() == got.size());
  for (float x : got) REQUIRE(std::isfinite(x));
  const double e = cpu::test::rel_err(got, want);
  INFO("dp4a emulation vs fp32 on the 6-head model: " << e);
  CHECK(e > 1e-5);  // the family's numerics are applied
  CHECK(e < 0.1);
}
