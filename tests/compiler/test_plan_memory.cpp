// plan_memory on a hand-made graph (tests/compiler: the pass alone, not the lowering): an embedding, a key/value
// cache write, a norm, the output rows and lm_head, with a conv-like recurrent state, on a CPU rig whose memory
// is small enough that the context length is decided by the KV bytes. Every byte count is worked out here by hand
// from the shapes, and the context that fits is checked at its edge (fits, one more token does not).
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include "compiler/passes/passes.h"
#include "ir/ir.h"
#include "tests/fixtures.h"

using namespace qrig;

namespace {

ir::Op make_op(ir::OpKind k, std::vector<std::string> args, std::string result, std::vector<int64_t> shape,
               std::vector<std::pair<std::string, ir::AttrValue>> attrs) {
  ir::Op o;
  o.kind = k;
  o.args = std::move(args);
  attrs.emplace_back("device", std::string("cpu"));
  o.attrs = std::move(attrs);
  if (!result.empty()) {
    o.results = {result};
    o.types = {{ir::DType::f32, std::move(shape)}};
  }
  return o;
}

ir::Graph hand_made() {
  ir::Graph g;
  g.name = "hand";
  g.inputs = {{"tokens", {ir::DType::i32, {ir::kTokens}}}, {"pos", {ir::DType::i32, {ir::kTokens}}},
              {"rows", {ir::DType::i32, {ir::kRows}}}};
  g.states = {{"k.0", {ir::DType::f32, {ir::kContext, 256}}},
              {"v.0", {ir::DType::f32, {ir::kContext, 256}}},
              {"conv.0", {ir::DType::f32, {3, 512}}}};
  g.ops.push_back(make_op(ir::OpKind::embed, {"tokens"}, "x0", {ir::kTokens, 256},
                          {{"weight", std::string("token_embd.weight")}, {"layer", int64_t{-1}}}));
  g.ops.push_back(make_op(ir::OpKind::kv_write, {"x0", "x0", "pos"}, "", {},
                          {{"k_cache", std::string("k.0")}, {"v_cache", std::string("v.0")}, {"layer", int64_t{0}}}));
  g.ops.push_back(make_op(ir::OpKind::rmsnorm, {"x0"}, "xf", {ir::kTokens, 256},
                          {{"weight", std::string("output_norm.weight")}, {"eps", 1e-6}, {"layer", int64_t{1}}}));
  g.ops.push_back(make_op(ir::OpKind::gather_rows, {"xf", "rows"}, "out_rows", {ir::kRows, 256}, {{"layer", int64_t{1}}}));
  g.ops.push_back(make_op(ir::OpKind::matmul, {"out_rows"}, "logits", {ir::kRows, 1088},
                          {{"weight", std::string("output.weight")}, {"layer", int64_t{1}}}));
  g.outputs = {"logits"};
  ir::verify(g);
  return g;
}

}  // namespace

TEST_CASE("plan_memory's byte counts and context fit on a hand-made graph", "[compiler][fixtures]") {
  const gguf::File f = gguf::File::open(fixtures::shared_path("fixtures/tiny.gguf"));
  const double gib = 0.01;  // 10737418 bytes: the weights (8.5 MB) leave room for a few hundred tokens
  const compiler::Rig rig = compiler::Rig::parse(fmt::format("[[device]]\nkind=\"cpu\"\nmemory_gib={}\n", gib), "r");
  auto run = [&](int64_t ctx) {
    compiler::CompileOptions o;
    o.context_length = ctx;
    o.kv = "k32v32";  // the CPU reference's exact caches (the KV pass would otherwise pick a format that fits)
    compiler::CompileContext cx{f, compiler::Qwen35Params::from_gguf(f), rig, o, {}, {}};
    ir::Plan& p = cx.plan;
    p.backend = "cpu";
    p.max_batch_tokens = 64;
    p.max_logit_rows = 4;
    p.max_sequences = 2;
    p.placement = {{"cpu", -1, 0, 7}};
    p.graph = hand_made();
    compiler::passes::plan_memory(cx);
    return p;
  };
  const ir::Plan p = run(0);
  // By hand. Weights: the CPU maps the file, every tensor resident.
  int64_t file_bytes = 0;
  for (const auto& t : f.tensors()) file_bytes += (int64_t)t.n_bytes;
  const int64_t kv_per_token = 2 * 256 * 4;  // keys and values, 256 values each, f32 on the CPU
  const int64_t state = 3 * 512 * 4;        // the recurrent state
  // The CPU keeps every value of a step: rows of 64 tokens (output rows counted at the step size too).
  const int64_t arena = 64 * 256 * 4 + 64 * 256 * 4 + 64 * 256 * 4 + 64 * 1088 * 4;
  const int64_t budget = (int64_t)(gib * 1024 * 1024 * 1024);
  const int64_t fixed = file_bytes + arena + 2 * state + 2 * 4 * state;  // + states and snapshots of 2 slots
  const int64_t fits = (budget - fixed) / (kv_per_token * 2);
  REQUIRE(fits > 256);
  REQUIRE(fits < 8192);  // below the model's context: memory decides
  CHECK(p.memory.weight_bytes == file_bytes);
  CHECK(p.memory.kv_bytes_per_token == kv_per_token);
  CHECK(p.memory.state_bytes_per_sequence == state);
  CHECK(p.memory.snapshot_bytes == state);
  CHECK(p.memory.snapshots_per_slot == 4);
  CHECK(p.memory.budget_bytes == budget);
  REQUIRE(p.memory.devices.size() == 1);
  const ir::DeviceMemory& d = p.memory.devices[0];
  CHECK(d.weights == file_bytes);
  CHECK(d.arena == arena);
  CHECK(d.io == 0);
  CHECK(d.sampling == 0);
  CHECK(d.snapshots == 2 * 4 * state);
  CHECK(p.context_length == fits);
  CHECK(d.states == 2 * state + 2 * kv_per_token * fits);
  CHECK(d.total == d.weights + d.arena + d.states + d.snapshots);
  CHECK(d.total <= budget);
  CHECK(budget - d.total < kv_per_token * 2);  // one more token would not fit
  // Asked for: the edge fits, one more token is refused.
  CHECK(run(fits).context_length == fits);
  CHECK_THROWS_WITH(run(fits + 1), Catch::Contains(fmt::format("context length {} x 2 sequences does not fit", fits + 1)) &&
                                       Catch::Contains(fmt::format("k32v32 {}", fits)));
}
