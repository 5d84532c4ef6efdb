// The draft pass (compiler/passes/plan_draft.cpp): the MTP head lowered into draft.ir with the fixture's convention,
// the cost model's choice and its note, the memory it counts per sequence, a plan directory round trip, and where
// drafting is refused (pipelines, dp4a-emulated, models without an MTP block, a hand-edited plan). CUDA plans draft
// with --draft N (off by default there): the passes give the head's graph its kernels, quantized matmul inputs,
// fusions, arena places and a cache in the plan's KV formats, and the memory pass counts it.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <unistd.h>

#include <fmt/format.h>

#include "compiler/compile.h"
#include "tests/fixtures.h"

using namespace qrig;

namespace {

const std::string kFixtures = qrig::fixtures::shared_dir() + "/fixtures/";
const std::string kRigs = std::string(QRIG_SOURCE_DIR) + "/rigs/";

compiler::Rig cpu_rig(int devices = 1) {
  std::string r;
  for (int k = 0; k < devices; ++k) r += "[[device]]\nkind=\"cpu\"\nmemory_gib=2.0\n";
  return compiler::Rig::parse(r, "t");
}

bool has_note(const ir::Plan& p, const std::string& s) {
  for (const auto& n : p.notes)
    if (n.find(s) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("the draft pass lowers the MTP head, chooses k by its cost model and counts its memory",
          "[compiler][fixtures]") {
  gguf::File f = gguf::File::open(kFixtures + "tiny-mtp.gguf");
  compiler::CompileOptions co;
  co.context_length = 512;
  const ir::Plan p = compiler::compile(f, cpu_rig(), co);
  REQUIRE(p.draft_tokens >= 1);
  REQUIRE(p.draft_tokens <= 4);
  CHECK(has_note(p, "the cost model's best"));
  // The convention: embedding half first into eh_proj, the head's own cache, shared_head_norm, the main lm_head.
  const ir::Graph& g = p.draft;
  REQUIRE(g.inputs.size() == 4);
  CHECK(g.inputs[3].name == "hidden");
  CHECK(std::get<std::string>(*g.attr("hidden_from")) == "hidden.8");
  const ir::Op* u = g.producer("m.u");
  REQUIRE(u);
  CHECK(u->kind == ir::OpKind::concat);
  CHECK(u->args == std::vector<std::string>{"m.en", "m.hn"});
  CHECK(g.producer("m.en")->s("weight") == "blk.8.nextn.enorm.weight");
  CHECK(g.producer("m.hn")->args[0] == "hidden");
  CHECK(g.producer("m.eh")->s("weight") == "blk.8.nextn.eh_proj.weight");
  CHECK(g.producer("m.out")->s("weight") == "blk.8.nextn.shared_head_norm.weight");
  CHECK(g.ops.back().s("weight") == "output.weight");
  int attention = 0;
  for (const auto& op : g.ops) {
    CHECK(op.s("device") == "cpu");
    attention += op.kind == ir::OpKind::attention;
    CHECK(op.kind != ir::OpKind::gdn);
  }
  CHECK(attention == 1);
  CHECK(g.states.size() == 2);  // its key and value cache only
  // Memory: the head's cache per token (f32, 1 kv head x 256, keys and values) and k copies of the recurrent states.
  CHECK(p.memory.draft_kv_bytes_per_token == 2 * 256 * 4);
  CHECK(p.memory.draft_rollback_bytes == p.draft_tokens * p.memory.state_bytes_per_sequence);
  const ir::Plan off = [&] {
    compiler::CompileOptions o = co;
    o.draft_tokens = 0;
    return compiler::compile(f, cpu_rig(), o);
  }();
  CHECK(off.draft_tokens == 0);
  CHECK(off.draft.ops.empty());
  CHECK(has_note(off, "draft: off: --draft 0"));
  CHECK(p.memory.devices[0].states - off.memory.devices[0].states ==
        p.max_sequences * (p.memory.draft_rollback_bytes + p.memory.draft_kv_bytes_per_token * p.context_length));
  // A plan directory keeps the draft graph (draft.ir) and the decision; a plan that stops drafting drops draft.ir.
  const std::string dir = (std::filesystem::temp_directory_path() / ("qrig-draft-plan-" + std::to_string(getpid()))).string();
  p.write(dir);
  const ir::Plan back = ir::Plan::read(dir);
  CHECK(back.draft_tokens == p.draft_tokens);
  CHECK(ir::print(back.draft) == ir::print(p.draft));
  CHECK(back.memory.draft_rollback_bytes == p.memory.draft_rollback_bytes);
  // A hand edit that claims drafting without draft.ir is refused naming the file.
  std::filesystem::remove(dir + "/draft.ir");
  CHECK_THROWS_WITH(ir::Plan::read(dir), Catch::Contains("draft.ir"));
  off.write(dir);
  CHECK(ir::Plan::read(dir).draft_tokens == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("drafting is refused by name where it is not implemented, and off by default there",
          "[compiler][fixtures]") {
  gguf::File f = gguf::File::open(kFixtures + "tiny-mtp.gguf");
  compiler::CompileOptions forced;
  forced.context_length = 512;
  forced.draft_tokens = 2;
  compiler::CompileOptions dflt;
  dflt.context_length = 512;
  // CUDA: drafting is on with --draft N only (unmeasured there), and refused on a pipeline of GPUs.
  const auto h200 = compiler::Rig::load(kRigs + "h200.toml");
  const ir::Plan cuda = compiler::compile(f, h200, dflt);
  CHECK(cuda.draft_tokens == 0);
  CHECK(cuda.draft.ops.empty());
  CHECK(has_note(cuda, "draft: off: on the CUDA backend drafting is turned on by --draft N"));
  const auto cmp = compiler::Rig::load(kRigs + "cmp-100-210-x4.toml");
  compiler::CompileOptions two_gpus = forced;
  two_gpus.max_gpus = 2;
  CHECK_THROWS_WITH(compiler::compile(f, cmp, two_gpus), Catch::Contains("pipeline"));
  CHECK_THROWS_WITH(compiler::compile(f, cpu_rig(3), forced), Catch::Contains("pipeline"));
  CHECK(compiler::compile(f, cpu_rig(3), dflt).draft_tokens == 0);
  compiler::CompileOptions emu = forced;
  emu.family = "dp4a-emulated";
  CHECK_THROWS_WITH(compiler::compile(f, cpu_rig(), emu), Catch::Contains("dp4a-emulated"));
  compiler::CompileOptions bad = forced;
  bad.draft_tokens = 5;
  CHECK_THROWS_WITH(compiler::compile(f, cpu_rig(), bad), Catch::Contains("0..4"));
  CHECK_THROWS_WITH(compiler::compile(f, h200, bad), Catch::Contains("0..4"));
  gguf::File plain = gguf::File::open(kFixtures + "tiny.gguf");
  CHECK_THROWS_WITH(compiler::compile(plain, cpu_rig(), forced), Catch::Contains("no MTP block"));
  CHECK_THROWS_WITH(compiler::compile(plain, h200, forced), Catch::Contains("no MTP block"));
  const ir::Plan none = compiler::compile(plain, cpu_rig(), dflt);
  CHECK(none.draft_tokens == 0);
  CHECK(has_note(none, "draft: off: the model has no MTP block"));
}

namespace {

// The op of `g` producing `value`.
const ir::Op& producer(const ir::Graph& g, const std::string& value) {
  const ir::Op* op = g.producer(value);
  REQUIRE(op);
  return *op;
}

}  // namespace

TEST_CASE("a CUDA plan with --draft N gets the MTP head's kernels, quantized inputs, arena places and cache",
          "[compiler][fixtures]") {
  gguf::File f = gguf::File::open(kFixtures + "tiny-mtp.gguf");
  for (const std::string rig : {"h200", "cmp-100-210-x4"}) {
    for (int64_t k : {1, 2, 4}) {
      INFO(rig << " --draft " << k);
      compiler::CompileOptions co;
      co.context_length = 512;
      co.max_gpus = 1;
      co.draft_tokens = k;
      const ir::Plan p = compiler::compile(f, compiler::Rig::load(kRigs + rig + ".toml"), co);
      compiler::CompileOptions o0 = co;
      o0.draft_tokens = 0;
      const ir::Plan off = compiler::compile(f, compiler::Rig::load(kRigs + rig + ".toml"), o0);
      REQUIRE(p.backend == "cuda");
      REQUIRE(p.draft_tokens == k);
      CHECK(has_note(p, fmt::format("draft: {} token(s) per step from the MTP head blk.8", k)));
      // Verify steps of one k + 1 tokens per sequence keep decode's two activation planes.
      CHECK(off.precise_rows == compiler::kDefaultPreciseRows);
      CHECK(p.precise_rows == std::max<int64_t>(compiler::kDefaultPreciseRows, p.max_sequences * (k + 1)));
      const ir::Graph& g = p.draft;
      const ir::DeviceMemory& dev = p.memory.devices.at(0);
      int quantized = 0, fused = 0, norms = 0, stacks = 0, add_norms = 0, swiglus = 0;
      for (const auto& op : g.ops) {
        INFO(op.describe());
        CHECK(op.s("device") == "cuda:0");
        quantized += op.kind == ir::OpKind::quantize;
        add_norms += op.kind == ir::OpKind::add_rmsnorm_quant;
        swiglus += op.kind == ir::OpKind::swiglu_quant;
        norms += op.kind == ir::OpKind::rmsnorm_quant || op.kind == ir::OpKind::add_rmsnorm_quant;
        fused += op.kind == ir::OpKind::rmsnorm_quant || op.kind == ir::OpKind::add_rmsnorm_quant ||
                 op.kind == ir::OpKind::swiglu_quant;
        stacks += op.kind == ir::OpKind::matmul_stack;
        if (op.kind == ir::OpKind::matmul) CHECK(g.type_of(op.args[0])->dtype == ir::DType::q8);
        CHECK(op.has("kernel") == (op.kind != ir::OpKind::gather_rows));
        CHECK_FALSE(op.has("decode_kernel"));  // the head runs one sequence per call
        if (op.has_result()) {
          REQUIRE(op.has("at"));
          // The head's part of the arena follows the main graph's (the main step's logits wait there for sampling
          // while the head runs).
          for (int64_t at : op.ints("at"))
            CHECK((at >= dev.arena - p.memory.draft_arena_bytes && at % 256 == 0 && at < dev.arena));
        }
        if (op.has("scratch")) {
          CHECK(op.ints("scratch")[0] >= dev.arena - p.memory.draft_arena_bytes);
          CHECK(op.ints("scratch")[0] + op.ints("scratch")[1] <= dev.arena);
        }
      }
      CHECK(quantized + fused >= 5);  // eh_proj's input, the attention and FFN inputs, ffn_down's, the lm_head's
      CHECK(norms >= 2);              // the layer's two norms feed only matmuls
      CHECK(add_norms == 1);          // the head's FFN norm with the residual add before it
      CHECK(swiglus == 1);            // its FFN activation with the quantize for ffn_down
      CHECK(stacks == 2);             // q|k|v and gate|up
      CHECK(producer(g, "logits").kind == ir::OpKind::matmul);
      CHECK(producer(g, "logits").s("weight") == "output.weight");
      // Its attention is the main model's attention layer's: the same kernels, for the head's own cache.
      const ir::Op* main_att = nullptr;
      for (const auto& op : p.graph.ops)
        if (op.kind == ir::OpKind::attention) main_att = &op;
      REQUIRE(main_att);
      for (const auto& op : g.ops)
        if (op.kind == ir::OpKind::attention) CHECK(op.s("kernel") == main_att->s("kernel"));
      REQUIRE(g.states.size() == 2);
      for (const auto& st : g.states) CHECK(ir::dtype_name(st.type.dtype) == std::string("f16"));
      // The kernel table lists the head's choices as "draft" rows.
      int draft_rows = 0;
      for (const auto& kc : p.kernels) draft_rows += kc.shape.rfind("draft", 0) == 0;
      CHECK(draft_rows >= 10);
      for (const auto& kc : off.kernels) CHECK(kc.shape.rfind("draft", 0) != 0);
      // Memory: the head's f16 cache (1 kv head x 256, keys and values), its waiting rows and k rollback copies per
      // sequence; its weights without the shared embedding and lm_head; its step buffers; its activations in the
      // arena, after the main graph's.
      CHECK(p.memory.draft_kv_bytes_per_token == 2 * 256 * 2);
      CHECK(p.memory.draft_pending_bytes == (k + 2) * 256 * 4);
      CHECK(p.memory.draft_rollback_bytes == k * p.memory.state_bytes_per_sequence);
      CHECK(p.memory.kv_bytes_per_token == off.memory.kv_bytes_per_token);
      CHECK(dev.states - off.memory.devices[0].states ==
            p.max_sequences * (p.memory.draft_kv_bytes_per_token * p.context_length + p.memory.draft_pending_bytes) +
                p.max_sequences * k * off.memory.snapshot_bytes);
      // (the step's output rows and their argmax grow with the rows a verify of every sequence at once asks for)
      CHECK(p.max_logit_rows == std::min(p.max_sequences * (k + 1), p.max_batch_tokens));
      CHECK(dev.io - off.memory.devices[0].io ==
            (2 * p.max_batch_tokens + 1) * 256 * 4 + 2 * (p.max_logit_rows - off.max_logit_rows) * 4);
      CHECK(p.memory.draft_weight_bytes > 0);
      CHECK(dev.weights - off.memory.devices[0].weights == p.memory.draft_weight_bytes);
      CHECK(p.memory.draft_arena_bytes > 0);
      // (the main graph's part grows a little with the verify steps' second planes)
      CHECK(dev.arena >= off.memory.devices[0].arena + p.memory.draft_arena_bytes);
      for (const auto& op : p.graph.ops)
        if (op.has("at"))
          for (int64_t at : op.ints("at")) CHECK(at < dev.arena - p.memory.draft_arena_bytes);
      CHECK(has_note(p, "memory: the MTP head on cuda:0"));
    }
  }
  // The head's cache follows the plan's key and value formats (and its attention kernels are renamed with them).
  compiler::CompileOptions co;
  co.context_length = 512;
  co.draft_tokens = 2;
  co.kv = "k8v8";
  const ir::Plan q8 = compiler::compile(f, compiler::Rig::load(kRigs + "h200.toml"), co);
  REQUIRE(q8.k_dtype == "q8");
  for (const auto& st : q8.draft.states) CHECK(ir::dtype_name(st.type.dtype) == std::string("q8"));
  for (const auto& op : q8.draft.ops)
    if (op.kind == ir::OpKind::attention || op.kind == ir::OpKind::kv_write) {
      CHECK(op.s("k_format") == "q8");
      CHECK(op.s("kernel").find("k8_v8") != std::string::npos);
    }
  CHECK(q8.memory.draft_kv_bytes_per_token < 2 * 256 * 2);
  // A plan directory keeps it; a draft.ir whose caches disagree with the plan's formats is refused.
  const std::string dir = (std::filesystem::temp_directory_path() / ("qrig-cuda-draft-" + std::to_string(getpid()))).string();
  q8.write(dir);
  const ir::Plan back = ir::Plan::read(dir);
  CHECK(back.draft_tokens == 2);
  CHECK(ir::print(back.draft) == ir::print(q8.draft));
  CHECK(back.memory.draft_arena_bytes == q8.memory.draft_arena_bytes);
  CHECK(back.memory.draft_weight_bytes == q8.memory.draft_weight_bytes);
  CHECK(back.memory.draft_pending_bytes == q8.memory.draft_pending_bytes);
  ir::Graph edited = q8.draft;
  for (auto& st : edited.states) st.type.dtype = ir::DType::f16;
  {
    std::ofstream out(dir + "/draft.ir");
    out << ir::print(edited);
  }
  CHECK_THROWS_WITH(ir::Plan::read(dir), Catch::Contains("draft.ir") && Catch::Contains("head caches are q8"));
  std::filesystem::remove_all(dir);
}
