// BoundGraph (bound_graph.h).
#include "runtime/bound_graph.h"

#include <map>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace qrig::runtime {

BoundGraph::BoundGraph(const ir::Plan& plan, const ir::Graph& g) {
  std::map<std::string, int> id;
  const char* inputs[] = {"tokens", "pos", "rows", "hidden"};
  has_hidden = g.inputs.size() == 4;
  if (g.inputs.size() != 3 && !has_hidden)
    throw RuntimeError("graph inputs must be %tokens, %pos, %rows (and a draft graph's %hidden)");
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    if (g.inputs[i].name != inputs[i])
      throw RuntimeError("graph inputs must be %tokens, %pos, %rows (and a draft graph's %hidden), in this order");
    id[inputs[i]] = (int)values.size();
    const auto& shape = g.inputs[i].type.shape;
    const int64_t width = i < 3 ? 1 : shape.size() == 2 && shape[0] == ir::kTokens && shape[1] > 0 ? shape[1] : 0;
    if (width == 0) throw RuntimeError("a draft graph's %hidden must be [T, width]");
    values.push_back({inputs[i], g.inputs[i].type, width, i == 2});
  }
  std::map<std::string, int> state_id;
  for (const auto& st : g.states) {
    BoundState s;
    s.name = st.name;
    s.dtype = st.type.dtype;
    s.elements = 1;
    for (int64_t d : st.type.shape) {
      const int64_t v = d == ir::kContext ? plan.context_length : d;
      if (d == ir::kContext) s.positional = true;
      if (v <= 0) throw RuntimeError(fmt::format("state %{} has a dimension {}", st.name, v));
      s.shape.push_back(v);
      s.elements *= v;
    }
    if (s.positional) {
      if (st.type.shape.size() != 2 || st.type.shape[0] != ir::kContext)
        throw RuntimeError(fmt::format("state %{} ({}): key and value caches are [C, W]", st.name,
                                       ir::type_string(st.type)));
      s.row_width = s.shape[1];
    }
    state_id[st.name] = (int)states.size();
    states.push_back(std::move(s));
  }
  for (const ir::Op& op : g.ops) {
    BoundOp b;
    b.op = &op;
    b.kind = op.kind;
    for (const auto& a : op.args) {
      auto it = id.find(a);
      if (it == id.end()) throw RuntimeError(fmt::format("{}: argument %{} is not defined before it", op.describe(), a));
      b.args.push_back(it->second);
    }
    for (size_t k = 0; k < op.results.size(); ++k) {
      const ir::Type& t = op.types.at(k);
      if (t.shape.size() != 2 || t.shape[1] <= 0 || (t.shape[0] != ir::kTokens && t.shape[0] != ir::kRows))
        throw RuntimeError(fmt::format("{}: results must be [T or R, width], %{} is {}", op.describe(), op.results[k],
                                       ir::type_string(t)));
      if (id.count(op.results[k])) throw RuntimeError(fmt::format("{}: %{} is defined twice", op.describe(), op.results[k]));
      const bool rows = t.shape[0] == ir::kRows;
      if (k > 0 && rows != b.rows) throw RuntimeError(fmt::format("{}: results mix T and R rows", op.describe()));
      b.rows = rows;
      id[op.results[k]] = (int)values.size();
      b.results.push_back((int)values.size());
      values.push_back({op.results[k], t, t.shape[1], rows});
    }
    auto state_ref = [&](const char* key) {
      if (!op.has(key)) return -1;
      auto it = state_id.find(op.s(key));
      if (it == state_id.end()) throw RuntimeError(fmt::format("{}: state %{} is not declared", op.describe(), op.s(key)));
      return it->second;
    };
    b.state = state_ref("state");
    b.k_state = state_ref("k_cache");
    b.v_state = state_ref("v_cache");
    for (int s : {b.k_state, b.v_state})
      if (s >= 0 && !states[(size_t)s].positional)
        throw RuntimeError(fmt::format("{}: %{} is not a key or value cache", op.describe(), states[(size_t)s].name));
    if (b.state >= 0 && states[(size_t)b.state].positional)
      throw RuntimeError(fmt::format("{}: %{} is a cache, not a recurrent state", op.describe(), states[(size_t)b.state].name));
    if (op.has("tap")) b.tap = op.s("tap");
    ops.push_back(std::move(b));
  }
  if (g.outputs.size() != 1 || g.outputs[0] != "logits" || ops.empty() || ops.back().results.size() != 1 ||
      values[(size_t)ops.back().results[0]].name != "logits")
    throw RuntimeError("graph output must be %logits, the last op's result");
  logits = ops.back().results[0];
}

}  // namespace qrig::runtime
