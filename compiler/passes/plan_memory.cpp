// Pass: static memory plan. Sums weight bytes, per-token KV bytes, per-sequence GDN/conv state and the
// activations of one step, then sets the context length that fits the smallest device's budget.
#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "compiler/passes/passes.h"

namespace qrig::compiler::passes {

namespace {
int64_t dtype_bytes(ir::DType d) { return d == ir::DType::f16 ? 2 : 4; }
}  // namespace

void plan_memory(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  ir::MemoryPlan& m = p.memory;
  const auto& hp = cx.params;
  m.weight_bytes = 0;
  for (const auto& t : cx.file.tensors()) {
    // Weights of the MTP block are not loaded until speculative decoding uses them.
    bool mtp = false;
    for (int64_t L = hp.n_layer; L < hp.n_layer + hp.n_mtp; ++L)
      mtp |= t.name.rfind(fmt::format("blk.{}.", L), 0) == 0;
    if (!mtp) m.weight_bytes += (int64_t)t.n_bytes;
  }
  m.kv_bytes_per_token = 0;
  m.state_bytes_per_sequence = 0;
  for (const auto& st : p.graph.states) {
    int64_t elems = 1;
    bool per_token = false;
    for (int64_t d : st.type.shape) {
      if (d == ir::kContext) per_token = true;
      else elems *= d;
    }
    if (per_token) m.kv_bytes_per_token += elems * dtype_bytes(st.type.dtype);
    else m.state_bytes_per_sequence += elems * dtype_bytes(st.type.dtype);
  }
  p.max_batch_tokens = std::max<int64_t>(1, cx.options.max_batch_tokens);
  p.max_sequences = std::max<int64_t>(1, cx.options.max_sequences);
  // Activations of one step at max_batch_tokens. The CPU reference executor keeps every value of a step; a
  // GPU runtime reuses buffers, so it needs the peak of the values alive at once (defined, not yet last used).
  auto bytes_of = [&](const ir::Op& op) {
    int64_t e = 1;
    for (int64_t d : op.type.shape) e *= d < 0 ? p.max_batch_tokens : d;
    return e * 4;
  };
  const auto& ops = p.graph.ops;
  std::map<std::string, size_t> last_use;
  for (size_t k = 0; k < ops.size(); ++k)
    for (const auto& a : ops[k].args) last_use[a] = k;
  for (const auto& o : p.graph.outputs) last_use[o] = ops.size();
  int64_t act = 0, live = 0, peak = 0;
  for (size_t k = 0; k < ops.size(); ++k) {
    if (!ops[k].result.empty()) {
      act += bytes_of(ops[k]);
      live += bytes_of(ops[k]);
    }
    peak = std::max(peak, live);
    for (size_t j = 0; j <= k; ++j)  // free what op k used for the last time
      if (!ops[j].result.empty() && last_use.count(ops[j].result) && last_use[ops[j].result] == k) live -= bytes_of(ops[j]);
  }
  if (p.backend != "cpu") act = peak;
  m.activation_bytes = act;

  double gib = 1e300;
  int n_dev = 0;
  for (const auto& d : cx.rig.devices)
    if ((p.backend == "cpu") == (d.kind == "cpu")) { gib = std::min(gib, d.memory_gib); ++n_dev; }
  if (n_dev == 0) throw CompileError("rig has no device for the chosen backend");
  m.budget_bytes = (int64_t)(gib * 1024 * 1024 * 1024);
  // With a pipeline, each device holds its share of weights and of per-layer state; plan with the share of
  // the device with the most layers (conservative).
  double share = 1.0;
  if (p.placement.size() > 1) {
    int64_t most = 0;
    for (const auto& pl : p.placement) most = std::max(most, pl.last_layer - pl.first_layer + 1);
    share = (double)most / (double)hp.n_layer;
  }
  const int64_t fixed = (int64_t)((double)m.weight_bytes * share) + m.activation_bytes +
                        (int64_t)((double)m.state_bytes_per_sequence * share) * p.max_sequences;
  const int64_t free_bytes = m.budget_bytes - fixed;
  const int64_t per_token = std::max<int64_t>(1, (int64_t)((double)m.kv_bytes_per_token * share) * p.max_sequences);
  if (free_bytes <= per_token * 256)
    throw CompileError(fmt::format("the model does not fit: weights {:.2f} GiB + state + activations need {:.2f} GiB of "
                                   "a {:.2f} GiB budget per device", (double)m.weight_bytes * share / (1 << 30),
                                   (double)fixed / (1 << 30), gib));
  const int64_t fits = free_bytes / per_token;
  int64_t ctx = std::min<int64_t>(fits, hp.context_length);
  if (cx.options.context_length > 0) {
    if (cx.options.context_length > fits)
      throw CompileError(fmt::format("context length {} x {} sequences does not fit: at most {} tokens per sequence",
                                     cx.options.context_length, p.max_sequences, fits));
    ctx = cx.options.context_length;
  }
  p.context_length = ctx;
  p.notes.push_back(fmt::format("memory: weights {:.1f} MiB, kv {} B/token, state {:.1f} MiB/sequence, activations "
                                "{:.1f} MiB; context {} tokens x {} sequences (model max {}, fits {})",
                                (double)m.weight_bytes / (1 << 20), m.kv_bytes_per_token,
                                (double)m.state_bytes_per_sequence / (1 << 20), (double)m.activation_bytes / (1 << 20),
                                ctx, p.max_sequences, hp.context_length, fits));
}

}  // namespace qrig::compiler::passes
