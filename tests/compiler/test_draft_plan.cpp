// The draft pass (compiler/passes/plan_draft.cpp): the MTP head lowered into draft.ir with the fixture's convention,
// the cost model's choice and its note, the memory it counts per sequence, a plan directory round trip, and where
// drafting is refused (CUDA, pipelines, models without an MTP block, a hand-edited plan).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <unistd.h>

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
  const auto h200 = compiler::Rig::load(kRigs + "h200.toml");
  for (int64_t k : {1, 2, 4}) {  // the CUDA backend has the verify step and its rollback, not the MTP head
    compiler::CompileOptions o = forced;
    o.draft_tokens = k;
    CHECK_THROWS_WITH(compiler::compile(f, h200, o),
                      Catch::Contains("not implemented on the CUDA backend") && Catch::Contains("not the MTP draft head"));
  }
  const ir::Plan cuda = compiler::compile(f, h200, dflt);
  CHECK(cuda.draft_tokens == 0);
  CHECK(has_note(cuda, "draft: off: speculative decoding is not implemented on the CUDA backend"));
  CHECK_THROWS_WITH(compiler::compile(f, cpu_rig(3), forced), Catch::Contains("pipeline"));
  CHECK(compiler::compile(f, cpu_rig(3), dflt).draft_tokens == 0);
  compiler::CompileOptions emu = forced;
  emu.family = "dp4a-emulated";
  CHECK_THROWS_WITH(compiler::compile(f, cpu_rig(), emu), Catch::Contains("dp4a-emulated"));
  compiler::CompileOptions bad = forced;
  bad.draft_tokens = 5;
  CHECK_THROWS_WITH(compiler::compile(f, cpu_rig(), bad), Catch::Contains("0..4"));
  gguf::File plain = gguf::File::open(kFixtures + "tiny.gguf");
  CHECK_THROWS_WITH(compiler::compile(plain, cpu_rig(), forced), Catch::Contains("no MTP block"));
  const ir::Plan none = compiler::compile(plain, cpu_rig(), dflt);
  CHECK(none.draft_tokens == 0);
  CHECK(has_note(none, "draft: off: the model has no MTP block"));
}
