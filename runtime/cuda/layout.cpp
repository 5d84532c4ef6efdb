// The CUDA executor's allocations for a plan (layout.h).
#include "runtime/cuda/layout.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "kernels/kv_format.h"
#include "kernels/matmul.h"
#include "kernels/sampling.h"
#include "runtime/cuda/q8_layout.h"
#include "runtime/errors.h"

namespace qrig::cuda {

namespace {

using runtime::RuntimeError;

int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

const gguf::TensorInfo& need(const gguf::File& f, const std::string& name, const ir::Op& op) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) throw RuntimeError(fmt::format("{}: weight '{}' is not in {}", op.describe(), name, f.path()));
  return *t;
}

const gguf::TensorInfo& need_q8(const gguf::File& f, const std::string& name, const ir::Op& op) {
  const gguf::TensorInfo& t = need(f, name, op);
  if (t.ne.size() != 2 || t.type != gguf::TensorType::Q8_0 || t.ne[0] % 32 != 0)
    throw RuntimeError(fmt::format("{}: weight '{}' is {} {}; the CUDA dp4a family has no kernels for it (use the "
                                   "CPU backend)", op.describe(), name, gguf::tensor_type_name(t.type),
                                   t.shape_string()));
  return t;
}

}  // namespace

kernels::KvFormat cache_format(const runtime::BoundState& st) {
  switch (st.dtype) {
    case ir::DType::f16: return kernels::KvFormat::f16;
    case ir::DType::q8: return kernels::KvFormat::q8;
    case ir::DType::t4: return kernels::KvFormat::t4;
    case ir::DType::t3: return kernels::KvFormat::t3;
    default:
      throw RuntimeError(fmt::format("state %{} is {}: CUDA key and value caches are f16, q8, t4 or t3 (f32 is the CPU "
                                     "reference's: docs/kv-cache.md)", st.name, ir::dtype_name(st.dtype)));
  }
}

DeviceLayout device_layout(const ir::Plan& plan, const runtime::BoundGraph& g, const gguf::File& f,
                           const std::string& stage) {
  DeviceLayout L;
  if (stage.empty() && plan.placement.size() > 1)
    throw RuntimeError(fmt::format("a plan of {} stages runs as a pipeline (one executor per stage)",
                                   plan.placement.size()));
  std::vector<bool> used_state(g.states.size(), stage.empty());
  std::vector<bool> keeps_state(g.states.size(), false);  // written by an op that keeps it per position (conv, gdn)
  L.has_output = stage.empty();
  std::set<std::string> seen;
  // A matrix: Q8_0, or another block type the dp4a family decodes (uploaded split, kernels/matmul.h wq_layout).
  auto q8 = [&](const ir::Op& op, const std::string& name) {
    if (!seen.insert(name).second) return;
    const gguf::TensorInfo& t0 = need(f, name, op);
    if (t0.ne.size() == 2 && kernels::wq_dp4a_type((int64_t)t0.type)) {
      const int64_t rows = (int64_t)t0.ne[1], cols = (int64_t)t0.ne[0];
      WeightUpload w{WeightUpload::wq, {name}, -1, rows, cols, 0};
      w.wtype = (int64_t)t0.type;
      try {
        w.bytes = kernels::wq_device_bytes(w.wtype, rows, cols);
      } catch (const kernels::KernelError& e) {
        throw RuntimeError(fmt::format("{}: weight '{}': {}", op.describe(), name, e.what()));
      }
      L.weights.push_back(std::move(w));
      return;
    }
    const gguf::TensorInfo& t = need_q8(f, name, op);
    const int64_t rows = (int64_t)t.ne[1], cols = (int64_t)t.ne[0];
    L.weights.push_back({WeightUpload::q8, {name}, -1, rows, cols,
                         (int64_t)(q8_qs_bytes(rows, cols) + q8_scale_bytes(rows, cols))});
  };
  auto f32 = [&](const ir::Op& op, const std::string& name, int64_t n) {
    if (!seen.insert(name).second) return;
    const gguf::TensorInfo& t = need(f, name, op);
    if (t.type != gguf::TensorType::F32 || (int64_t)t.n_elements != n)
      throw RuntimeError(fmt::format("{}: weight '{}' must be F32 with {} values, is {} {}", op.describe(), name, n,
                                     gguf::tensor_type_name(t.type), t.shape_string()));
    L.weights.push_back({WeightUpload::f32, {name}, -1, n, 1, n * 4});
  };
  if (plan.draft_tokens > 0 && (!stage.empty() || plan.placement.size() != 1))
    throw RuntimeError("plan: a plan that drafts runs on one stage");
  std::optional<runtime::BoundGraph> draft;
  if (plan.draft_tokens > 0) draft.emplace(plan, plan.draft);
  // The weights of the main graph's ops, then of the draft graph's (those not uploaded for the main graph).
  for (int pass = 0; pass < (draft ? 2 : 1); ++pass) {
    const runtime::BoundGraph& gr = pass == 0 ? g : *draft;
    for (size_t i = 0; i < gr.ops.size(); ++i) {
      const runtime::BoundOp& b = gr.ops[i];
      const ir::Op& op = *b.op;
      const int64_t width = b.results.empty() ? 0 : gr.width(b.results[0]);
      if (!stage.empty() && b.kind == ir::OpKind::bridge && op.s("from") == stage) L.bridge_out_width = width;
      if (!on_stage(op, stage)) continue;
      if (pass == 0) {
        for (int st : {b.state, b.k_state, b.v_state})
          if (st >= 0) used_state[(size_t)st] = true;
        if (b.state >= 0 && (b.kind == ir::OpKind::conv1d_silu || b.kind == ir::OpKind::gdn))
          keeps_state[(size_t)b.state] = true;
        if (b.kind == ir::OpKind::gather_rows) L.has_output = true;
        if (b.kind == ir::OpKind::bridge) L.bridge_in_width = width;
      } else if (b.state >= 0 || b.kind == ir::OpKind::bridge) {
        throw RuntimeError(fmt::format("draft graph: {} (the head has key and value caches only)", op.describe()));
      }
      switch (b.kind) {
        case ir::OpKind::embed:
          q8(op, op.s("weight"));
          if (pass == 0) L.vocab_rows = (int64_t)need(f, op.s("weight"), op).ne[1];
          break;
        case ir::OpKind::rmsnorm:
        case ir::OpKind::rmsnorm_quant:
        case ir::OpKind::add_rmsnorm_quant: f32(op, op.s("weight"), width); break;  // the sum's width
        case ir::OpKind::matmul: q8(op, op.s("weight")); break;
        case ir::OpKind::matmul_stack: {
          // One type for all members: Q8_0 (q8_stack) or a block type the dp4a family decodes (wq_stack).
          WeightUpload w{WeightUpload::q8_stack, op.strs("weights"), -1, 0, -1, 0};
          std::vector<int64_t> member_rows;
          for (size_t m = 0; m < w.tensors.size(); ++m) {
            const std::string& name = w.tensors[m];
            if (!seen.insert(name).second)
              throw RuntimeError(fmt::format("{}: weight '{}' is used twice; a stacked weight is used once", op.describe(), name));
            const gguf::TensorInfo& t0 = need(f, name, op);
            const bool block = t0.ne.size() == 2 && kernels::wq_dp4a_type((int64_t)t0.type);
            if (m == 0) {
              w.kind = block ? WeightUpload::wq_stack : WeightUpload::q8_stack;
              w.wtype = block ? (int64_t)t0.type : 8;
            } else if ((block ? (int64_t)t0.type : 8) != w.wtype) {
              throw RuntimeError(fmt::format("{}: stacked weights of different types ('{}' is {}, '{}' {})",
                                             op.describe(), name, gguf::tensor_type_name(t0.type), w.tensors[0],
                                             gguf::tensor_type_name(need(f, w.tensors[0], op).type)));
            }
            const gguf::TensorInfo& t = block ? t0 : need_q8(f, name, op);
            if (w.cols >= 0 && (int64_t)t.ne[0] != w.cols)
              throw RuntimeError(fmt::format("{}: stacked weights of different widths", op.describe()));
            w.cols = (int64_t)t.ne[0];
            w.rows += (int64_t)t.ne[1];
            member_rows.push_back((int64_t)t.ne[1]);
          }
          if (w.kind == WeightUpload::wq_stack) {
            try {
              kernels::check_wq_stack(w.wtype, w.cols, member_rows);
              w.bytes = kernels::wq_device_bytes(w.wtype, w.rows, w.cols);
            } catch (const kernels::KernelError& e) {
              throw RuntimeError(fmt::format("{}: {}", op.describe(), e.what()));
            }
          } else {
            w.bytes = (int64_t)(q8_qs_bytes(w.rows, w.cols) + q8_scale_bytes(w.rows, w.cols));
          }
          L.weights.push_back(std::move(w));
          break;
        }
        case ir::OpKind::conv1d_silu: {
          const runtime::BoundState& st = gr.states.at((size_t)b.state);
          f32(op, op.s("weight"), (st.shape.at(0) + 1) * width);
          break;
        }
        case ir::OpKind::gdn:
          f32(op, op.s("ssm_a"), op.i("value_heads"));
          f32(op, op.s("dt_bias"), op.i("value_heads"));
          break;
        case ir::OpKind::gated_rmsnorm:
        case ir::OpKind::head_rmsnorm: f32(op, op.s("weight"), op.i("head_dim")); break;
        case ir::OpKind::rope: {
          const int64_t n = op.i("rope_dims") / 2;
          WeightUpload w{WeightUpload::rope_table, {}, (int)i, n, 1, n * 8};
          w.draft = pass == 1;
          L.weights.push_back(std::move(w));
          break;
        }
        case ir::OpKind::quantize:
        case ir::OpKind::add:
        case ir::OpKind::swiglu:
        case ir::OpKind::swiglu_quant:
        case ir::OpKind::kv_write:
        case ir::OpKind::attention:
        case ir::OpKind::gather_rows:
        case ir::OpKind::concat:
        case ir::OpKind::bridge: break;
      }
    }
  }
  for (const auto& w : L.weights) L.weight_bytes += w.bytes;
  // A stage without the embedding still takes token ids (the step's shape and checks): the table's rows.
  if (L.vocab_rows <= 0)
    if (const gguf::TensorInfo* t = f.find_tensor("token_embd.weight"); t && t->ne.size() == 2)
      L.vocab_rows = (int64_t)t->ne[1];
  if (L.vocab_rows <= 0) throw RuntimeError("graph has no embedding");

  L.max_t = plan.rows_per_call();
  L.max_r = plan.max_logit_rows;
  const std::string dev = stage.empty() ? plan.placement.at(0).device : stage;
  for (const auto& m : plan.memory.devices)
    if (m.device == dev) L.arena_bytes = m.arena;
  L.io_bytes = 2 * L.max_t * 4 + 2 * L.max_r * 4 + 2 * L.max_t * (L.bridge_in_width + L.bridge_out_width) * 4;
  // The batched decode kernels' tables (executor_bind.cpp): per slot its recurrent-state and cache pointers, per
  // step the slots and positions of its sequences.
  L.io_bytes += plan.max_sequences * (1 + (int64_t)g.states.size()) * 8 + 2 * plan.max_sequences * 4;
  const ir::AttrValue* adjust = plan.graph.attr("top_k_adjust_per_row");
  if (!adjust || !std::holds_alternative<int64_t>(*adjust))
    throw RuntimeError("plan: the graph has no top_k_adjust_per_row (recompile the plan)");
  L.top_k_adjust = std::get<int64_t>(*adjust);
  L.top_k_rows = kernels::top_k_rows(L.max_r, plan.max_sequences, plan.draft_tokens);
  L.top_k_vocab = plan.vocab_real > 0 ? std::min(plan.vocab_real, L.vocab_rows) : L.vocab_rows;
  L.sampling_bytes = L.has_output ? kernels::top_k_buffers(L.top_k_vocab, L.top_k_rows, L.top_k_adjust).total() : 0;

  for (size_t k = 0; k < g.states.size(); ++k) {
    const runtime::BoundState& st = g.states[k];
    if (!used_state[k]) {  // another stage's
      L.state_offset.push_back(-1);
      L.cache_halves.push_back(0);
      continue;
    }
    if (st.positional) {
      const kernels::KvFormat f = cache_format(st);
      if (st.row_width <= 0 || st.elements % st.row_width != 0 || !kernels::kv_width_ok(f, st.row_width))
        throw RuntimeError(fmt::format("state %{}: {} values are not rows of {} a {} cache holds", st.name, st.elements,
                                       st.row_width, kernels::kv_format_name(f)));
      const int64_t bytes = st.elements / st.row_width * kernels::kv_row_bytes(f, st.row_width, false);
      L.state_offset.push_back(-1);
      L.cache_halves.push_back((bytes + 1) / 2);
      L.slot_bytes += bytes;
    } else {
      if (st.dtype != ir::DType::f32)
        throw RuntimeError(fmt::format("state %{} is {}: recurrent states are f32", st.name, ir::dtype_name(st.dtype)));
      if (plan.draft_tokens > 0 && !keeps_state[k])  // a rollback restores only what the verify kept
        throw RuntimeError(fmt::format("state %{}: a plan that drafts keeps recurrent states per position only for "
                                       "conv1d_silu and gdn ops", st.name));
      L.state_offset.push_back(L.rec_floats);
      L.cache_halves.push_back(0);
      L.rec_floats += align_up(st.elements, 64);
    }
  }
  if (plan.draft_tokens < 0) throw RuntimeError(fmt::format("plan: draft_tokens {}", plan.draft_tokens));
  L.kept_floats = plan.draft_tokens * L.rec_floats;
  L.slot_bytes += (L.rec_floats + L.kept_floats) * 4;
  if (draft) {  // the MTP head: its caches and waiting rows per slot, its row buffers (draft_head.h)
    if (!draft->has_hidden) throw RuntimeError("plan: the draft graph has no %hidden input");
    L.draft_width = draft->width(runtime::BoundGraph::kHidden);
    L.draft_pending_rows = plan.draft_tokens + 2;
    for (const runtime::BoundState& st : draft->states) {
      if (!st.positional) throw RuntimeError(fmt::format("draft graph: state %{} is not a key or value cache", st.name));
      const kernels::KvFormat fmt_ = cache_format(st);
      if (st.row_width <= 0 || st.elements % st.row_width != 0 || !kernels::kv_width_ok(fmt_, st.row_width))
        throw RuntimeError(fmt::format("draft graph: state %{} cannot be a {} cache", st.name,
                                       kernels::kv_format_name(fmt_)));
      const int64_t bytes = st.elements / st.row_width * kernels::kv_row_bytes(fmt_, st.row_width, false);
      L.draft_cache_halves.push_back((bytes + 1) / 2);
      L.slot_bytes += bytes;
    }
    L.slot_bytes += L.draft_pending_rows * L.draft_width * 4;
    L.io_bytes += (2 * L.max_t + 1) * L.draft_width * 4;
  }
  L.slots = plan.max_sequences;
  return L;
}

void check_layout(const DeviceLayout& L, const ir::Plan& plan, const std::string& stage) {
  if (plan.memory.devices.size() != plan.placement.size())
    throw RuntimeError(fmt::format("plan: {} device memory tables for {} stage(s)", plan.memory.devices.size(),
                                   plan.placement.size()));
  const std::string dev = stage.empty() ? plan.placement.at(0).device : stage;
  const ir::DeviceMemory* found = nullptr;
  for (const auto& d : plan.memory.devices)
    if (d.device == dev) found = &d;
  if (!found) throw RuntimeError(fmt::format("plan: no memory table for {}", dev));
  const ir::DeviceMemory& m = *found;
  const std::pair<const char*, std::pair<int64_t, int64_t>> parts[] = {
      {"weights", {L.weight_bytes, m.weights}},
      {"activation arena", {L.arena_bytes, m.arena}},
      {"step inputs and outputs", {L.io_bytes, m.io}},
      {"sampling buffers", {L.sampling_bytes, m.sampling}},
      {"slot states", {L.slot_bytes * L.slots, m.states}},
  };
  for (const auto& [what, v] : parts)
    if (v.first != v.second)
      throw RuntimeError(fmt::format("plan: its memory table says {} bytes of {} on {}, the runtime needs {}: recompile "
                                     "the plan with this qrig", v.second, what, m.device, v.first));
  const int64_t snaps = L.rec_floats * 4 * plan.memory.snapshots_per_slot * L.slots;
  if (snaps != m.snapshots || (stage.empty() && plan.memory.snapshot_bytes != L.rec_floats * 4))
    throw RuntimeError(fmt::format("plan: its snapshot budget ({} bytes, {} per snapshot) does not match the runtime's "
                                   "({} bytes, {} per snapshot): recompile the plan", m.snapshots,
                                   plan.memory.snapshot_bytes, snaps, L.rec_floats * 4));
}

}  // namespace qrig::cuda
