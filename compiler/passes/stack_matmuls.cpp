// Pass (fusion): 2..4 consecutive matmuls reading one input (q|k|v, gate|up, the GDN input projections) become
// one matmul_stack: their Q8_0 weights are uploaded stacked, so a single-row step runs one GEMV for all of them
// (each member's rows written to its own result); steps of more rows run each member's own kernel on its slice.
#include <map>

#include <fmt/format.h>

#include "compiler/passes/passes.h"

namespace qrig::compiler::passes {

namespace {

// Stacks one graph's groups; returns how many. A weight used by both graphs (the draft head shares the main
// model's lm_head) is stacked in neither: weight_uses counts the uses in every graph.
int stack_graph(ir::Graph& g, const std::map<std::string, int>& weight_uses_all) {
  auto& ops = g.ops;
  std::map<std::string, int> weight_uses = weight_uses_all;
  auto stackable = [&](const ir::Op& o) {
    return o.kind == ir::OpKind::matmul && o.type().shape.size() == 2 && o.type().shape[0] == ir::kTokens &&
           weight_uses[o.s("weight")] == 1 && o.s("format") == "q8_0";
  };
  std::vector<ir::Op> out;
  int stacks = 0;
  for (size_t i = 0; i < ops.size();) {
    size_t j = i + 1;
    if (stackable(ops[i]))
      while (j < ops.size() && j - i < 4 && stackable(ops[j]) && ops[j].args[0] == ops[i].args[0] &&
             ops[j].s("device") == ops[i].s("device"))
        ++j;
    if (j - i < 2) {
      out.push_back(std::move(ops[i]));
      i = j;
      continue;
    }
    ir::Op s;
    s.kind = ir::OpKind::matmul_stack;
    s.args = ops[i].args;
    std::vector<std::string> weights, formats;
    for (size_t m = i; m < j; ++m) {
      s.results.push_back(ops[m].result());
      s.types.push_back(ops[m].type());
      weights.push_back(ops[m].s("weight"));
      formats.push_back(ops[m].s("format"));
    }
    s.attrs = {{"weights", weights}, {"formats", formats}, {"layer", ops[i].i("layer")}, {"device", ops[i].s("device")}};
    out.push_back(std::move(s));
    ++stacks;
    i = j;
  }
  ops = std::move(out);
  return stacks;
}

}  // namespace

void stack_matmuls(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  if (p.kernel_family == "reference") return;
  const auto graphs = plan_graphs(p);
  std::map<std::string, int> weight_uses;
  for (const ir::Graph* g : graphs)
    for (const auto& op : g->ops)
      if (op.has("weight")) ++weight_uses[op.s("weight")];
  const int stacks = stack_graph(*graphs[0], weight_uses);
  const int draft = graphs.size() > 1 ? stack_graph(*graphs[1], weight_uses) : 0;
  p.notes.push_back(fmt::format("fusion: {} groups of matmuls on one input -> matmul_stack (one GEMV per group "
                                "for single-row steps){}", stacks,
                                graphs.size() > 1 ? fmt::format("; {} in the draft head", draft) : ""));
}

}  // namespace qrig::compiler::passes
