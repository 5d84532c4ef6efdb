// The placement pass on full-size metadata (sparse `qrig synth` files: the header of the real layout, no weights):
// 27B Q8_0 over the four-CMP rig at a given context and at the largest that fits, 9B on one CMP card, the error
// that says how many cards would do; stages within their budgets and balanced by the cost model; the pipeline's
// plan fields round-trip and nonsense in them is refused.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "compiler/compile.h"
#include "ir/plan.h"
#include "tests/plan_presets.h"

using namespace qrig;

namespace {

const std::string kCmp = presets::kRigs + "cmp-100-210-x4.toml";

// Stage costs as the pass's model weighs them (each stage's share of the prefill time + its share of decode).
double imbalance(const ir::Plan& p) {
  double tp = 0, td = 0;
  for (const auto& pl : p.placement) tp += pl.prefill_us_per_token, td += pl.decode_us_per_token;
  double worst = 0, mean = 0;
  for (const auto& pl : p.placement) {
    const double c = pl.prefill_us_per_token / tp + pl.decode_us_per_token / td;
    worst = std::max(worst, c);
    mean += c / (double)p.placement.size();
  }
  return worst / mean;
}

void check_fits(const ir::Plan& p) {
  REQUIRE(p.memory.devices.size() == p.placement.size());
  for (const auto& d : p.memory.devices) {
    INFO(d.device);
    CHECK(d.total <= d.budget);
    CHECK(d.budget == (int64_t)(16.0 * (1 << 30) * compiler::kDefaultGpuMemoryUtilization));
    CHECK(d.weights > 0);
  }
}

}  // namespace

TEST_CASE("27B Q8_0 on four CMP cards: a balanced pipeline within every card's budget", "[compiler][pipeline]") {
  compiler::CompileOptions o;
  o.context_length = 32768;
  const ir::Plan p = presets::compile_preset("27b", "cmp-100-210-x4", o);
  REQUIRE(p.placement.size() == 4);
  CHECK(p.context_length == 32768);
  check_fits(p);
  // 64 layers, about 16 per card (the last also holds the lm_head, 1.3 GB: fewer layers); every stage's share of
  // the cost model within 10% of the mean.
  for (const auto& pl : p.placement) {
    CHECK(pl.last_layer - pl.first_layer + 1 >= 14);
    CHECK(pl.last_layer - pl.first_layer + 1 <= 18);
  }
  CHECK(p.placement.back().last_layer - p.placement.back().first_layer <
        p.placement.front().last_layer - p.placement.front().first_layer);
  CHECK(imbalance(p) < 1.10);
  for (size_t s = 0; s < 4; ++s) CHECK(p.placement[s].ordinal == (int64_t)s);
  CHECK(p.pipeline_micro_batch == 512);
  CHECK(p.pipeline_decode_group_rows >= 1);
  CHECK(p.memory.bridge_host_bytes == 3 * 2 * 512 * 5120 * 4);
  // Three bridges, each on its stage's first layer, moving the residual stream; every other op reads its own
  // device's values (ir::verify checks that).
  int bridges = 0;
  for (const auto& op : p.graph.ops)
    if (op.kind == ir::OpKind::bridge) {
      ++bridges;
      CHECK(op.s("to") == op.s("device"));
      CHECK(op.types[0].shape.back() == 5120);
    }
  CHECK(bridges == 3);
  // The embedding on the first stage, the head on the last.
  for (const auto& op : p.graph.ops) {
    if (op.kind == ir::OpKind::embed) CHECK(op.s("device") == "cuda:0");
    if (op.kind == ir::OpKind::gather_rows) CHECK(op.s("device") == "cuda:3");
  }
  CHECK(p.memory.devices.back().sampling > 0);
  CHECK(p.memory.devices.front().sampling == 0);
}

TEST_CASE("27B on four CMP cards without --ctx takes the largest context that fits; one more token does not",
          "[compiler][pipeline]") {
  const ir::Plan p = presets::compile_preset("27b", "cmp-100-210-x4", {});
  REQUIRE(p.placement.size() == 4);
  check_fits(p);
  CHECK(p.context_length > 32768);
  if (p.context_length < 262144) {  // capped by the model's context or by memory
    compiler::CompileOptions o;
    o.context_length = p.context_length + 1;
    CHECK_THROWS_WITH(presets::compile_preset("27b", "cmp-100-210-x4", o), Catch::Contains("fit"));
  }
}

TEST_CASE("9B Q8_0 fits one CMP card; 27B on one says how many it needs", "[compiler][pipeline]") {
  compiler::CompileOptions one;
  one.max_gpus = 1;
  one.context_length = 8192;
  const ir::Plan p = presets::compile_preset("9b", "cmp-100-210-x4", one);
  REQUIRE(p.placement.size() == 1);
  CHECK(p.pipeline_micro_batch == 0);
  check_fits(p);
  one.context_length = 32768;
  int64_t need = 0;
  try {
    presets::compile_preset("27b", "cmp-100-210-x4", one);
    FAIL("27B Q8_0 compiled for one 16 GiB card");
  } catch (const compiler::CompileError& e) {
    const std::string m = e.what();
    INFO(m);
    const size_t at = m.find("needs ");
    REQUIRE(at != std::string::npos);
    need = std::stoll(m.substr(at + 6));
    CHECK(m.find(" of these 16 GiB GPUs (NVIDIA CMP 100-210); 1 allowed by --gpus 1") != std::string::npos);
    CHECK(m.find("at ctx 32768 with 4 sequence(s)") != std::string::npos);
  }
  // What the message says is what the compiler finds: that many cards fit, one fewer does not.
  REQUIRE(need >= 2);
  REQUIRE(need <= 4);
  one.max_gpus = need;
  CHECK(presets::compile_preset("27b", "cmp-100-210-x4", one).placement.size() == (size_t)need);
  one.max_gpus = need - 1;
  if (need - 1 > 1) CHECK_THROWS_WITH(presets::compile_preset("27b", "cmp-100-210-x4", one), Catch::Contains("needs"));
}

TEST_CASE("a rig may put two stages on one GPU (ordinal); the pipeline's fields round-trip; nonsense is refused",
          "[compiler][pipeline][fixtures]") {
  const std::string dev = "[[device]]\nkind = \"cuda\"\nname = \"g\"\narch = \"sm_90\"\nsms = 132\nmemory_gib = 16.0\n"
                          "mem_bw_gbps = 4000\ndp4a_tops = 130\nordinal = 0\n";
  const compiler::Rig rig = compiler::Rig::parse(dev + dev + dev, "one-gpu");
  const gguf::File f = gguf::File::open(presets::kFixtures + "tiny.gguf");
  compiler::CompileOptions o;
  o.context_length = 1024;
  const ir::Plan p = compiler::compile(f, rig, o);
  REQUIRE(p.placement.size() == 3);
  for (const auto& pl : p.placement) CHECK(pl.ordinal == 0);
  CHECK(p.placement[1].device == "cuda:1");

  presets::ScratchDir dir("pipeline-plan");
  p.write(dir.path.string());
  const ir::Plan r = ir::Plan::read(dir.path.string());
  REQUIRE(r.placement.size() == 3);
  for (size_t s = 0; s < 3; ++s) {
    CHECK(r.placement[s].device == p.placement[s].device);
    CHECK(r.placement[s].ordinal == 0);
    CHECK(r.placement[s].first_layer == p.placement[s].first_layer);
    CHECK(r.placement[s].last_layer == p.placement[s].last_layer);
    CHECK(r.placement[s].prefill_us_per_token == p.placement[s].prefill_us_per_token);
  }
  CHECK(r.pipeline_micro_batch == p.pipeline_micro_batch);
  CHECK(r.pipeline_decode_group_rows == p.pipeline_decode_group_rows);
  CHECK(r.memory.bridge_host_bytes == p.memory.bridge_host_bytes);
  CHECK(ir::print(r.graph) == ir::print(p.graph));

  const std::string good = p.to_toml();
  struct Edit {
    std::string from, to, named;
  };
  const std::vector<Edit> edits = {
      {"pipeline_micro_batch = 512", "pipeline_micro_batch = 0", "pipeline_micro_batch"},
      {"pipeline_micro_batch = 512", "pipeline_micro_batch = 100", "pipeline_micro_batch"},
      {"pipeline_decode_group_rows = ", "pipeline_decode_group_rows = 0 #", "pipeline_decode_group_rows"},
      {"device = 'cuda:1'", "device = 'cuda:0'", "appears twice"},
      {"ordinal = 0", "ordinal = -1", "ordinal"},
      {"first_layer = 0", "first_layer = 1", "first placement"},
  };
  for (const Edit& e : edits) {
    INFO(e.to);
    std::string t = good;
    const size_t at = t.find(e.from, e.from.rfind("pipeline", 0) == 0 ? 0 : t.find("[[placement]]"));
    REQUIRE(at != std::string::npos);
    t.replace(at, e.from.size(), e.to);
    std::ofstream(dir.path / "plan.toml") << t;
    CHECK_THROWS_WITH(ir::Plan::read(dir.path.string()), Catch::Contains(e.named));
  }
  // graph.ir with an op on a device the placement lacks, or reading across devices without a bridge.
  std::ofstream(dir.path / "plan.toml") << good;
  const std::string graph = ir::print(p.graph);
  auto with_graph = [&](const std::string& from, const std::string& to) {
    std::string g = graph;
    const size_t at = g.find(from);
    REQUIRE(at != std::string::npos);
    g.replace(at, from.size(), to);
    std::ofstream(dir.path / "graph.ir") << g;
  };
  {
    std::string g = graph;
    for (size_t at; (at = g.find("\"cuda:2\"")) != std::string::npos;) g.replace(at, 8, "\"cuda:7\"");
    std::ofstream(dir.path / "graph.ir") << g;
  }
  CHECK_THROWS_WITH(ir::Plan::read(dir.path.string()), Catch::Contains("not on a device of the placement"));
  with_graph("from=\"cuda:0\"", "from=\"cuda:1\"");
  CHECK_THROWS_WITH(ir::Plan::read(dir.path.string()), Catch::Contains("bridge"));
  std::ofstream(dir.path / "graph.ir") << graph;
  CHECK_NOTHROW(ir::Plan::read(dir.path.string()));
  CHECK_THROWS_WITH(compiler::Rig::parse("[[device]]\nkind=\"cpu\"\nmemory_gib=1\nordinal=0\n", "r"),
                    Catch::Contains("ordinal"));
}
