// The fusions into the activation quantization (fuse_add_norm, fuse_swiglu_quant; issue 25): on the 9B synth
// layout's CUDA plan every residual add whose sum a quantized norm reads becomes add_rmsnorm_quant (the sum still a
// result, read by the next residual add and tapped as before) and every FFN swiglu becomes swiglu_quant, with the
// planes per range of rows the unfused ops had; the plan says so in its notes and kernel table (`qrig inspect`). A
// pipeline keeps the adds whose sum crosses to the next stage; the CPU reference family has nothing to fuse, the
// dp4a emulation fuses as the GPU plan does. On hand-made graphs, the passes alone: a sum that is also a graph
// output or read by other ops is fused and stays available; a swiglu with another reader, a tap or as an output is
// not.
#include <catch2/catch.hpp>

#include <map>

#include <fmt/format.h>

#include "compiler/passes/passes.h"
#include "ir/ir.h"
#include "ir/kernel_attr.h"
#include "kernels/pointwise.h"
#include "tests/plan_presets.h"

using namespace qrig;

namespace {

std::map<ir::OpKind, int> kinds(const ir::Graph& g) {
  std::map<ir::OpKind, int> n;
  for (const auto& op : g.ops) ++n[op.kind];
  return n;
}

bool has_note(const ir::Plan& p, const std::string& s) {
  for (const auto& n : p.notes)
    if (n.find(s) != std::string::npos) return true;
  return false;
}

// The ops reading value v.
std::vector<const ir::Op*> readers(const ir::Graph& g, const std::string& v) {
  std::vector<const ir::Op*> out;
  for (const auto& op : g.ops)
    for (const auto& a : op.args)
      if (a == v) {
        out.push_back(&op);
        break;
      }
  return out;
}

// Planes per range of a fused op's kernel attribute: {first, last, planes}.
std::vector<std::tuple<int64_t, int64_t, int64_t>> planes_of(const ir::Op& op, const char* kernel) {
  std::vector<std::tuple<int64_t, int64_t, int64_t>> out;
  for (const auto& r : ir::parse_launch_ranges(op.s("kernel"))) {
    REQUIRE(r.parts.size() == 1);
    REQUIRE(r.parts[0].size() == 1);
    const kernels::Variant v = kernels::parse_variant(r.parts[0][0]);
    CHECK(v.kernel == kernel);
    out.emplace_back(r.first, r.last, v.param("p"));
  }
  return out;
}

}  // namespace

TEST_CASE("the 9B CUDA plan fuses every residual add into the next quantized norm and swiglu into its quantize",
          "[compiler][fixtures]") {
  presets::ScratchDir dir("fusions");
  const gguf::File f = gguf::File::open(presets::write_sparse_synth("9b", dir.path));
  const auto hp = compiler::Qwen35Params::from_gguf(f);
  REQUIRE(hp.n_layer == 32);
  REQUIRE(hp.d == 4096);
  const ir::Plan p = presets::compile_preset("9b", "h200");  // the defaults: 512 tokens, 4 sequences
  REQUIRE(p.backend == "cuda");
  REQUIRE(p.precise_rows == compiler::kDefaultPreciseRows);
  const ir::Graph& g = p.graph;
  auto n = kinds(g);
  // 2 residual adds per layer; all but the last (its sum feeds the output norm, an rmsnorm for gather_rows) fused.
  CHECK(n[ir::OpKind::add_rmsnorm_quant] == 2 * hp.n_layer - 1);
  CHECK(n[ir::OpKind::add] == 1);
  CHECK(n[ir::OpKind::rmsnorm_quant] == 1);  // layer 0's norm of the embedding
  CHECK(n[ir::OpKind::swiglu_quant] == hp.n_layer);
  CHECK(n[ir::OpKind::swiglu] == 0);
  CHECK(n[ir::OpKind::quantize] == hp.n_layer + 1);  // each mixer's output (attention, GDN norm) and the lm_head's
  CHECK(has_note(p, fmt::format("fusion: {} add + rmsnorm_quant pairs -> add_rmsnorm_quant", 2 * hp.n_layer - 1)));
  CHECK(has_note(p, fmt::format("fusion: {} swiglu + quantize pairs -> swiglu_quant", hp.n_layer)));
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> want = {{1, p.precise_rows, 2},
                                                                   {p.precise_rows + 1, p.max_batch_tokens, 1}};
  int taps = 0;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const ir::Op& op = g.ops[i];
    INFO(op.describe());
    if (op.kind == ir::OpKind::add_rmsnorm_quant) {
      REQUIRE(op.results.size() == 2);
      CHECK(op.types[0] == ir::Type{ir::DType::f32, {ir::kTokens, hp.d}});
      CHECK(op.types[1] == ir::Type{ir::DType::q8, {ir::kTokens, hp.d}});
      // The sum stays a value: the next residual add (fused or not) reads it, after this op.
      const auto sum_readers = readers(g, op.results[0]);
      REQUIRE(!sum_readers.empty());
      for (const ir::Op* r : sum_readers)
        CHECK((r->kind == ir::OpKind::add_rmsnorm_quant || r->kind == ir::OpKind::add));
      // The normed sum is read by matmuls only.
      for (const ir::Op* r : readers(g, op.results[1]))
        CHECK((r->kind == ir::OpKind::matmul || r->kind == ir::OpKind::matmul_stack));
      const std::string& w = op.s("weight");
      CHECK((w.find("attn_norm") != std::string::npos || w.find("post_attention_norm") != std::string::npos));
      CHECK(op.f("eps") == Approx(hp.eps));
      CHECK(op.i("precise_rows") == p.precise_rows);
      CHECK(planes_of(op, "add_rmsnorm_q8") == want);
      CHECK(kernels::parse_variant(ir::parse_launch_ranges(op.s("kernel"))[0].parts[0][0]).param("d") == hp.d);
      CHECK(op.ints("at").size() == 2);
      CHECK_FALSE(op.has("scratch"));  // no normalised f32 rows
      // x{L+1} keeps its tap (the layer comparisons read the residual stream there); l{L}.h has none.
      if (op.has("tap")) {
        CHECK(op.s("tap") == fmt::format("hidden.{}", op.i("layer") + 1));
        CHECK(op.results[0] == fmt::format("x{}", op.i("layer") + 1));
        ++taps;
      }
    }
    if (op.kind == ir::OpKind::swiglu_quant) {
      CHECK(op.type() == ir::Type{ir::DType::q8, {ir::kTokens, hp.ffn}});
      const auto rs = readers(g, op.result());
      REQUIRE(rs.size() == 1);
      CHECK(rs[0]->kind == ir::OpKind::matmul);
      CHECK(rs[0]->s("weight") == fmt::format("blk.{}.ffn_down.weight", op.i("layer")));
      CHECK(planes_of(op, "swiglu_q8") == want);
    }
  }
  CHECK(taps == hp.n_layer - 1);  // hidden.1 .. hidden.31 (hidden.32 is the output norm's)
  // What `qrig inspect` lists: the kernel table's rows of the fused ops.
  int rows_add = 0, rows_swiglu = 0;
  for (const auto& k : p.kernels) {
    rows_add += k.op == "add_rmsnorm_quant" ? (int)k.ops : 0;
    rows_swiglu += k.op == "swiglu_quant" ? (int)k.ops : 0;
  }
  CHECK(rows_add == 2 * (2 * hp.n_layer - 1));  // two ranges (two planes, one) per op
  CHECK(rows_swiglu == 2 * hp.n_layer);
  // The graph text round-trips with the two-result op.
  const std::string text = ir::print(g);
  CHECK(ir::print(ir::parse(text)) == text);
}

TEST_CASE("fusions: a pipeline keeps the adds whose sum crosses a stage; the CPU reference fuses nothing, the dp4a "
          "emulation as the GPU does", "[compiler][fixtures]") {
  compiler::CompileOptions o;
  o.max_batch_tokens = 64;
  const ir::Plan pipe = presets::compile_preset("9b", "cmp-100-210-x4", o);
  const int64_t stages = (int64_t)pipe.placement.size();
  REQUIRE(stages == 4);
  auto n = kinds(pipe.graph);
  CHECK(n[ir::OpKind::add_rmsnorm_quant] == 2 * 32 - 1 - (stages - 1));
  CHECK(n[ir::OpKind::add] == 1 + (stages - 1));
  CHECK(n[ir::OpKind::swiglu_quant] == 32);
  for (const auto& op : pipe.graph.ops)
    if (op.kind == ir::OpKind::add && op.result() != "x32") {  // a stage's last sum: the bridge takes it on
      const auto rs = readers(pipe.graph, op.result());
      REQUIRE(rs.size() == 1);
      CHECK(rs[0]->kind == ir::OpKind::bridge);
    }
  CHECK_NOTHROW(ir::verify(pipe.graph));

  // The tiny model on the CPU: the reference family has no quantize ops, the emulation of dp4a fuses.
  compiler::CompileOptions cpu;
  cpu.force_backend = "cpu";
  const ir::Plan ref = presets::compile_preset("tiny", "h200", cpu);
  REQUIRE(ref.kernel_family == "reference");
  n = kinds(ref.graph);
  CHECK(n[ir::OpKind::add_rmsnorm_quant] == 0);
  CHECK(n[ir::OpKind::swiglu_quant] == 0);
  CHECK(n[ir::OpKind::add] == 16);
  CHECK(n[ir::OpKind::swiglu] == 8);
  CHECK_FALSE(has_note(ref, "fusion:"));
  cpu.family = "dp4a-emulated";
  const ir::Plan emu = presets::compile_preset("tiny", "h200", cpu);
  const ir::Plan gpu = presets::compile_preset("tiny", "h200");
  n = kinds(emu.graph);
  CHECK(n[ir::OpKind::add_rmsnorm_quant] == 15);
  CHECK(n[ir::OpKind::swiglu_quant] == 8);
  CHECK(n == kinds(gpu.graph));
}

namespace {

ir::Op op_of(ir::OpKind k, std::vector<std::string> args, std::vector<std::string> results,
             std::vector<ir::Type> types, std::vector<std::pair<std::string, ir::AttrValue>> attrs) {
  ir::Op o;
  o.kind = k;
  o.args = std::move(args);
  o.results = std::move(results);
  o.types = std::move(types);
  attrs.emplace_back("layer", int64_t{0});
  attrs.emplace_back("device", std::string("cuda:0"));
  o.attrs = std::move(attrs);
  return o;
}

const ir::Type kF{ir::DType::f32, {ir::kTokens, 256}}, kQ{ir::DType::q8, {ir::kTokens, 256}};

// x1 = x0 + y0 is normalised for a matmul, read by another add and a graph output; s_k = swiglu(x0, y0) for four
// readers' cases: only a quantize (fused), a quantize and an add, a tap, a graph output.
ir::Graph hand_made() {
  ir::Graph g;
  g.name = "hand";
  g.inputs = {{"tokens", {ir::DType::i32, {ir::kTokens}}}, {"pos", {ir::DType::i32, {ir::kTokens}}},
              {"rows", {ir::DType::i32, {ir::kRows}}}};
  auto q = [](const std::string& v) {
    return op_of(ir::OpKind::quantize, {v}, {v + ".q"}, {kQ}, {{"precise_rows", int64_t{4}}});
  };
  auto mm = [](const std::string& in, const std::string& out) {
    return op_of(ir::OpKind::matmul, {in}, {out}, {kF}, {{"weight", std::string("w." + out)}});
  };
  const std::pair<std::string, ir::AttrValue> w{"weight", std::string("norm.weight")};
  g.ops = {op_of(ir::OpKind::embed, {"tokens"}, {"x0"}, {kF}, {{"weight", std::string("token_embd.weight")}}),
           op_of(ir::OpKind::embed, {"tokens"}, {"y0"}, {kF}, {{"weight", std::string("token_embd.weight")}}),
           op_of(ir::OpKind::add, {"x0", "y0"}, {"x1"}, {kF}, {{"tap", std::string("hidden.1")}}),
           op_of(ir::OpKind::rmsnorm_quant, {"x1"}, {"n1.q"}, {kQ}, {w, {"eps", 1e-6}, {"precise_rows", int64_t{4}}}),
           mm("n1.q", "m1"),
           op_of(ir::OpKind::add, {"x1", "m1"}, {"x2"}, {kF}, {}),
           op_of(ir::OpKind::swiglu, {"x0", "y0"}, {"s0"}, {kF}, {}),
           q("s0"),
           mm("s0.q", "d0"),
           op_of(ir::OpKind::swiglu, {"x0", "y0"}, {"s1"}, {kF}, {}),
           q("s1"),
           mm("s1.q", "d1"),
           op_of(ir::OpKind::add, {"s1", "d1"}, {"e1"}, {kF}, {}),
           op_of(ir::OpKind::swiglu, {"x0", "y0"}, {"s2"}, {kF}, {{"tap", std::string("act")}}),
           q("s2"),
           mm("s2.q", "d2"),
           op_of(ir::OpKind::swiglu, {"x0", "y0"}, {"s3"}, {kF}, {}),
           q("s3"),
           mm("s3.q", "d3")};
  g.outputs = {"x1", "x2", "e1", "s3"};
  ir::verify(g);
  return g;
}

}  // namespace

TEST_CASE("fusion passes on a hand-made graph: the sum stays available; swiglu fuses only into its sole quantize",
          "[compiler][fixtures]") {
  const gguf::File f = gguf::File::open(presets::kFixtures + "tiny.gguf");
  compiler::CompileContext cx{f, compiler::Qwen35Params::from_gguf(f), compiler::Rig{}, {}, {}, {}};
  cx.plan.kernel_family = "dp4a";
  cx.plan.graph = hand_made();
  compiler::passes::fuse_add_norm(cx);
  compiler::passes::fuse_swiglu_quant(cx);
  const ir::Graph& g = cx.plan.graph;
  REQUIRE_NOTHROW(ir::verify(g));
  CHECK(has_note(cx.plan, "fusion: 1 add + rmsnorm_quant pairs"));
  CHECK(has_note(cx.plan, "fusion: 1 swiglu + quantize pairs"));
  auto n = kinds(g);
  CHECK(n[ir::OpKind::add_rmsnorm_quant] == 1);
  CHECK(n[ir::OpKind::rmsnorm_quant] == 0);
  CHECK(n[ir::OpKind::add] == 2);  // x2 (its sum is normalised by nothing) and e1
  CHECK(n[ir::OpKind::swiglu_quant] == 1);
  CHECK(n[ir::OpKind::swiglu] == 3);
  CHECK(n[ir::OpKind::quantize] == 3);
  // The fused op sits where the add was, makes the sum (still an output, still read by x2, still tapped) and the
  // quantized norm the matmul reads.
  const ir::Op& fused = g.ops.at(2);
  REQUIRE(fused.kind == ir::OpKind::add_rmsnorm_quant);
  CHECK(fused.args == std::vector<std::string>{"x0", "y0"});
  CHECK(fused.results == std::vector<std::string>{"x1", "n1.q"});
  CHECK(fused.s("tap") == "hidden.1");
  CHECK(fused.s("weight") == "norm.weight");
  CHECK(fused.i("precise_rows") == 4);
  CHECK(fused.s("device") == "cuda:0");
  CHECK(g.ops.at(3).kind == ir::OpKind::matmul);
  CHECK(g.producer("x1") == &fused);
  CHECK(g.producer("s0.q")->kind == ir::OpKind::swiglu_quant);
  CHECK(g.producer("s1")->kind == ir::OpKind::swiglu);  // also read by an add
  CHECK(g.producer("s2")->kind == ir::OpKind::swiglu);  // tapped
  CHECK(g.producer("s3")->kind == ir::OpKind::swiglu);  // a graph output

  // The reference family quantizes nothing, so the passes change nothing there.
  compiler::CompileContext rx{f, compiler::Qwen35Params::from_gguf(f), compiler::Rig{}, {}, {}, {}};
  rx.plan.kernel_family = "reference";
  rx.plan.graph = hand_made();
  compiler::passes::fuse_add_norm(rx);
  compiler::passes::fuse_swiglu_quant(rx);
  CHECK(ir::print(rx.plan.graph) == ir::print(hand_made()));
}
