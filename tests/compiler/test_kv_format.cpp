// The KV-format pass (compiler/passes/choose_kv_format.cpp) and the memory pass's trade table: the most
// precise pair that fits the requested context, --kv forcing one, CUDA plans kept to fp16 caches (refused by name
// otherwise), the bytes per token of each format, and the 9B model at 262144 tokens on one 16 GiB CMP card.
#include <catch2/catch.hpp>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "compiler/compile.h"
#include "ir/kernel_attr.h"
#include "ir/plan.h"
#include "kernels/kv_format.h"
#include "tests/fixtures.h"
#include "tests/plan_presets.h"

using namespace qrig;

namespace {

const std::string kTiny = presets::kFixtures + "tiny.gguf";

const ir::KvFit& fit(const ir::Plan& p, const std::string& kv) {
  for (const auto& f : p.memory.kv_fits)
    if (f.kv == kv) return f;
  FAIL("no kv_fit " << kv);
  throw;
}

std::string kv_of(const ir::Plan& p) {
  return kernels::kv_pair_name({*kernels::parse_kv_format(p.k_dtype), *kernels::parse_kv_format(p.v_dtype)});
}

}  // namespace

TEST_CASE("kv formats: the most precise pair that fits the requested context", "[compiler][kv][fixtures]") {
  gguf::File f = gguf::File::open(kTiny);
  const auto rig = compiler::Rig::parse("[[device]]\nkind=\"cpu\"\nmemory_gib=0.14\n", "small");
  compiler::CompileOptions co;
  co.max_sequences = 2;
  co.context_length = 64;
  const ir::Plan base = compiler::compile(f, rig, co);
  CHECK(kv_of(base) == "k32v32");
  // The ladder, most precise first; keys never less precise than values.
  std::vector<std::string> ladder;
  for (const auto& e : base.memory.kv_fits) ladder.push_back(e.kv);
  CHECK(ladder == std::vector<std::string>{"k32v32", "k8v8", "k8v4", "k8v3", "k4v4", "k4v3", "k3v3"});
  // Tiny: 2 attention layers of one 256-value kv head; the CPU holds quantized rows in the GPU's layout.
  CHECK(fit(base, "k32v32").bytes_per_token == 2 * 2 * 1024);
  CHECK(fit(base, "k8v8").bytes_per_token == 2 * 2 * 272);
  CHECK(fit(base, "k8v3").bytes_per_token == 2 * (272 + 112));
  CHECK(fit(base, "k4v4").bytes_per_token == 2 * 2 * 144);
  for (size_t i = 1; i < base.memory.kv_fits.size(); ++i)
    CHECK(base.memory.kv_fits[i].context >= base.memory.kv_fits[i - 1].context);
  // Every requested context gets the first pair of the ladder that fits it.
  for (size_t i = 0; i < base.memory.kv_fits.size(); ++i) {
    const int64_t want = base.memory.kv_fits[i].context;
    if (i > 0 && want == base.memory.kv_fits[i - 1].context) continue;
    co.context_length = want;
    const ir::Plan p = compiler::compile(f, rig, co);
    CAPTURE(want);
    CHECK(kv_of(p) == base.memory.kv_fits[i].kv);
    CHECK(p.context_length == want);
    CHECK(p.memory.kv_bytes_per_token == base.memory.kv_fits[i].bytes_per_token);
    for (const auto& st : p.graph.states)
      if (st.name.rfind("k.", 0) == 0) CHECK(ir::dtype_name(st.type.dtype) == p.k_dtype);
    for (const auto& op : p.graph.ops)
      if (op.kind == ir::OpKind::attention || op.kind == ir::OpKind::kv_write) {
        CHECK(op.s("k_format") == p.k_dtype);
        CHECK(op.s("v_format") == p.v_dtype);
      }
  }
  // One token more than the most compact pair allows is refused, naming what each allows.
  co.context_length = base.memory.kv_fits.back().context + 1;
  CHECK_THROWS_WITH(compiler::compile(f, rig, co), Catch::Contains("does not fit") && Catch::Contains("k3v3"));
}

TEST_CASE("kv formats: --kv forces a pair; bad spellings and impossible pairs are refused", "[compiler][kv][fixtures]") {
  gguf::File f = gguf::File::open(kTiny);
  compiler::CompileOptions co;
  co.context_length = 512;
  co.kv = "k8v3";
  const ir::Plan p = compiler::compile(f, compiler::Rig::default_cpu(), co);
  CHECK(p.k_dtype == "q8");
  CHECK(p.v_dtype == "t3");
  presets::ScratchDir dir("kv-plan");
  p.write(dir.path.string());
  const ir::Plan back = ir::Plan::read(dir.path.string());
  CHECK(back.to_toml() == p.to_toml());
  REQUIRE(back.memory.kv_fits.size() == p.memory.kv_fits.size());
  CHECK(back.memory.kv_fits[3].kv == "k8v3");
  CHECK(back.memory.kv_fits[3].device_contexts == p.memory.kv_fits[3].device_contexts);
  // A hand edit that changes plan.toml's format but not the graph's caches is refused.
  {
    std::stringstream ss;
    ss << std::ifstream(dir.path / "plan.toml").rdbuf();
    std::string t = ss.str();
    const auto at = t.find("v_dtype = 't3'");
    REQUIRE(at != std::string::npos);
    t.replace(at, 14, "v_dtype = 't4'");
    std::ofstream(dir.path / "plan.toml") << t;
  }
  CHECK_THROWS_WITH(ir::Plan::read(dir.path.string()), Catch::Contains("v_dtype") && Catch::Contains("t3"));
  {
    std::stringstream ss;
    ss << std::ifstream(dir.path / "plan.toml").rdbuf();
    std::string t = ss.str();
    t.replace(t.find("v_dtype = 't4'"), 14, "v_dtype = 't5'");
    std::ofstream(dir.path / "plan.toml") << t;
  }
  CHECK_THROWS_WITH(ir::Plan::read(dir.path.string()), Catch::Contains("v_dtype") && Catch::Contains("t5"));

  for (const char* bad : {"k8", "q8q8", "k7v3", "k8v3 "}) {
    co.kv = bad;
    CHECK_THROWS_WITH(compiler::compile(f, compiler::Rig::default_cpu(), co), Catch::Contains("--kv"));
  }
  // CUDA plans run every format but f32 (the CPU reference's); the cache kernels the plan names carry the formats.
  const auto cmp = compiler::Rig::load(presets::kRigs + "cmp-100-210-x4.toml");
  co.max_gpus = 1;
  co.kv = "k32v32";
  CHECK_THROWS_WITH(compiler::compile(f, cmp, co), Catch::Contains("CUDA") && Catch::Contains("f32"));
  co.kv = "k8v3";
  const ir::Plan q = compiler::compile(f, cmp, co);
  CHECK(kv_of(q) == "k8v3");
  bool named = false;
  for (const auto& op : q.graph.ops) {
    if (op.kind == ir::OpKind::kv_write) CHECK(op.s("kernel").find("kv_write_k8_v3_b0_t128") != std::string::npos);
    if (op.kind == ir::OpKind::attention) {
      CHECK(op.s("kernel").find("_k8_v3_b0_t256") != std::string::npos);  // attn_decode_dp4a
      CHECK(op.s("kernel").find("attn_merge_rot_d256_b0_t128") != std::string::npos);
      CHECK(op.s("kernel").find("k16_v16") == std::string::npos);
      if (op.has("decode_kernel")) {  // the batched decode kernels, renamed with the formats too
        CHECK(op.s("decode_kernel").find("_k8_v3_b1_t256+attn_merge_rot_d256_b1_t128") != std::string::npos);
        CHECK(op.s("decode_kernel").find("k16_v16") == std::string::npos);
      }
      named = true;
    }
  }
  CHECK(named);
  for (const auto& kc : q.kernels) CHECK(kc.variants.find("k16_v16") == std::string::npos);  // inspect's table too
  co.kv = "k16v16";
  CHECK(compiler::compile(f, cmp, co).k_dtype == "f16");
  co.kv = "";
  const ir::Plan gpu = compiler::compile(f, cmp, co);
  CHECK(kv_of(gpu) == "k16v16");  // the tiny model's trained length fits in fp16
  CHECK(gpu.memory.kv_fits.size() == 7);
  CHECK(fit(gpu, "k16v16").bytes_per_token == 2 * 2 * 512);  // fp16 on the GPU
}

// The int8 query of decode attention over quantized keys is a plan decision of the KV-format pass: the dp4a
// family (CUDA, and the CPU's dp4a-emulated family) takes it, recorded as the attention ops' query_int8_tokens
// (the decode kernels' token range, which the CPU executor reads) and by the kernels' names; f16 keys, the
// reference family and --precise keep the fp32 query.
TEST_CASE("kv formats: decode attention over quantized keys takes the int8 query in the dp4a family",
          "[compiler][kv][fixtures]") {
  gguf::File f = gguf::File::open(kTiny);
  const auto cmp = compiler::Rig::load(presets::kRigs + "cmp-100-210-x4.toml");
  compiler::CompileOptions co;
  co.context_length = 512;
  co.max_gpus = 1;
  auto attention_ops = [](const ir::Plan& p) {
    std::vector<const ir::Op*> out;
    for (const auto& op : p.graph.ops)
      if (op.kind == ir::OpKind::attention) out.push_back(&op);
    REQUIRE(!out.empty());
    return out;
  };
  auto noted = [](const ir::Plan& p) {
    for (const auto& n : p.notes)
      if (n.find("quantize the query to int8") != std::string::npos) return true;
    return false;
  };
  for (const char* kv : {"k8v3", "k4v4", "k3v16"}) {
    INFO(kv);
    co.kv = kv;
    const ir::Plan q = compiler::compile(f, cmp, co);
    for (const ir::Op* op : attention_ops(q)) {
      CHECK(op->i("query_int8_tokens") == 4);  // the tiny model's 2 heads per KV head: the decode kernel's 8 / 2
      for (const auto& r : ir::parse_launch_ranges(op->s("kernel")))
        CHECK((r.last <= 4) == (r.parts[0][0].rfind("attn_decode_dp4a_", 0) == 0));
    }
    CHECK(noted(q));
    presets::ScratchDir dir("kv-int8");
    q.write(dir.path.string());
    CHECK(ir::Plan::read(dir.path.string()).to_toml() == q.to_toml());
  }
  co.kv = "k16v3";  // f16 keys: the fp32 query
  for (const ir::Op* op : attention_ops(compiler::compile(f, cmp, co))) CHECK(!op->has("query_int8_tokens"));
  co.kv = "k8v3";
  co.precise_rows = INT64_MAX;  // --precise
  const ir::Plan precise = compiler::compile(f, cmp, co);
  CHECK_FALSE(noted(precise));
  for (const ir::Op* op : attention_ops(precise)) {
    CHECK(!op->has("query_int8_tokens"));
    CHECK(op->s("kernel").find("attn_decode_d256_g2_n1_k8_v3_b0_t128") != std::string::npos);
    CHECK(op->s("kernel").find("dp4a") == std::string::npos);
  }
  co.precise_rows = -1;
  co.max_gpus = 0;
  for (const ir::Op* op : attention_ops(compiler::compile(f, compiler::Rig::default_cpu(), co)))
    CHECK(!op->has("query_int8_tokens"));  // the reference family
  co.family = "dp4a-emulated";
  const ir::Plan emu = compiler::compile(f, compiler::Rig::default_cpu(), co);
  CHECK(noted(emu));
  for (const ir::Op* op : attention_ops(emu)) CHECK(op->i("query_int8_tokens") == 4);
}

// The acceptance plan: the 9B Q8_0 model on one CMP 100-210 (16 GiB) at its native 262144 tokens: the pass's
// per-device arithmetic says a 3-bit value format (k8v3) fits and k16v16 does not, and the plan takes the most
// precise pair that fits.
TEST_CASE("kv formats: 9B at 262144 tokens fits one 16 GiB CMP card with 3-bit values", "[compiler][kv]") {
  compiler::CompileOptions co;
  co.max_gpus = 1;
  co.max_sequences = 1;
  co.max_batch_tokens = 64;
  const ir::Plan p = presets::compile_preset("9b", "cmp-100-210-x4", co);
  REQUIRE(p.memory.devices.size() == 1);
  const auto& dev = p.memory.devices[0];
  CHECK(dev.budget <= (int64_t)(16.0 * (1 << 30)));
  // 8 attention layers of 4 kv heads x 256: f16 4 KiB per layer and token, q8 keys 1088 B, t3 values 400 B.
  CHECK(fit(p, "k16v16").bytes_per_token == 8 * 2 * 2048);
  CHECK(fit(p, "k8v3").bytes_per_token == 8 * (1088 + 400));
  CHECK(fit(p, "k3v3").bytes_per_token == 8 * 2 * 400);
  CHECK(fit(p, "k16v16").context < 262144);
  CHECK(fit(p, "k8v3").context >= 262144);
  // The table's arithmetic: what the plan holds besides its caches, plus the caches at that context, fits the
  // budget, and one more token of each (up to the arena's growth with the context) would not.
  const int64_t fixed = dev.total - p.memory.kv_bytes_per_token * p.context_length;
  for (const auto& e : p.memory.kv_fits) {
    CAPTURE(e.kv);
    REQUIRE(e.device_contexts.size() == 1);
    CHECK(e.context == e.device_contexts[0]);
    const double predicted = (double)(dev.budget - fixed) / (double)e.bytes_per_token;
    CHECK(std::fabs((double)e.context / predicted - 1.0) < 0.01);
  }
  co.context_length = 262144;
  const ir::Plan g = presets::compile_preset("9b", "cmp-100-210-x4", co);
  CHECK(g.context_length == 262144);
  CHECK(kernels::parse_kv_format(g.v_dtype) != kernels::KvFormat::f16);
  CHECK(fit(g, kv_of(g)).context >= 262144);
  CHECK(kv_of(g) == "k8v8");  // the most precise candidate that fits (k8v3 would too)
  // The kernel pass named k16v16's kernels (the first candidate) before the memory pass settled k8v8: renamed.
  for (const auto& op : g.graph.ops)
    if (op.kind == ir::OpKind::attention || op.kind == ir::OpKind::kv_write) {
      CHECK(op.s("kernel").find("k16_v16") == std::string::npos);
      CHECK(op.s("kernel").find("kv_write_f16") == std::string::npos);
      CHECK(op.s("kernel").find(op.kind == ir::OpKind::attention ? "_k8_v8_b0_t256+attn_merge_d256_b0_t256" : "kv_write_k8_v8_b0_t128") !=
            std::string::npos);
    }
  for (const auto& kc : g.kernels) CHECK(kc.variants.find("k16_v16") == std::string::npos);
  CHECK(g.memory.devices[0].total <= g.memory.devices[0].budget);
  co.kv = "k8v3";  // the plan: 3-bit values
  const ir::Plan g3 = presets::compile_preset("9b", "cmp-100-210-x4", co);
  CHECK(g3.context_length == 262144);
  CHECK(g3.v_dtype == "t3");
  CHECK(g3.memory.devices[0].total <= (int64_t)(16.0 * (1 << 30)));
  co.kv = "";
  // The same model on a CPU rig of the card's size gets the most precise pair that fits (its exact f32 cache
  // would take 16 GiB alone).
  compiler::CompileOptions cpu = co;
  cpu.force_backend = "cpu";
  cpu.max_gpus = 0;
  presets::ScratchDir dir("kv9b");
  const gguf::File f = gguf::File::open(presets::write_sparse_synth("9b", dir.path).string());
  const ir::Plan c = compiler::compile(f, compiler::Rig::parse("[[device]]\nkind=\"cpu\"\nmemory_gib=16.0\n", "cpu16"), cpu);
  CHECK(c.context_length == 262144);
  CHECK(fit(c, "k32v32").context < 262144);
  CHECK(kv_of(c) == "k8v8");
  CHECK(c.memory.devices[0].total <= c.memory.devices[0].budget);
}

// 27B Q8_0 over the CMP rig's four cards at 262144 tokens: the trade table is per device, each card holding the
// caches of its own attention layers (the runtime runs one-GPU plans until the pipeline lands; this checks the
// per-device arithmetic). One sequence fits in fp16; four need a quantized pair (k8v4 or smaller), which the pass
// now takes.
TEST_CASE("kv formats: 27B at 262144 tokens, the per-device arithmetic over four CMP cards", "[compiler][kv]") {
  compiler::CompileOptions co;
  co.max_sequences = 1;
  co.max_batch_tokens = 64;
  co.context_length = 262144;
  const ir::Plan one = presets::compile_preset("27b", "cmp-100-210-x4", co);
  REQUIRE(one.memory.devices.size() == 4);
  CHECK(kv_of(one) == "k16v16");
  CHECK(one.context_length == 262144);
  // 16 attention layers of 4 kv heads x 256, 4 per card.
  CHECK(fit(one, "k16v16").bytes_per_token == 16 * 2 * 2048);
  for (const auto& d : one.memory.devices) CHECK(d.total <= d.budget);
  for (const auto& e : one.memory.kv_fits) {
    CAPTURE(e.kv);
    REQUIRE(e.device_contexts.size() == 4);
    CHECK(e.context == *std::min_element(e.device_contexts.begin(), e.device_contexts.end()));
  }
  co.max_sequences = 4;
  const ir::Plan four = presets::compile_preset("27b", "cmp-100-210-x4", co);
  CHECK(fit(four, "k16v16").context < 262144);
  CHECK(fit(four, "k8v3").context >= 262144);
  CHECK(kv_of(four) == "k8v4");  // the most precise pair at which 4 x 262144 tokens fit
  CHECK(four.context_length == 262144);
  for (const auto& d : four.memory.devices) CHECK(d.total <= d.budget);
}
