// Pass (dp4a family): matmuls multiply int8 activations. Each value a matmul reads is quantized once by an
// explicit `quantize` op placed before its first reader (all its matmuls then read the q8 value): one int8
// plane per 32 values as llama.cpp's MMQ/MMVQ, or two planes (~15 bits) in steps of at most precise_rows rows,
// where a matmul is bound by its weight bytes and the second plane costs little (decode). Matmuls over the block
// types other than Q8_0 (Q4_K, Q6_K, ...) read one plane at every row count unless precise_rows was asked for
// (--precise-rows / --precise): their weights' own rounding (4-6 bits) is far above the int8 activation's, as in
// llama.cpp's MMVQ, which reads one int8 plane for every type; the second plane costs its writes, reads and dp4a
// (on the H200 the one-plane GEMVs measured 1-10% faster: bench/RESULTS.md, session 10). A value read by matmuls
// of both kinds gets one quantize op per kind (`x.q`, `x.q1`). A plan that drafts (plan_draft) also covers its verify steps: two planes up
// to one verify of k + 1 tokens per sequence slot, so that a verify row is quantized as the decode row of the same
// token would be (the matmul kernels still change with the step's rows, and with them the order of the fp32 sums:
// docs/speculative.md). The draft graph's matmuls follow the same rules.
#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "compiler/passes/passes.h"
#include "kernels/matmul.h"

namespace qrig::compiler::passes {

namespace {

// The quantize ops of one graph (the main one or the draft head's); returns how many block-type matmuls read one
// plane where the plan's rule gives two. explicit_rows: precise_rows was asked for (--precise-rows / --precise).
int64_t quantize_graph(ir::Graph& g, int64_t precise_rows, bool explicit_rows) {
  std::map<std::string, ir::Type> types;
  for (const auto& in : g.inputs) types[in.name] = in.type;
  for (const auto& op : g.ops)
    for (size_t k = 0; k < op.results.size(); ++k) types[op.results[k]] = op.types[k];
  std::vector<ir::Op> out;
  // The precise_rows of a matmul's input: the plan's, or 0 (one plane) for a block type when none was asked.
  auto precise_of = [&](const ir::Op& op) {
    if (explicit_rows || op.kind != ir::OpKind::matmul || kernels::wq_type_of_format(op.s("format")) < 0)
      return precise_rows;
    return int64_t{0};
  };
  int64_t one_plane = 0;
  std::map<std::pair<std::string, int64_t>, std::string> quantized;  // (f32 value, precise_rows) -> its q8 value
  for (ir::Op& op : g.ops) {
    if (op.kind == ir::OpKind::matmul) {
      const std::string x = op.args.at(0);
      const int64_t pr = precise_of(op);
      if (pr != precise_rows) ++one_plane;
      op.set("precise_rows", pr);
      auto it = quantized.find({x, pr});
      if (it == quantized.end()) {
        const ir::Type* t = types.count(x) ? &types.at(x) : nullptr;
        if (!t || t->dtype != ir::DType::f32 || t->shape.size() != 2 || t->shape[1] <= 0 || t->shape[1] % 32 != 0)
          throw CompileError(fmt::format("{}: the dp4a family quantizes matmul inputs per 32 values; %{} is {}",
                                         op.describe(), x, t ? ir::type_string(*t) : "undefined"));
        ir::Op q;
        q.kind = ir::OpKind::quantize;
        q.args = {x};
        const std::string name = x + (pr == precise_rows ? ".q" : ".q1");
        q.results = {name};
        q.types = {{ir::DType::q8, t->shape}};
        q.attrs = {{"precise_rows", pr}, {"layer", op.i("layer")}, {"device", op.s("device")}};
        it = quantized.emplace(std::make_pair(x, pr), name).first;
        out.push_back(std::move(q));
      }
      op.args[0] = it->second;
    }
    out.push_back(std::move(op));
  }
  g.ops = std::move(out);
  return one_plane;
}

}  // namespace

void quantize_matmul_inputs(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  if (p.kernel_family == "reference") return;
  const int64_t asked = cx.options.precise_rows;
  p.precise_rows = std::min(asked < 0 ? kDefaultPreciseRows : asked, cx.options.max_batch_tokens);
  // Drafting: a step of one verify (k + 1 tokens) per slot keeps decode's two planes.
  const int64_t verify_rows = std::min(p.max_sequences * (p.draft_tokens + 1), cx.options.max_batch_tokens);
  if (p.draft_tokens > 0 && asked < 0 && verify_rows > p.precise_rows) {
    p.precise_rows = verify_rows;
    p.notes.push_back(fmt::format("activations: two planes up to {} rows, not {}, because the plan drafts: a step "
                                  "verifying {} tokens in each of {} sequences is quantized as decode is",
                                  verify_rows, kDefaultPreciseRows, p.draft_tokens + 1, p.max_sequences));
  } else if (p.draft_tokens > 0 && verify_rows > p.precise_rows) {
    p.notes.push_back(fmt::format("activations: --precise-rows {} is below the {} rows of a verify step in every "
                                  "sequence: such steps take one plane where decode takes two (drafting then differs "
                                  "from decode by more than rounding)", p.precise_rows, verify_rows));
  }
  // A pipeline cuts prefill inputs into pieces of 64 tokens or more: so that each piece's matmul inputs are
  // quantized as the whole input's would be, two planes stop below that (or cover every matmul).
  if (p.pipeline_micro_batch > 0 && p.precise_rows >= 64 && p.precise_rows < cx.options.max_batch_tokens)
    throw CompileError(fmt::format("--precise-rows {}: a pipeline plan takes two planes below 64 rows or in every "
                                   "matmul (--precise)", p.precise_rows));
  p.notes.push_back(
      p.precise_rows >= cx.options.max_batch_tokens
          ? "activations: two int8 planes (~15 bits) in every matmul"
          : fmt::format("activations: two int8 planes (~15 bits) in matmuls of <= {} rows (decode), one (int8, as "
                        "llama.cpp) above (prefill)",
                        p.precise_rows));
  int64_t one_plane = 0;
  for (ir::Graph* g : plan_graphs(p)) one_plane += quantize_graph(*g, p.precise_rows, asked >= 0);
  if (one_plane > 0)
    p.notes.push_back(fmt::format("activations: {} block-type matmuls (not Q8_0) read one int8 plane at every row "
                                  "count (their weights' rounding is far above it; --precise-rows N or --precise "
                                  "give them two)", one_plane));
}

}  // namespace qrig::compiler::passes
