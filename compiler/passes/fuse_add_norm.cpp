// Pass (fusion): a residual add whose sum is normalised by an rmsnorm_quant (in a pre-norm layer, the next norm of
// the residual stream: x = x + y, then the next block's quantized norm of x) becomes one add_rmsnorm_quant op: one
// kernel reads both rows once, writes the sum (still a value: the next residual add reads it, and a tap or a
// bridge may) and the normalised sum's int8 planes, bit-identical to add then rmsnorm_quant. The fused op takes the
// add's place in the order (the norm's other inputs are weights; its result's readers come after the norm) and the
// add's attributes (layer, device, tap: the tap still names the sum, the op's first result), with the norm's
// weight, eps and precise_rows. Runs after fuse_norm_quant (it fuses what that pass made), on every plan that
// quantizes (not the reference family, which has no quantize ops).
#include <map>
#include <set>

#include <fmt/format.h>

#include "compiler/passes/passes.h"

namespace qrig::compiler::passes {

namespace {

// Fuses one graph's pairs; returns how many.
int fuse_graph(ir::Graph& g) {
  auto& ops = g.ops;
  std::map<std::string, size_t> norm_of;  // value -> the first rmsnorm_quant normalising it
  for (size_t j = 0; j < ops.size(); ++j)
    if (ops[j].kind == ir::OpKind::rmsnorm_quant) norm_of.emplace(ops[j].args.at(0), j);
  std::set<size_t> fused_norms;
  std::vector<ir::Op> out;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (fused_norms.count(i)) continue;
    ir::Op& op = ops[i];
    if (op.kind == ir::OpKind::add) {
      auto it = norm_of.find(op.result());
      if (it != norm_of.end()) {
        const ir::Op& n = ops[it->second];
        // One stage runs both (a value crossing stages reaches the norm through a bridge, so this holds by
        // construction), over the same rows.
        const bool same_device = op.has("device") == n.has("device") && (!op.has("device") || op.s("device") == n.s("device"));
        const bool same_rows = op.type().shape == n.type().shape;
        if (same_device && same_rows && it->second > i) {
          ir::Op f;
          f.kind = ir::OpKind::add_rmsnorm_quant;
          f.args = op.args;
          f.results = {op.result(), n.result()};
          f.types = {op.type(), n.type()};
          f.attrs = op.attrs;
          f.set("weight", n.s("weight"));
          f.set("eps", n.f("eps"));
          f.set("precise_rows", n.i("precise_rows"));
          fused_norms.insert(it->second);
          out.push_back(std::move(f));
          continue;
        }
      }
    }
    out.push_back(std::move(op));
  }
  ops = std::move(out);
  return (int)fused_norms.size();
}

}  // namespace

void fuse_add_norm(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  if (p.kernel_family == "reference") return;
  const auto graphs = plan_graphs(p);
  const int fused = fuse_graph(*graphs[0]);
  const int draft = graphs.size() > 1 ? fuse_graph(*graphs[1]) : 0;
  p.notes.push_back(fmt::format("fusion: {} add + rmsnorm_quant pairs -> add_rmsnorm_quant (the sum stays a result "
                                "for the next residual add){}",
                                fused, graphs.size() > 1 ? fmt::format(" (and {} in the draft head)", draft) : ""));
}

}  // namespace qrig::compiler::passes
