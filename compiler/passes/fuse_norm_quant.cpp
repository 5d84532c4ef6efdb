// Pass (fusion): an rmsnorm whose only reader is a quantize (a norm feeding matmuls) becomes one rmsnorm_quant
// op: one kernel normalises the row and writes its int8 planes, bit-identical to quantize of the norm's output
// (the f32 row goes to the op's scratch).
#include <map>

#include <fmt/format.h>

#include "compiler/passes/passes.h"

namespace qrig::compiler::passes {

namespace {

// Fuses one graph's pairs; returns how many.
int fuse_graph(ir::Graph& g) {
  auto& ops = g.ops;
  std::map<std::string, int> readers;
  for (const auto& op : ops)
    for (const auto& a : op.args) ++readers[a];
  for (const auto& o : g.outputs) ++readers[o];
  std::vector<ir::Op> out;
  int fused = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    ir::Op& op = ops[i];
    if (op.kind == ir::OpKind::rmsnorm && readers[op.result()] == 1 && !op.has("tap")) {
      // The quantize op reading it (placed before the first matmul reader, possibly not next to the norm).
      for (size_t j = i + 1; j < ops.size(); ++j) {
        ir::Op& q = ops[j];
        if (q.kind != ir::OpKind::quantize || q.args[0] != op.result()) continue;
        ir::Op f;
        f.kind = ir::OpKind::rmsnorm_quant;
        f.args = op.args;
        f.results = q.results;
        f.types = q.types;
        f.attrs = op.attrs;
        f.set("precise_rows", q.i("precise_rows"));
        q.results.clear();  // dropped below
        q.args.clear();
        op.results.clear();
        out.push_back(std::move(f));
        ++fused;
        break;
      }
      if (op.results.empty()) continue;
    }
    if (op.kind == ir::OpKind::quantize && op.results.empty()) continue;  // fused into its norm
    out.push_back(std::move(op));
  }
  ops = std::move(out);
  return fused;
}

}  // namespace

void fuse_norm_quant(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  if (p.kernel_family == "reference") return;
  const auto graphs = plan_graphs(p);
  const int fused = fuse_graph(*graphs[0]);
  const int draft = graphs.size() > 1 ? fuse_graph(*graphs[1]) : 0;
  p.notes.push_back(fmt::format("fusion: {} rmsnorm + quantize pairs -> rmsnorm_quant{}", fused,
                                graphs.size() > 1 ? fmt::format(" (and {} in the draft head)", draft) : ""));
}

}  // namespace qrig::compiler::passes
