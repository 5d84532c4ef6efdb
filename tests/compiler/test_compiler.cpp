// Compiler: hyperparameters from real GGUFs (with and without MTP), precise refusals of bad or unsupported
// files, lowering that round-trips through the IR text, plans that round-trip through plan.toml, and the
// decisions the passes make for the rig presets.
#include <catch2/catch.hpp>

#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "compiler/compile.h"
#include "compiler/models/qwen35.h"
#include "gguf/writer.h"
#include "tests/fixtures.h"

using namespace qrig;

namespace {

const std::string kFixtures = qrig::fixtures::shared_dir() + "/fixtures/";
const std::string kRigs = std::string(QRIG_SOURCE_DIR) + "/rigs/";

// A copy of tiny.gguf with edits, for negative tests.
struct Edit {
  std::string key;
  gguf::Value value;
};
gguf::File edited_tiny(const std::vector<Edit>& edits, const std::string& retype_tensor = "",
                       gguf::TensorType new_type = gguf::TensorType::F32, const std::string& drop_tensor = "") {
  gguf::File src = gguf::File::open(kFixtures + "tiny.gguf");
  gguf::Writer w;
  for (const auto& [k, v] : src.metadata()) w.set(k, v);
  for (const auto& e : edits) w.set(e.key, e.value);
  for (const auto& t : src.tensors()) {
    if (t.name == drop_tensor) continue;
    const uint8_t* d = src.tensor_data(t);
    if (t.name == retype_tensor) {
      const auto* tr = gguf::type_traits((uint32_t)new_type);
      std::vector<uint8_t> bytes(t.n_elements / tr->block_elems * tr->block_bytes, 0);
      w.add_tensor(t.name, new_type, t.ne, bytes);
    } else {
      w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(d, d + t.n_bytes));
    }
  }
  auto bytes = w.to_bytes();
  return gguf::File::from_bytes(bytes.data(), bytes.size(), "edited-tiny.gguf");
}

}  // namespace

TEST_CASE("hyperparameters of tiny.gguf and tiny-mtp.gguf", "[compiler][fixtures]") {
  gguf::File f = gguf::File::open(kFixtures + "tiny.gguf");
  auto p = compiler::Qwen35Params::from_gguf(f);
  CHECK(p.n_layer == 8);
  CHECK(p.n_mtp == 0);
  CHECK(p.d == 256);
  CHECK(p.ffn == 512);
  CHECK(p.n_head == 2);
  CHECK(p.n_head_kv == 1);
  CHECK(p.head_dim == 256);
  CHECK(p.ssm_k_heads == 2);
  CHECK(p.ssm_v_heads == 4);
  CHECK(p.ssm_head_dim == 128);
  CHECK(p.conv_dim() == 1024);
  CHECK(p.rope_dims == 64);
  CHECK(p.rope_theta == 1e7);
  CHECK(p.rope_sections == std::vector<int64_t>{11, 11, 10, 0});
  CHECK(p.vocab == 1088);
  CHECK(p.context_length == 8192);
  CHECK(p.eps == Approx(1e-6));
  for (int L = 0; L < 8; ++L) CHECK(p.is_full_attention(L) == (L == 3 || L == 7));

  gguf::File m = gguf::File::open(kFixtures + "tiny-mtp.gguf");
  auto pm = compiler::Qwen35Params::from_gguf(m);
  CHECK(pm.n_layer == 8);
  CHECK(pm.n_mtp == 1);
  auto plan = compiler::compile(m, compiler::Rig::default_cpu(), {});
  bool noted = false;
  for (const auto& n : plan.notes) noted |= n.find("MTP block present (blk.8)") != std::string::npos;
  CHECK(noted);
  for (const auto& op : plan.graph.ops)
    if (op.has("weight")) CHECK(op.s("weight").rfind("blk.8.", 0) != 0);  // MTP kept aside, not lowered
}

TEST_CASE("unsupported or inconsistent models are refused with precise messages", "[compiler][fixtures]") {
  using gguf::Value;
  CHECK_THROWS_WITH(compiler::Qwen35Params::from_gguf(edited_tiny({{"general.architecture", Value::of_str("qwen35moe")}})),
                    Catch::Contains("qwen35moe") && Catch::Contains("not supported yet"));
  CHECK_THROWS_WITH(compiler::Qwen35Params::from_gguf(edited_tiny({{"general.architecture", Value::of_str("llama")}})),
                    Catch::Contains("'llama'"));
  CHECK_THROWS_WITH(compiler::Qwen35Params::from_gguf(edited_tiny({}, "blk.2.ffn_up.weight", gguf::TensorType::IQ2_XXS)),
                    Catch::Contains("blk.2.ffn_up.weight") && Catch::Contains("IQ2_XXS") && Catch::Contains("Q4_K"));
  {  // A type the CPU runs but the CUDA executor does not (F16 matrices): refused for CUDA by name at compile.
    const gguf::File f16 = edited_tiny({}, "blk.2.ffn_up.weight", gguf::TensorType::F16);
    CHECK_THROWS_WITH(compiler::compile(f16, compiler::Rig::load(kRigs + "h200.toml"), {}),
                      Catch::Contains("blk.2.ffn_up.weight") && Catch::Contains("F16") &&
                          Catch::Contains("none for F16 yet") && Catch::Contains("--backend cpu"));
    CHECK(compiler::compile(f16, compiler::Rig::load(kRigs + "cpu.toml"), {}).backend == "cpu");
    // Q4_K has CUDA kernels (gemv_wq_dp4a, gemm_wq_dp4a_*): the plan compiles and names them for that matmul.
    const gguf::File q4k = edited_tiny({}, "blk.2.ffn_up.weight", gguf::TensorType::Q4_K);
    const ir::Plan p = compiler::compile(q4k, compiler::Rig::load(kRigs + "h200.toml"), {});
    CHECK(p.backend == "cuda");
    bool found = false;
    for (const auto& op : p.graph.ops)
      if (op.has("weight") && op.s("weight") == "blk.2.ffn_up.weight")
        found = op.s("kernel").find("wq_dp4a") != std::string::npos &&
                op.s("kernel").find("_w12_") != std::string::npos;
    CHECK(found);
  }
  CHECK_THROWS_WITH(compiler::Qwen35Params::from_gguf(edited_tiny({{"qwen35.attention.head_count_kv", Value::of_u32(3)}})),
                    Catch::Contains("not a multiple of head_count_kv"));
  CHECK_THROWS_WITH(compiler::Qwen35Params::from_gguf(edited_tiny({{"qwen35.feed_forward_length", Value::of_u32(1024)}})),
                    Catch::Contains("blk.0.ffn_gate.weight") && Catch::Contains("shape"));
  CHECK_THROWS_WITH(compiler::Qwen35Params::from_gguf(edited_tiny({{"qwen35.ssm.time_step_rank", Value::of_u32(3)}})),
                    Catch::Contains("time_step_rank"));
  CHECK_THROWS_WITH(compiler::Qwen35Params::from_gguf(edited_tiny({}, "", gguf::TensorType::F32, "blk.5.ssm_a")),
                    Catch::Contains("blk.5.ssm_a") && Catch::Contains("missing"));
  CHECK_THROWS_WITH(compiler::Qwen35Params::from_gguf(edited_tiny({{"qwen35.block_count", Value::of_str("8")}})),
                    Catch::Contains("block_count"));
  CHECK_THROWS_WITH(compiler::Qwen35Params::from_gguf(edited_tiny({{"qwen35.embedding_length", Value::of_u32(0)}})),
                    Catch::Contains("embedding_length"));
}

TEST_CASE("lowered graph and plan round-trip through their text forms", "[compiler][fixtures]") {
  gguf::File f = gguf::File::open(kFixtures + "tiny.gguf");
  auto plan = compiler::compile(f, compiler::Rig::load(kRigs + "cpu.toml"), {});
  const std::string text = ir::print(plan.graph);
  CHECK(ir::print(ir::parse(text)) == text);
  auto dir = std::filesystem::temp_directory_path() / "qrig-test-plan";
  std::filesystem::remove_all(dir);
  plan.write(dir.string());
  ir::Plan back = ir::Plan::read(dir.string());
  CHECK(back.to_toml() == plan.to_toml());
  CHECK(ir::print(back.graph) == text);
  CHECK(back.backend == "cpu");
  CHECK(back.k_dtype == "f32");
  CHECK(back.v_dtype == "f32");
  CHECK(back.vocab_real == 1033);  // PAD rows excluded
  CHECK(back.model_size == (int64_t)f.file_size());
  // A hand-broken plan is refused with the file named.
  {
    std::ofstream(dir / "graph.ir") << "graph g {\n  %x = add(%a) : f32[T]\n}\n";
  }
  CHECK_THROWS_WITH(ir::Plan::read(dir.string()), Catch::Contains("graph.ir"));
  CHECK_THROWS_WITH(ir::Plan::read((dir / "nothing").string()), Catch::Contains("not a plan directory"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("passes decide per rig", "[compiler][fixtures]") {
  gguf::File f = gguf::File::open(kFixtures + "tiny.gguf");
  auto cmp = compiler::compile(f, compiler::Rig::load(kRigs + "cmp-100-210-x4.toml"), {});
  CHECK(cmp.backend == "cuda");
  CHECK(cmp.arch_target == "sm_70");
  CHECK(cmp.kernel_family == "dp4a");
  CHECK(cmp.k_dtype == "f16");
  CHECK(cmp.v_dtype == "f16");
  REQUIRE(cmp.placement.size() == 4);
  CHECK(cmp.placement.front().first_layer == 0);
  CHECK(cmp.placement.back().last_layer == 7);
  for (size_t k = 1; k < 4; ++k) CHECK(cmp.placement[k].first_layer == cmp.placement[k - 1].last_layer + 1);
  int caches = 0;
  for (const auto& st : cmp.graph.states)
    if (st.name.rfind("k.", 0) == 0 || st.name.rfind("v.", 0) == 0) {
      CHECK(st.type.dtype == ir::DType::f16);
      ++caches;
    }
  CHECK(caches == 4);  // keys and values of the two attention layers
  CHECK(cmp.device_sms == 68);  // the CMP preset's SM count: tilings and KV splits are chosen for it
  compiler::CompileOptions one;
  one.max_gpus = 1;  // what the single-GPU runtime asks for when it compiles implicitly
  auto cmp1 = compiler::compile(f, compiler::Rig::load(kRigs + "cmp-100-210-x4.toml"), one);
  REQUIRE(cmp1.placement.size() == 1);
  CHECK(cmp1.placement[0].device == "cuda:0");
  CHECK(cmp1.placement[0].last_layer == 7);
  one.max_gpus = 2;
  CHECK(compiler::compile(f, compiler::Rig::load(kRigs + "cmp-100-210-x4.toml"), one).placement.size() == 2);
  // Two activation planes for matmuls of at most precise_rows rows: 4 by default on GPUs (decode), every
  // matmul with --precise (clamped to the step size), none asked; CPU plans run fp32 (0, unused).
  CHECK(cmp.precise_rows == compiler::kDefaultPreciseRows);
  compiler::CompileOptions precise;
  precise.precise_rows = INT64_MAX;
  const auto all_precise = compiler::compile(f, compiler::Rig::load(kRigs + "cmp-100-210-x4.toml"), precise);
  CHECK(all_precise.precise_rows == all_precise.max_batch_tokens);
  precise.precise_rows = 0;
  CHECK(compiler::compile(f, compiler::Rig::load(kRigs + "cmp-100-210-x4.toml"), precise).precise_rows == 0);
  CHECK(compiler::compile(f, compiler::Rig::default_cpu(), {}).precise_rows == 0);

  auto h200 = compiler::compile(f, compiler::Rig::load(kRigs + "h200.toml"), {});
  CHECK(h200.arch_target == "sm_90");
  CHECK(h200.placement.size() == 1);
  CHECK(h200.context_length == 8192);  // capped by the model's context_length

  compiler::CompileOptions co;
  co.force_backend = "cpu";
  auto forced = compiler::compile(f, compiler::Rig::load(kRigs + "h200.toml"), co);
  CHECK(forced.backend == "cpu");
  // Context length that does not fit is refused; one that fits is kept.
  co = {};
  co.context_length = 4096;
  CHECK(compiler::compile(f, compiler::Rig::load(kRigs + "cpu.toml"), co).context_length == 4096);
  auto small = compiler::Rig::parse("[[device]]\nkind=\"cpu\"\nmemory_gib=0.15\n", "small");
  co.context_length = 100000;
  CHECK_THROWS_WITH(compiler::compile(f, small, co), Catch::Contains("does not fit"));
  auto tiny_mem = compiler::Rig::parse("[[device]]\nkind=\"cpu\"\nmemory_gib=0.01\n", "tiny");
  CHECK_THROWS_WITH(compiler::compile(f, tiny_mem, {}), Catch::Contains("does not fit"));
  CHECK_THROWS_WITH(compiler::Rig::parse("[[device]]\nkind=\"tpu\"\nmemory_gib=1.0\n", "bad"), Catch::Contains("tpu"));
  CHECK_THROWS_WITH(compiler::Rig::parse("[rig]\nname=\"x\"\n", "bad"), Catch::Contains("at least one"));
  CHECK_THROWS_WITH(compiler::Rig::parse("[[device]\n", "bad"), Catch::Contains("bad"));
}

TEST_CASE("CUDA plans record how their kernels are compiled and loaded; bad values are refused", "[compiler]") {
  gguf::File f = gguf::File::open(kFixtures + "tiny.gguf");
  const auto rig = compiler::Rig::load(kRigs + "cmp-100-210-x4.toml");
  compiler::CompileOptions one;
  one.max_gpus = 1;
  auto plan = compiler::compile(f, rig, one);
  CHECK(plan.kernel_code == "cubin");
  CHECK(plan.kernel_nvrtc.empty());  // chosen where the plan is precompiled or runs (qrig compile records it)
  one.ptx_jit = true;
  auto ptx = compiler::compile(f, rig, one);
  CHECK(ptx.kernel_code == "ptx");
  bool noted = false;
  for (const auto& n : ptx.notes) noted |= n.find("sm_70 PTX through the driver's JIT") != std::string::npos;
  CHECK(noted);
  compiler::CompileOptions cpu_ptx;
  cpu_ptx.ptx_jit = true;
  CHECK_THROWS_WITH(compiler::compile(f, compiler::Rig::default_cpu(), cpu_ptx), Catch::Contains("--ptx"));

  // Round trip with the fields a precompiling `qrig compile` writes.
  ptx.kernel_nvrtc = "11.8";
  ptx.kernel_target = "sm_70";
  auto dir = std::filesystem::temp_directory_path() / "qrig-test-cuda-plan";
  std::filesystem::remove_all(dir);
  ptx.write(dir.string());
  ir::Plan back = ir::Plan::read(dir.string());
  CHECK(back.to_toml() == ptx.to_toml());
  CHECK(back.kernel_nvrtc == "11.8");
  CHECK(back.kernel_target == "sm_70");
  CHECK(back.kernel_code == "ptx");

  // A hand-edited plan.toml with a bad value names the field.
  const std::string good = ptx.to_toml();
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    REQUIRE(at != std::string::npos);
    t.replace(at, from.size(), to);
    std::ofstream(dir / "plan.toml") << t;
  };
  with("kernel_nvrtc = '11.8'", "kernel_nvrtc = 'eleven'");
  CHECK_THROWS_WITH(ir::Plan::read(dir.string()), Catch::Contains("kernel_nvrtc 'eleven'"));
  with("kernel_target = 'sm_70'", "kernel_target = 'compute_70'");
  CHECK_THROWS_WITH(ir::Plan::read(dir.string()), Catch::Contains("kernel_target 'compute_70'"));
  with("kernel_target = 'sm_70'\n", "");
  CHECK_THROWS_WITH(ir::Plan::read(dir.string()), Catch::Contains("go together"));
  with("kernel_code = 'ptx'", "kernel_code = 'elf'");
  CHECK_THROWS_WITH(ir::Plan::read(dir.string()), Catch::Contains("kernel_code"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("programmatic dependent launch: on for sm_90 plans, off for sm_70 ones and by request", "[compiler]") {
  gguf::File f = gguf::File::open(kFixtures + "tiny.gguf");
  auto noted = [](const ir::Plan& p, const std::string& what) {
    for (const auto& n : p.notes)
      if (n.rfind("launch: ", 0) == 0) return n.find(what) != std::string::npos;
    return false;
  };
  const auto h200 = compiler::Rig::load(kRigs + "h200.toml");
  const auto cmp = compiler::Rig::load(kRigs + "cmp-100-210-x4.toml");
  const ir::Plan on = compiler::compile(f, h200, {});
  CHECK(on.arch_target == "sm_90");
  CHECK(on.programmatic_launch);
  CHECK(noted(on, "programmatic dependent launch (sm_90+)"));
  compiler::CompileOptions off;
  off.programmatic_launch = false;
  const ir::Plan plain = compiler::compile(f, h200, off);
  CHECK_FALSE(plain.programmatic_launch);
  CHECK(noted(plain, "off by request"));
  compiler::CompileOptions one;
  one.max_gpus = 1;
  one.ptx_jit = true;  // an sm_70 plan checked on a newer GPU stays plain: its kernels have no wait
  const ir::Plan old = compiler::compile(f, cmp, one);
  CHECK_FALSE(old.programmatic_launch);
  CHECK(noted(old, "sm_70 has no programmatic dependent launch"));
  CHECK_FALSE(compiler::compile(f, compiler::Rig::default_cpu(), {}).programmatic_launch);

  // The decision travels in plan.toml; a plan written before it reads as plain launches.
  auto dir = std::filesystem::temp_directory_path() / ("qrig-test-pdl-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  on.write(dir.string());
  CHECK(ir::Plan::read(dir.string()).programmatic_launch);
  std::string t = on.to_toml();
  const size_t at = t.find("programmatic_launch = true\n");
  REQUIRE(at != std::string::npos);
  t.erase(at, std::string("programmatic_launch = true\n").size());
  std::ofstream(dir / "plan.toml") << t;
  CHECK_FALSE(ir::Plan::read(dir.string()).programmatic_launch);
  std::filesystem::remove_all(dir);
}

TEST_CASE("broken hyperparameters are refused when the model is compiled, naming the key", "[compiler][fixtures]") {
  using gguf::Value;
  const double nan = std::nan("");
  struct Bad {
    std::string key;
    Value value;
  };
  const std::vector<Bad> bad = {
      {"qwen35.rope.freq_base", Value::of_f32(0.0f)},
      {"qwen35.rope.freq_base", Value::of_f32(-1e6f)},
      {"qwen35.rope.freq_base", Value::of_f32((float)nan)},
      {"qwen35.rope.freq_base", Value::of_f32(INFINITY)},
      {"qwen35.attention.layer_norm_rms_epsilon", Value::of_f32(0.0f)},
      {"qwen35.attention.layer_norm_rms_epsilon", Value::of_f32((float)nan)},
      {"qwen35.attention.layer_norm_rms_epsilon", Value::of_f32(2.0f)},
      {"qwen35.rope.dimension_sections", Value::of_i32s({11, 11, 40, 0})},
      {"qwen35.rope.dimension_sections", Value::of_i32s({-1, 11, 10, 0})},
      {"qwen35.ssm.conv_kernel", Value::of_u32(1000)},
  };
  for (const Bad& b : bad) {
    INFO(b.key);
    const std::string key = b.key.substr(std::string("qwen35.").size());
    CHECK_THROWS_WITH(compiler::Qwen35Params::from_gguf(edited_tiny({{b.key, b.value}})),
                      Catch::Contains(key));
  }
  // The fixture's own values pass (a check that refuses everything would fail here).
  CHECK_NOTHROW(compiler::Qwen35Params::from_gguf(edited_tiny({})));
}

TEST_CASE("nonsense in plan.toml or a rig file is refused, naming the field", "[compiler][fixtures]") {
  gguf::File f = gguf::File::open(kFixtures + "tiny.gguf");
  const auto plan = compiler::compile(f, compiler::Rig::load(kRigs + "cpu.toml"), {});
  auto dir = std::filesystem::temp_directory_path() / ("qrig-test-nonsense-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  plan.write(dir.string());
  const std::string good = plan.to_toml();
  struct Edit {
    std::string line_start;  // the line of plan.toml to replace (its first characters)
    std::string with;
    std::string named;       // what the error must name
  };
  const std::vector<Edit> edits = {
      {"max_sequences = ", "max_sequences = 9223372036854775807", "max_sequences"},
      {"max_sequences = ", "max_sequences = 0", "max_sequences"},
      {"context_length = ", "context_length = -5", "context_length"},
      {"k_dtype = ", "k_dtype = 'bogus'", "k_dtype"},
      {"v_dtype = ", "v_dtype = 3", "v_dtype"},
      {"gdn_chunk = ", "gdn_chunk = 40", "gdn_chunk"},
      {"max_batch_tokens = ", "max_batch_tokens = 1e9", "max_batch_tokens"},
      {"weight_bytes = ", "weight_bytes = -1", "weight_bytes"},
      {"backend = ", "backend = 'tpu'", "backend"},
      {"threads = ", "threads = -2", "threads"},
  };
  for (const Edit& e : edits) {
    INFO(e.with);
    std::string t = good;
    const size_t at = t.find("\n" + e.line_start);
    REQUIRE(at != std::string::npos);
    const size_t end = t.find('\n', at + 1);
    t.replace(at + 1, end - at - 1, e.with);
    std::ofstream(dir / "plan.toml") << t;
    CHECK_THROWS_WITH(ir::Plan::read(dir.string()), Catch::Contains(e.named));
  }
  std::ofstream(dir / "plan.toml") << good;
  CHECK_NOTHROW(ir::Plan::read(dir.string()));
  std::filesystem::remove_all(dir);

  const std::string cuda = "[[device]]\nkind = \"cuda\"\nname = \"x\"\narch = \"sm_70\"\n";
  CHECK_THROWS_WITH(compiler::Rig::parse(cuda + "sms = -1\nmemory_gib = 16.0\n", "r"), Catch::Contains("sms"));
  CHECK_THROWS_WITH(compiler::Rig::parse(cuda + "sms = 80\nmemory_gib = nan\n", "r"), Catch::Contains("memory_gib"));
  CHECK_THROWS_WITH(compiler::Rig::parse(cuda + "sms = 80\nmemory_gib = -3.0\n", "r"), Catch::Contains("memory_gib"));
  CHECK_THROWS_WITH(compiler::Rig::parse(cuda + "sms = 80\nmemory_gib = 16.0\nmem_bw_gbps = inf\n", "r"),
                    Catch::Contains("mem_bw_gbps"));
  CHECK_NOTHROW(compiler::Rig::parse(cuda + "sms = 80\nmemory_gib = 16.0\n", "r"));
}
