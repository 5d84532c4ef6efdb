// The CPU executor's rows for the fusions into the quantization (add_rmsnorm_quant, swiglu_quant; issue 25): a
// dp4a-emulated plan of the tiny model runs them, and gives bit for bit the logits and the tapped residual stream
// (hidden.L: the sum, the fused op's first result) of the same plan with every fused op split back into the two ops
// it replaced, for a prefill (one activation plane) and the decode steps after it (two planes).
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "compiler/compile.h"
#include "runtime/cpu/executor.h"
#include "tests/fixtures.h"
#include "tests/runtime/cpu_test_util.h"

using namespace qrig;

namespace {

// The op's attributes without those of the fused-in op.
std::vector<std::pair<std::string, ir::AttrValue>> attrs_but(const ir::Op& op, std::initializer_list<const char*> drop) {
  std::vector<std::pair<std::string, ir::AttrValue>> out;
  for (const auto& [k, v] : op.attrs) {
    bool keep = true;
    for (const char* d : drop) keep &= k != d;
    if (keep) out.emplace_back(k, v);
  }
  return out;
}

// Every add_rmsnorm_quant as an add then an rmsnorm_quant of its sum, every swiglu_quant as a swiglu then a quantize.
ir::Graph unfused(const ir::Graph& g, int& split) {
  ir::Graph u = g;
  u.ops.clear();
  for (const ir::Op& op : g.ops) {
    if (op.kind == ir::OpKind::add_rmsnorm_quant) {
      ir::Op a, n;
      a.kind = ir::OpKind::add;
      a.args = op.args;
      a.results = {op.results.at(0)};
      a.types = {op.types.at(0)};
      a.attrs = attrs_but(op, {"weight", "eps", "precise_rows"});
      n.kind = ir::OpKind::rmsnorm_quant;
      n.args = {op.results[0]};
      n.results = {op.results.at(1)};
      n.types = {op.types.at(1)};
      n.attrs = attrs_but(op, {"tap"});
      u.ops.push_back(std::move(a));
      u.ops.push_back(std::move(n));
      ++split;
    } else if (op.kind == ir::OpKind::swiglu_quant) {
      ir::Op s, q;
      s.kind = ir::OpKind::swiglu;
      s.args = op.args;
      s.results = {op.result() + ".f32"};
      s.types = {{ir::DType::f32, op.type().shape}};
      s.attrs = attrs_but(op, {"precise_rows"});
      q.kind = ir::OpKind::quantize;
      q.args = s.results;
      q.results = op.results;
      q.types = op.types;
      q.attrs = op.attrs;
      u.ops.push_back(std::move(s));
      u.ops.push_back(std::move(q));
      ++split;
    } else {
      u.ops.push_back(op);
    }
  }
  ir::verify(u);
  return u;
}

}  // namespace

TEST_CASE("the CPU executor's fused quantizing ops compute exactly the ops they replace", "[runtime][fixtures]") {
  const gguf::File f = gguf::File::open(fixtures::shared_path("fixtures/tiny.gguf"));
  compiler::CompileOptions co;
  co.context_length = 256;
  co.max_sequences = 1;
  co.family = "dp4a-emulated";
  const ir::Plan fused = compiler::compile(f, compiler::Rig::parse("[[device]]\nkind=\"cpu\"\nmemory_gib=2.0\n", "t"), co);
  int splits = 0;
  ir::Plan plain = fused;
  plain.graph = unfused(fused.graph, splits);
  REQUIRE(splits == 15 + 8);  // 2 x 8 residual adds but the last; 8 swiglus
  REQUIRE(fused.precise_rows >= 1);
  runtime::CpuExecutor a(fused, runtime::open_plan_model(fused)), b(plain, runtime::open_plan_model(plain));
  runtime::CpuSequence sa = a.new_sequence(), sb = b.new_sequence();
  std::map<std::string, std::vector<float>> taps_a, taps_b;
  auto tap_into = [](std::map<std::string, std::vector<float>>& m) {
    return [&m](const std::string& name, const float* x, int64_t n, int64_t w) { m[name].assign(x, x + n * w); };
  };
  std::vector<int32_t> tokens = {5, 17, 300, 42, 9, 1000, 77, 3, 250, 64, 8, 11};
  std::vector<int32_t> rows(tokens.size());
  for (size_t t = 0; t < rows.size(); ++t) rows[t] = (int32_t)t;
  for (int step = 0; step < 4; ++step) {  // a prefill of 12 tokens (one plane), then 3 decode steps (two planes)
    INFO("step " << step);
    taps_a.clear();
    taps_b.clear();
    const std::vector<float> la = a.forward(sa, tokens, rows, tap_into(taps_a));
    const std::vector<float> lb = b.forward(sb, tokens, rows, tap_into(taps_b));
    CHECK(cpu::test::bit_equal(la, lb));
    REQUIRE(taps_a.size() == 9);  // hidden.0 .. hidden.8
    for (const auto& [name, v] : taps_b) {
      INFO(name);
      REQUIRE(taps_a.count(name));
      CHECK(cpu::test::bit_equal(taps_a[name], v));
    }
    tokens = {(int32_t)(std::max_element(la.end() - a.vocab_rows(), la.end()) - (la.end() - a.vocab_rows()))};
    rows = {0};
  }
}
