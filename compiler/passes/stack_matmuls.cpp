// Pass (fusion): 2..4 matmuls reading one input (q|k|v, gate|up, the GDN input projections) become one
// matmul_stack: their weights are uploaded stacked (one device matrix), so a single-row step runs one GEMV for all
// of them (each member's rows written to its own result); steps of more rows run each member's own kernel on its
// slice. Q8_0 weights and the block types the dp4a family decodes (Q4_K, Q6_K, ...: kernels/matmul.h) stack alike.
//
// A stack's members share their format (one kernel reads the stack) and their precise_rows (one quantized input).
// A run of consecutive matmuls on one input whose formats differ (a Q4_K_M file: q and k Q4_K, v Q6_K) is split by
// format: the members of each format stack together (in their order), a format with one member stays a plain
// matmul, and the run's ops are emitted in the order of each stack's (or matmul's) first member. The matmuls of a
// run only read the run's input, never each other's results, so this reordering changes no value. A format with
// more than 4 members gives stacks of 4 and the rest. A block-type member joins a stack only where its rows start
// at a 16-byte aligned place of the stack's scale bytes (kernels::wq_stack_view_aligned: its own kernels read it
// from there); otherwise the stack so far is closed and the member starts the next (every shape of the 9B and 27B
// models is aligned; the note counts those that were not).
#include <map>

#include <fmt/format.h>

#include "compiler/passes/passes.h"
#include "kernels/matmul.h"

namespace qrig::compiler::passes {

namespace {

struct Counts {
  std::map<std::string, int> stacks;  // by format
  int unaligned = 0;                  // members that could not join the stack before them (alignment)
  int total() const {
    int n = 0;
    for (const auto& [f, c] : stacks) n += c;
    return n;
  }
  std::string by_format() const {
    std::string s;
    for (const auto& [f, c] : stacks) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", f, c);
    return s;
  }
};

// Stacks one graph's groups. A weight used by both graphs (the draft head shares the main model's lm_head) is
// stacked in neither: weight_uses counts the uses in every graph.
Counts stack_graph(ir::Graph& g, const gguf::File& file, const std::map<std::string, int>& weight_uses_all) {
  auto& ops = g.ops;
  std::map<std::string, int> weight_uses = weight_uses_all;
  auto stackable = [&](const ir::Op& o) {
    if (o.kind != ir::OpKind::matmul || o.type().shape.size() != 2 || o.type().shape[0] != ir::kTokens ||
        weight_uses[o.s("weight")] != 1)
      return false;
    const std::string& f = o.s("format");
    return f == "q8_0" || kernels::wq_type_of_format(f) >= 0;
  };
  // A member's rows and row length, from the file (the op's shapes say the same; the file is what is uploaded).
  auto shape_of = [&](const ir::Op& o) {
    const gguf::TensorInfo* t = file.find_tensor(o.s("weight"));
    if (!t || t->ne.size() != 2) throw CompileError(fmt::format("{}: weight '{}' is not a matrix", o.describe(), o.s("weight")));
    return std::make_pair((int64_t)t->ne[1], (int64_t)t->ne[0]);
  };
  std::vector<ir::Op> out;
  Counts counts;
  for (size_t i = 0; i < ops.size();) {
    size_t j = i + 1;
    if (stackable(ops[i]))
      while (j < ops.size() && stackable(ops[j]) && ops[j].args[0] == ops[i].args[0] &&
             ops[j].s("device") == ops[i].s("device"))
        ++j;
    if (j - i < 2) {
      out.push_back(std::move(ops[i]));
      i = j;
      continue;
    }
    // The run [i, j) split into chunks: per (format, precise_rows) in order, at most 4 members, aligned views.
    std::vector<std::vector<size_t>> chunks;
    std::map<std::string, size_t> open;    // key -> index of its open chunk in `chunks`
    std::map<std::string, int64_t> rows;   // key -> rows of its open chunk
    for (size_t m = i; m < j; ++m) {
      const std::string& f = ops[m].s("format");
      const std::string key = fmt::format("{}/{}", f, ops[m].has("precise_rows") ? ops[m].i("precise_rows") : -1);
      const auto [n, cols] = shape_of(ops[m]);
      auto it = open.find(key);
      bool joins = it != open.end() && chunks[it->second].size() < 4;
      const int64_t wt = kernels::wq_type_of_format(f);
      if (joins && wt >= 0 && !kernels::wq_stack_view_aligned(wt, cols, rows[key])) {
        joins = false;
        ++counts.unaligned;
      }
      if (joins) {
        chunks[it->second].push_back(m);
        rows[key] += n;
      } else {
        open[key] = chunks.size();
        rows[key] = n;
        chunks.push_back({m});
      }
    }
    for (const auto& c : chunks) {
      if (c.size() == 1) {
        out.push_back(std::move(ops[c[0]]));
        continue;
      }
      const ir::Op& first = ops[c[0]];
      ir::Op s;
      s.kind = ir::OpKind::matmul_stack;
      s.args = first.args;
      std::vector<std::string> weights, formats;
      for (size_t m : c) {
        s.results.push_back(ops[m].result());
        s.types.push_back(ops[m].type());
        weights.push_back(ops[m].s("weight"));
        formats.push_back(ops[m].s("format"));
      }
      s.attrs = {{"weights", weights}, {"formats", formats}, {"layer", first.i("layer")}, {"device", first.s("device")}};
      if (first.has("precise_rows")) s.set("precise_rows", first.i("precise_rows"));
      ++counts.stacks[formats[0]];
      out.push_back(std::move(s));
    }
    i = j;
  }
  ops = std::move(out);
  return counts;
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
  const Counts main = stack_graph(*graphs[0], cx.file, weight_uses);
  const Counts draft = graphs.size() > 1 ? stack_graph(*graphs[1], cx.file, weight_uses) : Counts{};
  std::string note = fmt::format("fusion: {} groups of matmuls on one input -> matmul_stack (one GEMV per group for "
                                 "single-row steps; members of one format, their weights uploaded as one matrix)",
                                 main.total());
  if (main.total() > 0) note += fmt::format(": {}", main.by_format());
  if (graphs.size() > 1) note += fmt::format("; {} in the draft head", draft.total());
  if (main.unaligned + draft.unaligned > 0)
    note += fmt::format("; {} block-type matmuls left out of the stack before them: their rows would not start at a "
                        "16-byte aligned place of its scale bytes", main.unaligned + draft.unaligned);
  p.notes.push_back(note);
}

}  // namespace qrig::compiler::passes
