// CI without a GPU: what the CUDA runtime takes from a plan is what the plan says. For the preset plans (tiny
// fixture, 9B and 27B synth layouts; H200 and CMP 100-210 rigs; 64 and 512 tokens per step): the variants
// graph.ir names (plan_kernels, what `qrig compile` precompiles) are exactly those the executor's binding loads
// (its kernel binding run with a recording loader), and the executor's allocations (layout.h, from which it
// allocates) equal the plan's memory table, part by part; a plan whose table disagrees is refused by name; the 9B
// synth at Q4_K_M too, whose stacked block-type matmuls are wq_stack uploads. The executor's op tables cover every
// op kind.
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "kernels/matmul.h"
#include "runtime/bound_graph.h"
#include "runtime/cuda/executor_impl.h"
#include "runtime/cuda/layout.h"
#include "runtime/cuda/plan_kernels.h"
#include "tests/cuda/cuda_test_util.h"

using namespace qrig;

namespace {

struct Case {
  std::string model, rig;
  int64_t batch;
  std::string type = "q8_0";  // the synth's weight formats (9b / 27b)
};
const std::vector<Case> kCases = {{"tiny", "h200", 64},  {"tiny", "h200", 512},  {"9b", "h200", 64},
                                  {"9b", "h200", 512},   {"27b", "h200", 64},    {"27b", "h200", 512},
                                  {"tiny", "cmp-100-210-x4", 512}, {"9b", "cmp-100-210-x4", 64},
                                  {"27b", "cmp-100-210-x4", 64},   {"9b", "h200", 64, "q4_k_m"},
                                  {"9b", "cmp-100-210-x4", 64, "q4_k_m"}};

ir::Plan plan_of(const Case& c, int64_t max_gpus) {
  compiler::CompileOptions o;
  o.max_batch_tokens = c.batch;
  o.max_gpus = max_gpus;
  return presets::compile_preset(c.model, c.rig, o, c.type);
}

std::string model_path(const std::string& model, const std::string& type = "q8_0") {
  static presets::ScratchDir dir("plan-runtime");
  return model == "tiny" ? presets::kFixtures + "tiny.gguf" : presets::write_sparse_synth(model, dir.path, type).string();
}

}  // namespace

TEST_CASE("the variants a plan names are exactly the precompiled ones and the ones the executor loads", "[cuda][fixtures]") {
  for (const Case& c : kCases) {
    INFO(c.model << "@" << c.rig << " batch " << c.batch << " " << c.type);
    const ir::Plan p = plan_of(c, 0);
    std::set<std::string> named;
    for (const auto& v : cuda::plan_kernels(p)) named.insert(v.name);
    const std::vector<std::string> loaded = runtime::kernels_loaded_by(p);
    CHECK(named == std::set<std::string>(loaded.begin(), loaded.end()));
    CHECK(named.size() > 20);
  }
  // A plan naming a variant of the wrong template for an op is refused at binding.
  ir::Plan p = plan_of(kCases[0], 0);
  for (auto& op : p.graph.ops)
    if (op.kind == ir::OpKind::add) {
      op.set("kernel", std::string("1-64:swiglu_f32_t256"));
      break;
    }
  CHECK_THROWS_WITH(runtime::kernels_loaded_by(p), Catch::Contains("swiglu_f32_t256") && Catch::Contains("add_f32"));
  // ... and so is one whose matmul reads other activation planes than its input's quantizer writes.
  p = plan_of(kCases[0], 0);
  for (auto& op : p.graph.ops)
    if (op.kind == ir::OpKind::quantize) {
      op.set("kernel", std::string("1-64:quant_act_q8_p1_t256"));
      break;
    }
  CHECK_THROWS_WITH(runtime::kernels_loaded_by(p), Catch::Contains("activation plane"));
  // The same for the quantized norm of a fused add (its second result) and for a fused swiglu; and a fused op
  // naming the unfused template is refused.
  for (const auto kind : {ir::OpKind::add_rmsnorm_quant, ir::OpKind::swiglu_quant}) {
    p = plan_of(kCases[0], 0);
    bool found = false;
    for (auto& op : p.graph.ops)
      if (op.kind == kind && !found) {
        found = true;
        const std::string one = kind == ir::OpKind::swiglu_quant ? "swiglu_q8_p1_t256" : "add_rmsnorm_q8_d256_p1_t64";
        op.set("kernel", "1-64:" + one);
      }
    REQUIRE(found);
    CHECK_THROWS_WITH(runtime::kernels_loaded_by(p), Catch::Contains("plane"));  // a stacked GEMV's "other planes"
    p = plan_of(kCases[0], 0);
    for (auto& op : p.graph.ops)
      if (op.kind == kind) op.set("kernel", std::string(kind == ir::OpKind::swiglu_quant ? "1-64:swiglu_f32_t256"
                                                                                         : "1-64:add_f32_t256"));
    CHECK_THROWS_WITH(runtime::kernels_loaded_by(p), Catch::Contains(kind == ir::OpKind::swiglu_quant ? "swiglu_q8"
                                                                                                       : "add_rmsnorm_q8"));
  }
}

TEST_CASE("the executor's allocations equal the plan's memory table, part by part", "[cuda][fixtures]") {
  for (const Case& c : kCases) {
    if (c.model == "27b" && c.rig != "h200") continue;  // 27B needs more than one 16 GiB card
    INFO(c.model << "@" << c.rig << " batch " << c.batch << " " << c.type);
    const ir::Plan p = plan_of(c, 1);  // the runtime runs single-GPU plans
    REQUIRE(p.memory.devices.size() == 1);
    const gguf::File f = gguf::File::open(model_path(c.model, c.type));
    const runtime::BoundGraph g(p);
    const cuda::DeviceLayout L = cuda::device_layout(p, g, f);
    CHECK_NOTHROW(cuda::check_layout(L, p));
    const ir::DeviceMemory& m = p.memory.devices[0];
    CHECK(L.total() + m.snapshots == m.total);
    CHECK(L.total() <= m.budget);
    CHECK(L.weight_bytes == m.weights);
    CHECK(L.arena_bytes == p.memory.activation_bytes);
    // Every result and scratch of the graph lies inside the arena.
    for (const auto& op : p.graph.ops) {
      if (op.has("at"))
        for (int64_t at : op.ints("at")) CHECK((at >= 0 && at < L.arena_bytes && at % 256 == 0));
      if (op.has("scratch")) CHECK(op.ints("scratch")[0] + op.ints("scratch")[1] <= L.arena_bytes);
    }
  }
  // A memory table that disagrees with what the runtime needs is refused, naming the part.
  const Case c = kCases[0];
  ir::Plan p = plan_of(c, 1);
  const gguf::File f = gguf::File::open(model_path(c.model));
  const runtime::BoundGraph g(p);
  const cuda::DeviceLayout L = cuda::device_layout(p, g, f);
  for (auto [part, field] : std::vector<std::pair<const char*, int64_t ir::DeviceMemory::*>>{
           {"weights", &ir::DeviceMemory::weights},
           {"activation arena", &ir::DeviceMemory::arena},
           {"step inputs and outputs", &ir::DeviceMemory::io},
           {"sampling buffers", &ir::DeviceMemory::sampling},
           {"slot states", &ir::DeviceMemory::states}}) {
    ir::Plan q = p;
    q.memory.devices[0].*field += 256;
    CHECK_THROWS_WITH(cuda::check_layout(L, q), Catch::Contains(part));
  }
  ir::Plan q = p;
  q.memory.snapshots_per_slot += 1;
  CHECK_THROWS_WITH(cuda::check_layout(L, q), Catch::Contains("snapshot"));
}

// A block-type plan's stacks (matmul_stack over Q4_K, ...) are uploaded as one matrix each: a wq_stack entry of the
// members' type, rows and bytes, members in the op's order, each member's view 16-byte aligned in the scale bytes;
// a plan whose stack mixes types, or whose member would start unaligned, is refused by name.
TEST_CASE("a block-type plan's stacks are uploads of one matrix each; mixed or unaligned stacks are refused",
          "[cuda][fixtures][wq]") {
  const Case c{"9b", "h200", 64, "q4_k_m"};
  const ir::Plan p = plan_of(c, 1);
  const gguf::File f = gguf::File::open(model_path(c.model, c.type));
  const runtime::BoundGraph g(p);
  const cuda::DeviceLayout L = cuda::device_layout(p, g, f);
  std::map<std::string, const cuda::WeightUpload*> by_head;
  for (const auto& w : L.weights)
    if (!w.tensors.empty()) by_head[w.tensors[0]] = &w;  // (RoPE tables have none)
  int64_t stacks = 0;
  for (const auto& op : p.graph.ops) {
    if (op.kind != ir::OpKind::matmul_stack) continue;
    INFO(op.describe());
    const auto& ws = op.strs("weights");
    REQUIRE(by_head.count(ws[0]) == 1);
    const cuda::WeightUpload& w = *by_head.at(ws[0]);
    CHECK(w.kind == cuda::WeightUpload::wq_stack);
    CHECK(w.tensors == ws);
    int64_t rows = 0, bytes = 0;
    for (const auto& name : ws) {
      const gguf::TensorInfo& t = f.tensor(name);
      CHECK((int64_t)t.type == w.wtype);
      CHECK(kernels::wq_stack_view_aligned(w.wtype, w.cols, rows));
      rows += (int64_t)t.ne[1];
      bytes += (int64_t)t.n_bytes;
    }
    CHECK(w.rows == rows);
    CHECK(w.bytes == bytes);  // the file's blocks, split in two
    ++stacks;
  }
  CHECK(stacks > 0);
  // A stack of two types (a hand-edited plan) and one whose second member would start unaligned.
  ir::Plan bad = p;
  for (auto& op : bad.graph.ops)
    if (op.kind == ir::OpKind::matmul_stack && op.strs("weights").size() == 2) {
      std::vector<std::string> ws = op.strs("weights");
      ws[1] = "output.weight";  // Q6_K
      op.set("weights", ws);
      break;
    }
  CHECK_THROWS_WITH(cuda::device_layout(bad, runtime::BoundGraph(bad), f), Catch::Contains("different types"));
  // Q6_K rows of 256 values hold 18 scale bytes: a member after 8 rows starts aligned, after 3 rows not (rows of
  // 4096 values hold 288: any count).
  CHECK_NOTHROW(kernels::check_wq_stack(14, 4096, {3, 1024}));
  CHECK_NOTHROW(kernels::check_wq_stack(14, 256, {8, 8, 5}));
  CHECK_THROWS_WITH(kernels::check_wq_stack(14, 256, {8, 3, 5}), Catch::Contains("member 2"));
  CHECK_THROWS_WITH(kernels::check_wq_stack(14, 256, {3, 1024}),
                    Catch::Contains("q6_k") && Catch::Contains("member 1") && Catch::Contains("16-byte aligned"));
  CHECK_THROWS_AS(kernels::check_wq_stack(12, 4096, {4096}), kernels::KernelError);  // one member is no stack
  CHECK_THROWS_AS(kernels::check_wq_stack(8, 4096, {8, 8}), kernels::KernelError);   // Q8_0 has its own layout
}

TEST_CASE("each stage's allocations equal its part of a pipeline plan's memory table", "[cuda][fixtures]") {
  for (const std::string model : {"tiny", "9b", "27b"})
    for (int64_t batch : {64, 2048}) {
      INFO(model << " on cmp-100-210-x4, batch " << batch);
      compiler::CompileOptions o;
      o.max_batch_tokens = batch;
      o.context_length = 4096;
      const ir::Plan p = presets::compile_preset(model, "cmp-100-210-x4", o);
      REQUIRE(p.placement.size() == 4);
      CHECK(p.rows_per_call() == std::min<int64_t>(batch, 512));
      const gguf::File f = gguf::File::open(model_path(model));
      const runtime::BoundGraph g(p);
      CHECK_THROWS_WITH(cuda::device_layout(p, g, f), Catch::Contains("one executor per stage"));
      int64_t weights = 0;
      for (size_t s = 0; s < p.placement.size(); ++s) {
        const std::string& dev = p.placement[s].device;
        INFO(dev);
        const cuda::DeviceLayout L = cuda::device_layout(p, g, f, dev);
        CHECK_NOTHROW(cuda::check_layout(L, p, dev));
        const ir::DeviceMemory& m = p.memory.devices[s];
        REQUIRE(m.device == dev);
        CHECK(L.total() + m.snapshots == m.total);
        CHECK(L.max_t == p.rows_per_call());
        CHECK(L.has_output == (s + 1 == p.placement.size()));
        CHECK((L.bridge_in_width > 0) == (s > 0));
        CHECK((L.bridge_out_width > 0) == (s + 1 < p.placement.size()));
        CHECK((L.sampling_bytes > 0) == L.has_output);
        weights += L.weight_bytes;
        // The stage's states only: another stage's caches and recurrent states take nothing here.
        for (size_t k = 0; k < g.states.size(); ++k) {
          bool used = false;
          for (const auto& b : g.ops)
            if (b.op->s("device") == dev)
              for (int st : {b.state, b.k_state, b.v_state}) used |= st == (int)k;
          CHECK((L.state_offset[k] >= 0 || L.cache_halves[k] > 0) == used);
        }
      }
      CHECK(weights == p.memory.weight_bytes);
    }
}

TEST_CASE("the CUDA executor's op tables have a row for every op kind", "[cuda]") {
  CHECK(runtime::cuda_op_tables_complete());
}
