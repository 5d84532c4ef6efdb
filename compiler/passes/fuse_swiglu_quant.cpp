// Pass (fusion): a swiglu whose only reader is a quantize (the FFN's activation, read by the down projection alone)
// becomes one swiglu_quant op: one kernel reads the gate and up rows and writes the activation's int8 planes
// directly, bit-identical to swiglu then quantize (the f32 activation is never written). The fused op takes the
// swiglu's place and attributes, with the quantize's result and precise_rows. Runs on every plan that quantizes
// (not the reference family, which has no quantize ops).
#include <map>
#include <set>

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
  std::map<std::string, size_t> quantize_of;  // f32 value -> the quantize reading it
  for (size_t j = 0; j < ops.size(); ++j)
    if (ops[j].kind == ir::OpKind::quantize) quantize_of.emplace(ops[j].args.at(0), j);
  std::set<size_t> fused_quantizes;
  std::vector<ir::Op> out;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (fused_quantizes.count(i)) continue;
    ir::Op& op = ops[i];
    if (op.kind == ir::OpKind::swiglu && readers[op.result()] == 1 && !op.has("tap")) {
      auto it = quantize_of.find(op.result());
      if (it != quantize_of.end()) {
        const ir::Op& q = ops[it->second];
        const bool same_device = op.has("device") == q.has("device") && (!op.has("device") || op.s("device") == q.s("device"));
        if (same_device && it->second > i) {
          ir::Op f;
          f.kind = ir::OpKind::swiglu_quant;
          f.args = op.args;
          f.results = q.results;
          f.types = q.types;
          f.attrs = op.attrs;
          f.set("precise_rows", q.i("precise_rows"));
          fused_quantizes.insert(it->second);
          out.push_back(std::move(f));
          continue;
        }
      }
    }
    out.push_back(std::move(op));
  }
  ops = std::move(out);
  return (int)fused_quantizes.size();
}

}  // namespace

void fuse_swiglu_quant(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  if (p.kernel_family == "reference") return;
  const auto graphs = plan_graphs(p);
  const int fused = fuse_graph(*graphs[0]);
  const int draft = graphs.size() > 1 ? fuse_graph(*graphs[1]) : 0;
  p.notes.push_back(fmt::format("fusion: {} swiglu + quantize pairs -> swiglu_quant{}", fused,
                                graphs.size() > 1 ? fmt::format(" (and {} in the draft head)", draft) : ""));
}

}  // namespace qrig::compiler::passes
