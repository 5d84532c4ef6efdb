// The prefix-cache pass (compiler/passes/plan_prefix_cache.cpp) on the tiny fixture: markers from its ChatML
// template and vocabulary, the default budget (16 snapshots per slot) counted in the device's snapshot bytes,
// --prefix-cache-mib N and 0, CUDA plans without a shared index (and a budget asked for there refused by name),
// and the plan's [prefix_cache] table read back and checked.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "compiler/compile.h"
#include "tests/fixtures.h"

using namespace qrig;

namespace {
const std::string kTinyGguf = qrig::fixtures::shared_dir() + "/fixtures/tiny.gguf";
const std::string kRigDir = std::string(QRIG_SOURCE_DIR) + "/rigs/";
}  // namespace

TEST_CASE("prefix cache pass: markers, budget, modes", "[compiler][fixtures]") {
  gguf::File f = gguf::File::open(kTinyGguf);
  compiler::CompileOptions co;
  co.context_length = 512;
  co.max_sequences = 2;
  auto p = compiler::compile(f, compiler::Rig::default_cpu(), co);
  const auto& pc = p.prefix_cache;
  CHECK(pc.mode == "shared");
  CHECK(pc.turn_start == 1001);  // <|im_start|> (fixtures/README.md: added tokens from 1000)
  CHECK(f.get_string_array("tokenizer.ggml.tokens")[(size_t)pc.header_end] == "Ċ");
  CHECK(pc.header_max == 8);
  CHECK(pc.chunk == 512);
  CHECK(pc.budget_bytes == 16 * 2 * p.memory.snapshot_bytes);  // the default rig has room for all of it
  REQUIRE(p.memory.devices.size() == 1);
  CHECK(p.memory.devices[0].snapshots == 2 * p.memory.snapshots_per_slot * p.memory.snapshot_bytes + pc.budget_bytes);

  // A rig with little memory: at most a quarter of what is left for the caches, or none.
  const auto small = compiler::Rig::parse("[[device]]\nkind=\"cpu\"\nmemory_gib=0.14\n", "small");
  compiler::CompileOptions sc = co;
  sc.context_length = 64;
  auto ps = compiler::compile(f, small, sc);
  CHECK((ps.prefix_cache.mode == "per-slot" || ps.prefix_cache.budget_bytes < 16 * 2 * ps.memory.snapshot_bytes));
  co.prefix_cache_mib = 3;
  CHECK(compiler::compile(f, compiler::Rig::default_cpu(), co).prefix_cache.budget_bytes == 3 << 20);
  co.prefix_cache_mib = 0;
  auto off = compiler::compile(f, compiler::Rig::default_cpu(), co);
  CHECK(off.prefix_cache.mode == "off");
  CHECK(off.prefix_cache.budget_bytes == 0);
  CHECK(off.prefix_cache.turn_start == 1001);  // the cut points are the same whether or not anything is cached

  compiler::CompileOptions gpu;
  gpu.max_gpus = 1;
  auto cuda = compiler::compile(f, compiler::Rig::load(kRigDir + "cmp-100-210-x4.toml"), gpu);
  CHECK(cuda.prefix_cache.mode == "per-slot");
  CHECK(cuda.prefix_cache.budget_bytes == 0);
  gpu.prefix_cache_mib = 8;
  CHECK_THROWS_WITH(compiler::compile(f, compiler::Rig::load(kRigDir + "cmp-100-210-x4.toml"), gpu),
                    Catch::Contains("--prefix-cache-mib") && Catch::Contains("CPU backend only"));

  // Round trip, and a plan whose [prefix_cache] contradicts itself is refused.
  const std::string dir = "/tmp/qrig_test_prefix_plan_" + std::to_string(getpid());
  p.write(dir);
  auto back = ir::Plan::read(dir);
  CHECK(back.prefix_cache.mode == pc.mode);
  CHECK(back.prefix_cache.budget_bytes == pc.budget_bytes);
  CHECK(back.prefix_cache.turn_start == pc.turn_start);
  CHECK(back.prefix_cache.header_end == pc.header_end);
  CHECK(back.prefix_cache.markers == pc.markers);
  ir::Plan bad = p;
  bad.prefix_cache.mode = "off";  // with a budget
  bad.write(dir);
  CHECK_THROWS_WITH(ir::Plan::read(dir), Catch::Contains("prefix_cache mode 'off'"));
  bad = p;
  bad.prefix_cache.chunk = 100;
  bad.write(dir);
  CHECK_THROWS_WITH(ir::Plan::read(dir), Catch::Contains("not a multiple of gdn_chunk"));
  std::filesystem::remove_all(dir);
}
