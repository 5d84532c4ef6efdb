// Pass: the static memory plan, per device. Weights (as the backend holds them), every slot's states (conv and
// GDN states, key and value caches at the context length), the activation arena of one step (on CUDA plans
// every result and every op scratch gets an offset by liveness: two share bytes only when their lifetimes do
// not overlap; written as the ops' `at` and `scratch` attributes), the per-step inputs and outputs, the
// sampling buffers and the prefix cache's snapshot budget. Then the context length that fits every device's
// budget. The CUDA executor allocates exactly this (runtime/cuda/layout.h; a test compares the two).
#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "compiler/passes/passes.h"
#include "ir/kernel_attr.h"
#include "kernels/attention.h"
#include "kernels/gdn.h"
#include "kernels/kv_format.h"
#include "kernels/matmul.h"
#include "kernels/sampling.h"

namespace qrig::compiler::passes {

namespace {

constexpr int64_t kAlign = 256;
constexpr int64_t kTopKAdjustPerRow = 8192;  // bias + penalty entries a row may carry on the GPU's sampling path

int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

bool is_mtp_tensor(const std::string& name, const Qwen35Params& hp) {
  for (int64_t L = hp.n_layer; L < hp.n_layer + hp.n_mtp; ++L)
    if (name.rfind(fmt::format("blk.{}.", L), 0) == 0) return true;
  return false;
}


// Per device, per tensor type: how many tensors and the bytes the backend holds (a `qrig inspect` note).
struct TypeTally {
  int64_t tensors = 0, bytes = 0;
};
using WeightTypes = std::map<std::string, std::map<std::string, TypeTally>>;

std::string weight_types_note(const std::string& device, const std::map<std::string, TypeTally>& types) {
  std::string s = fmt::format("weights on {} by type:", device);
  bool first = true;
  for (const auto& [type, t] : types) {
    s += fmt::format("{} {} {} ({:.2f} MiB)", first ? "" : ",", type, t.tensors, (double)t.bytes / (1 << 20));
    first = false;
  }
  return s;
}

// Per device, per format: the stacked uploads (one device matrix per matmul_stack: runtime/cuda/layout.h q8_stack
// and wq_stack), their member tensors and bytes (a `qrig inspect` note).
struct StackTally {
  int64_t stacks = 0, tensors = 0, bytes = 0;
};
using Stacks = std::map<std::string, std::map<std::string, StackTally>>;

std::string stacks_note(const std::string& device, const std::map<std::string, StackTally>& formats) {
  int64_t stacks = 0, tensors = 0;
  std::string by;
  for (const auto& [f, t] : formats) {
    stacks += t.stacks;
    tensors += t.tensors;
    by += fmt::format("{} {} {} of {} tensors ({:.2f} MiB)", by.empty() ? "" : ",", f, t.stacks, t.tensors,
                      (double)t.bytes / (1 << 20));
  }
  return fmt::format("weights on {} stacked: {} matmul_stack uploads of {} tensors, each one device matrix of its "
                     "members' rows (per format:{})", device, stacks, tensors, by);
}

// Bytes of a result value in the arena at `rows` rows: f32 rows, or the planes and scales of a q8 value.
int64_t value_bytes(const ir::Type& t, int64_t rows, int64_t precise_rows) {
  const int64_t w = t.shape.back();
  if (t.dtype != ir::DType::q8) return align_up(rows * w * 4, kAlign);
  int64_t b = align_up(rows * w, kAlign) + align_up(rows * (w / 32) * 4, kAlign);
  if (precise_rows > 0) b += align_up(std::min(rows, precise_rows) * w, kAlign);
  return b;
}

struct DeviceParts {
  ir::DeviceMemory mem;
  int64_t rec_floats = 0;          // per slot (CUDA: each state 64-float aligned)
  int64_t kv_bytes_per_token = 0;  // per slot
  std::vector<std::pair<bool, int64_t>> kv_rows;  // per key (true) or value cache: values per position
  int64_t state_bytes = 0;         // per slot, non-positional
  int64_t draft_kv = 0;            // per slot and token: the MTP head's cache (plan_draft.cpp), f32 on the CPU
  std::vector<std::pair<bool, int64_t>> draft_kv_rows;  // CUDA: the head's key / value caches, in the plan's formats
  int64_t draft_rollback = 0;      // per slot: the recurrent states a verify step keeps (draft_tokens of them)
  int64_t draft_pending = 0;       // CUDA, per slot: the main model's hidden rows waiting for the head (f32)
  int64_t draft_io = 0;            // CUDA: the step's hidden rows for the head, the head's input rows, its carry row
};

// Lays out the activations of the ops of `g` (the main graph or the draft head's) on `device` from offset `base`:
// best-fit reuse of regions freed before an op; writes `at` (and `scratch`) on the ops. Returns where its part of
// the arena ends. The draft head's part follows the main graph's: the head runs inside a backend step, after the
// main model's step, while that step's logits still wait in the arena for the engine's sampling on the device (a
// shared region let the head overwrite them: drafting changed the output in session 10's GPU test).
int64_t layout_arena(ir::Plan& p, ir::Graph& g, const std::string& device, int64_t context, int64_t base) {
  const int64_t max_t = p.rows_per_call(), max_r = p.max_logit_rows;
  std::map<std::string, int64_t> last_use;
  for (size_t i = 0; i < g.ops.size(); ++i)
    for (const auto& a : g.ops[i].args) last_use[a] = (int64_t)i;
  for (const auto& o : g.outputs) last_use[o] = (int64_t)g.ops.size();
  struct Region {
    int64_t offset, bytes, free_after;
  };
  std::vector<Region> regions;
  int64_t arena = base;
  auto place = [&](int64_t need, int64_t op_index, int64_t until) {
    Region* best = nullptr;
    for (auto& r : regions)
      if (r.free_after < op_index && r.bytes >= need && (!best || r.bytes < best->bytes)) best = &r;
    if (!best) {
      regions.push_back({arena, need, -1});
      arena += need;
      best = &regions.back();
    }
    best->free_after = std::max(until, op_index);
    return best->offset;
  };
  for (size_t i = 0; i < g.ops.size(); ++i) {
    ir::Op& op = g.ops[i];
    if (op.s("device") != device) continue;
    // Scratch first: it is live during this op only, like its arguments.
    int64_t scratch = 0;
    if (op.kind == ir::OpKind::rmsnorm_quant) {
      scratch = align_up(max_t * op.types[0].shape.back() * 4, kAlign);
    } else if (op.kind == ir::OpKind::gdn && op.has("kernel")) {
      const kernels::GdnDims d{op.i("key_heads"), op.i("value_heads"), op.i("key_dim"), op.i("value_dim")};
      for (const auto& r : ir::parse_launch_ranges(op.s("kernel")))
        if (r.parts[0].size() == 2) scratch = align_up(kernels::gdn_workspace_bytes(d, op.i("chunk"), max_t), kAlign);
    } else if (op.kind == ir::OpKind::attention && op.has("split_ctas")) {
      const kernels::AttentionDims d{op.i("heads"), op.i("kv_heads"), op.i("head_dim")};
      const auto& c = op.ints("split_ctas");
      // A batched decode launch (decode_kernel's last range) holds every sequence's split partials at once.
      const int64_t seqs = op.has("decode_kernel") ? ir::parse_launch_ranges(op.s("decode_kernel")).back().last : 1;
      scratch = align_up(
          kernels::attention_workspace_bytes(d, {c.at(0), c.at(1), c.at(2)}, context, std::min(max_t, context), seqs),
          kAlign);
    }
    if (scratch > 0) op.set("scratch", std::vector<int64_t>{place(scratch, (int64_t)i, (int64_t)i), scratch});
    std::vector<int64_t> at;
    for (size_t k = 0; k < op.results.size(); ++k) {
      const ir::Type& t = op.types[k];
      const int64_t rows = t.shape[0] == ir::kRows ? max_r : max_t;
      const auto it = last_use.find(op.results[k]);
      at.push_back(place(value_bytes(t, rows, p.precise_rows), (int64_t)i, it == last_use.end() ? (int64_t)i : it->second));
    }
    if (!at.empty()) op.set("at", at);
  }
  return std::max<int64_t>(arena, base + kAlign);
}

}  // namespace

int64_t device_weight_bytes(const gguf::TensorInfo& t, bool cuda) {
  if (!cuda) return (int64_t)t.n_bytes;
  if (t.type == gguf::TensorType::Q8_0 && t.ne.size() == 2) {
    const int64_t rows = (int64_t)t.ne[1], cols = (int64_t)t.ne[0];
    return rows * cols + rows * (cols / 32) * 2;
  }
  // The other block types the dp4a family decodes: the file's blocks, split in two (kernels/matmul.h wq_layout).
  if (t.ne.size() == 2 && kernels::wq_dp4a_type((int64_t)t.type))
    return kernels::wq_device_bytes((int64_t)t.type, (int64_t)t.ne[1], (int64_t)t.ne[0]);
  // Other matrix types have no CUDA layout (select_backend refuses them by name before any pass asks).
  if (t.type != gguf::TensorType::F32)
    throw CompileError(fmt::format("weight '{}' is {}: the CUDA backend has no layout for it", t.name,
                                   gguf::tensor_type_name(t.type)));
  return (int64_t)t.n_elements * 4;
}

void plan_memory(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  ir::MemoryPlan& m = p.memory;
  const auto& hp = cx.params;
  const bool cuda = p.backend == "cuda";
  const int64_t slots = p.max_sequences;

  // Per device of the placement: its weights and the states of its layers.
  std::map<std::string, DeviceParts> parts;
  std::vector<std::string> order;
  for (const auto& pl : p.placement)
    if (!parts.count(pl.device)) {
      order.push_back(pl.device);
      parts[pl.device].mem.device = pl.device;
    }
  std::map<std::string, std::string> state_device;  // state -> the device of the ops using it
  m.weight_bytes = 0;
  std::map<std::string, bool> counted;
  WeightTypes weight_types;
  Stacks stacks;
  // The draft head's weights count once beside the main model's (it shares the embedding and the lm_head).
  std::vector<const ir::Op*> weight_ops;
  for (const ir::Op& op : p.graph.ops) weight_ops.push_back(&op);
  if (p.draft_tokens > 0)
    for (const ir::Op& op : p.draft.ops) weight_ops.push_back(&op);
  const size_t main_ops = p.graph.ops.size();
  m.draft_weight_bytes = 0;
  for (size_t oi = 0; oi < weight_ops.size(); ++oi) {
    const ir::Op& op = *weight_ops[oi];
    DeviceParts& d = parts.at(op.s("device"));
    const bool head = oi >= main_ops;
    for (const char* key : {"state", "k_cache", "v_cache"})
      if (op.has(key) && !head) state_device[op.s(key)] = op.s("device");
    std::vector<std::string> ws;
    for (const char* key : {"weight", "ssm_a", "dt_bias"})
      if (op.has(key)) ws.push_back(op.s(key));
    if (op.has("weights"))
      for (const auto& w : op.strs("weights")) ws.push_back(w);
    StackTally* stack = nullptr;
    if (cuda && op.kind == ir::OpKind::matmul_stack && !op.strs("formats").empty()) {
      stack = &stacks[op.s("device")][op.strs("formats")[0]];
      ++stack->stacks;
    }
    for (const auto& w : ws) {
      if (counted[op.s("device") + "/" + w]) continue;
      counted[op.s("device") + "/" + w] = true;
      const gguf::TensorInfo* t = cx.file.find_tensor(w);
      if (!t) throw CompileError(fmt::format("{}: tensor '{}' is missing", op.describe(), w));
      const int64_t b = device_weight_bytes(*t, cuda);
      d.mem.weights += b;
      if (stack) {
        ++stack->tensors;
        stack->bytes += b;
      }
      if (head) m.draft_weight_bytes += b;
      {  // a single-device CPU plan recounts below: it maps the whole file
        TypeTally& tt = weight_types[op.s("device")][gguf::tensor_type_name(t->type)];
        ++tt.tensors;
        tt.bytes += b;
      }
    }
    if (cuda && op.kind == ir::OpKind::rope) {  // inv_freq (f64)
      d.mem.weights += op.i("rope_dims") / 2 * 8;
      if (head) m.draft_weight_bytes += op.i("rope_dims") / 2 * 8;
    }
  }
  if (!cuda && order.size() == 1) {
    // The CPU maps the file: every tensor of the main model is resident (the MTP block is kept aside). Stages of a
    // multi-stage CPU plan count the tensors their ops read (the pages each touches).
    parts.at(order[0]).mem.weights = 0;
    m.draft_weight_bytes = 0;
    weight_types.clear();
    for (const auto& t : cx.file.tensors())
      if (!is_mtp_tensor(t.name, hp) || p.draft_tokens > 0) {  // the draft head reads the MTP block
        parts.at(order[0]).mem.weights += (int64_t)t.n_bytes;
        if (is_mtp_tensor(t.name, hp)) m.draft_weight_bytes += (int64_t)t.n_bytes;
        TypeTally& tt = weight_types[order[0]][gguf::tensor_type_name(t.type)];
        ++tt.tensors;
        tt.bytes += (int64_t)t.n_bytes;
      }
  }
  for (const auto& dev : order)
    if (weight_types.count(dev)) p.notes.push_back(weight_types_note(dev, weight_types.at(dev)));
  for (const auto& dev : order)
    if (stacks.count(dev)) p.notes.push_back(stacks_note(dev, stacks.at(dev)));
  for (const auto& dev : order) m.weight_bytes += parts.at(dev).mem.weights;

  m.kv_bytes_per_token = 0;
  m.state_bytes_per_sequence = 0;
  for (const auto& st : p.graph.states) {
    int64_t elems = 1;
    bool per_token = false;
    for (int64_t d : st.type.shape) {
      if (d == ir::kContext) per_token = true;
      else elems *= d;
    }
    auto it = state_device.find(st.name);
    DeviceParts& d = parts.at(it == state_device.end() ? order[0] : it->second);
    // Caches are sized per format once the KV-format pass has settled it (below).
    if (per_token) {
      d.kv_rows.push_back({st.name.rfind("k.", 0) == 0, elems});
    } else {
      const int64_t floats = cuda ? align_up(elems, 64) : elems;
      d.rec_floats += floats;
      d.state_bytes += floats * 4;
      m.state_bytes_per_sequence += elems * 4;
    }
  }
  // Speculative decoding: the MTP head's own key and value cache on the last device, and per draft token one copy
  // of the recurrent states, kept by a verify step for a rollback (docs/speculative.md).
  // CUDA: the head's cache in the plan's key and value formats (sized per format pair below, with the main caches),
  // and what the head keeps per slot on the device: the main model's hidden rows that wait for their next token
  // (at most a verify step's k + 1 and one more: runtime/cuda/draft_head.h), and, once, the buffers a step hands it
  // rows through (the step's hidden rows, the head's input rows, the row a draft step carries to the next).
  m.draft_kv_bytes_per_token = m.draft_rollback_bytes = m.draft_pending_bytes = m.draft_arena_bytes = 0;
  if (p.draft_tokens > 0) {
    DeviceParts& d = parts.at(order.back());
    for (const auto& st : p.draft.states)
      if (!st.type.shape.empty() && st.type.shape[0] == ir::kContext) {
        if (cuda) d.draft_kv_rows.push_back({st.name.rfind("k.", 0) == 0, st.type.shape.back()});
        else d.draft_kv += st.type.shape.back() * 4;
      }
    for (const auto& dev : order) parts.at(dev).draft_rollback = p.draft_tokens * parts.at(dev).state_bytes;
    m.draft_kv_bytes_per_token = d.draft_kv;
    m.draft_rollback_bytes = p.draft_tokens * m.state_bytes_per_sequence;
    if (cuda) {
      const ir::Type& hidden = p.draft.inputs.at(3).type;
      const int64_t width = hidden.shape.at(1);
      d.draft_pending = (p.draft_tokens + 2) * width * 4;
      d.draft_io = (2 * p.rows_per_call() + 1) * width * 4;
      m.draft_pending_bytes = d.draft_pending;
    }
  }
  m.snapshots_per_slot = kSnapshotsPerSlot;
  m.snapshot_bytes = 0;
  for (const auto& dev : order) m.snapshot_bytes += parts.at(dev).state_bytes;

  // Budgets: each stage's device (the placement pass's devices, in stage order); budget_bytes is the smallest.
  const std::vector<const RigDevice*> stage_devs = pipeline_devices(cx);
  if (stage_devs.size() < order.size()) throw CompileError("the placement names more stages than the rig has devices");
  // GPUs: leave the runtime its headroom (CompileOptions::gpu_memory_utilization).
  const double use = cx.options.gpu_memory_utilization;
  if (cuda && !(use > 0 && use <= 1))
    throw CompileError(fmt::format("the GPU memory fraction (--gpu-memory-utilization) must be in (0, 1], not {}", use));
  std::map<std::string, int64_t> budget_of;
  m.budget_bytes = INT64_MAX;
  double gib = 1e300;
  for (size_t s = 0; s < order.size(); ++s) {
    budget_of[order[s]] = (int64_t)(stage_devs[s]->memory_gib * 1024 * 1024 * 1024 * (cuda ? use : 1.0));
    m.budget_bytes = std::min(m.budget_bytes, budget_of[order[s]]);
    gib = std::min(gib, stage_devs[s]->memory_gib);
  }
  if (cuda)
    p.notes.push_back(fmt::format("memory: the plan may use {:.2f} of each GPU's memory ({:.1f} GiB of the smallest "
                                  "{:.1f} GiB; --gpu-memory-utilization), the rest is the runtime's headroom", use,
                                  (double)m.budget_bytes / (1 << 30), gib));
  // Bridges: two pinned host buffers per stage boundary (double-buffered), each a micro-batch of f32 rows; on each
  // side's device two buffers of the same size.
  m.bridge_host_bytes = 0;
  std::map<std::string, int64_t> bridge_width;  // per device: widths of its incoming and outgoing bridges
  for (const ir::Op& op : p.graph.ops)
    if (op.kind == ir::OpKind::bridge) {
      const int64_t w = op.types[0].shape.back();
      m.bridge_host_bytes += 2 * p.rows_per_call() * w * 4;
      bridge_width[op.s("from")] += w;
      bridge_width[op.s("to")] += w;
    }

  // Everything but the KV caches, per device, for a context length (the attention scratch grows with it).
  const int64_t max_t = p.rows_per_call(), max_r = p.max_logit_rows;
  auto fixed_parts = [&](int64_t context) {
    for (const auto& dev : order) {
      DeviceParts& d = parts.at(dev);
      d.mem.budget = budget_of.at(dev);
      d.mem.states = slots * (d.state_bytes + d.draft_rollback + d.draft_pending);
      d.mem.snapshots = slots * m.snapshots_per_slot * d.state_bytes;
      if (dev == order[0]) d.mem.snapshots += std::max<int64_t>(0, p.prefix_cache.budget_bytes);
      if (cuda) {
        d.mem.arena = layout_arena(p, p.graph, dev, context, 0);
        if (p.draft_tokens > 0 && dev == order.back()) {
          const int64_t end = layout_arena(p, p.draft, dev, context, d.mem.arena);
          m.draft_arena_bytes = end - d.mem.arena;
          d.mem.arena = end;
        }
        // tokens, positions; output rows, argmax; a stage's bridge buffers (two in, two out); the head's rows
        d.mem.io = 2 * max_t * 4 + 2 * max_r * 4 + 2 * max_t * bridge_width[dev] * 4 + d.draft_io;
        // the batched decode kernels' tables: per slot its recurrent states and each graph state's cache (device
        // pointers), and per step the slots and positions of its sequences (int32, two arrays of `slots`)
        d.mem.io += slots * (1 + (int64_t)p.graph.states.size()) * 8 + 2 * slots * 4;
        d.mem.sampling = 0;
      } else {
        // The CPU reference keeps every value of a step.
        int64_t act = 0;
        for (const auto& op : p.graph.ops)
          for (const auto& t : op.types) {
            if (op.s("device") != dev) continue;
            int64_t e = 1;
            for (int64_t x : t.shape) e *= x < 0 ? max_t : x;
            act += e * 4;
          }
        d.mem.arena = act;
      }
    }
    if (cuda) {
      DeviceParts& last = parts.at(order.back());
      const int64_t vocab_rows = hp.vocab;
      last.mem.sampling =
          kernels::top_k_buffers(std::min(p.vocab_real, vocab_rows), kernels::top_k_rows(max_r, slots, p.draft_tokens),
                                kTopKAdjustPerRow).total();
    }
  };
  fixed_parts(std::max<int64_t>(1, hp.context_length));
  // The shared prefix cache (plan_prefix_cache): held on the first device (a CPU pipeline's stages share the host),
  // beside the per-slot snapshots, taken on demand like them. Its default budget is 16 snapshots per slot (sized
  // here, where a snapshot's bytes are known), at most a quarter of what that device has left for the KV caches,
  // so that it never decides the context; with less than one snapshot's room there is no shared cache.
  if (p.prefix_cache.budget_bytes < 0) {
    const DeviceParts& d = parts.at(order[0]);
    const int64_t left = d.mem.budget - (d.mem.weights + d.mem.arena + d.mem.io + d.mem.sampling + d.mem.states +
                                         d.mem.snapshots);
    p.prefix_cache.budget_bytes = std::min<int64_t>(16 * slots * m.snapshot_bytes, std::max<int64_t>(0, left) / 4);
    if (p.prefix_cache.budget_bytes < 2 * m.snapshot_bytes) {
      p.prefix_cache.budget_bytes = 0;
      p.prefix_cache.mode = "per-slot";
      p.notes.push_back("prefix cache: no room for a shared cache on this rig's memory (--prefix-cache-mib sets one); "
                        "each slot reuses its own prompt-end snapshots");
    }
    fixed_parts(std::max<int64_t>(1, hp.context_length));
  }
  // The KV-format pass's trade table (the context each format pair allows on each device), then its choice.
  // The CPU holds f16 caches as fp32 values and quantized ones in the GPU's layout (kernels/kv_format.h).
  auto draft_kv_bytes = [&](const DeviceParts& d, kernels::KvPair pr) {
    int64_t b = d.draft_kv;
    for (const auto& [key, width] : d.draft_kv_rows) b += kernels::kv_row_bytes(key ? pr.k : pr.v, width, !cuda);
    return b;
  };
  auto kv_bytes = [&](const DeviceParts& d, kernels::KvPair pr) {
    int64_t b = 0;
    for (const auto& [key, width] : d.kv_rows) b += kernels::kv_row_bytes(key ? pr.k : pr.v, width, !cuda);
    return b + draft_kv_bytes(d, pr);
  };
  constexpr int64_t kNoLimit = int64_t{1} << 40;  // a device without caches does not limit the context
  m.kv_fits.clear();
  for (const kernels::KvPair& pr : kv_table_pairs(cx)) {
    ir::KvFit f{kernels::kv_pair_name(pr), 0, kNoLimit, {}};
    for (const auto& dev : order) {
      const DeviceParts& d = parts.at(dev);
      const int64_t b = kv_bytes(d, pr);
      const int64_t left = d.mem.budget - (d.mem.weights + d.mem.arena + d.mem.io + d.mem.sampling + d.mem.states +
                                           d.mem.snapshots);
      const int64_t c = b > 0 ? std::min(kNoLimit, std::max<int64_t>(0, left) / (b * slots)) : kNoLimit;
      f.bytes_per_token += b;
      f.device_contexts.push_back(c);
      f.context = std::min(f.context, c);
    }
    m.kv_fits.push_back(f);
  }
  settle_kv_format(cx);
  const kernels::KvPair kv{*kernels::parse_kv_format(p.k_dtype), *kernels::parse_kv_format(p.v_dtype)};
  m.kv_bytes_per_token = 0;
  for (const auto& dev : order) {
    DeviceParts& d = parts.at(dev);
    d.kv_bytes_per_token = kv_bytes(d, kv);
    m.kv_bytes_per_token += d.kv_bytes_per_token - draft_kv_bytes(d, kv);
    if (p.draft_tokens > 0 && dev == order.back()) m.draft_kv_bytes_per_token = draft_kv_bytes(d, kv);
  }
  int64_t fits = INT64_MAX;
  for (const auto& dev : order) {
    const DeviceParts& d = parts.at(dev);
    const int64_t fixed = d.mem.weights + d.mem.arena + d.mem.io + d.mem.sampling + d.mem.states + d.mem.snapshots;
    const int64_t free_bytes = d.mem.budget - fixed;
    const int64_t per_token = std::max<int64_t>(1, d.kv_bytes_per_token * slots);
    if (free_bytes <= per_token * 256)
      throw CompileError(fmt::format("the model does not fit: on {} weights {:.2f} GiB + state, activations and buffers "
                                     "need {:.2f} GiB of a {:.2f} GiB budget", dev, (double)d.mem.weights / (1 << 30),
                                     (double)fixed / (1 << 30), (double)d.mem.budget / (1 << 30)));
    fits = std::min(fits, free_bytes / per_token);
  }
  int64_t ctx = std::min<int64_t>(fits, hp.context_length);
  if (cx.options.context_length > 0) {
    if (cx.options.context_length > fits)
      throw CompileError(fmt::format("context length {} x {} sequences does not fit: at most {} tokens per sequence",
                                     cx.options.context_length, slots, fits));
    ctx = cx.options.context_length;
    if (ctx > hp.context_length)
      p.notes.push_back(fmt::format("warning: context length {} is above the {} tokens the model was trained for "
                                    "({}.context_length): positions beyond it are extrapolated and output quality may "
                                    "degrade", ctx, hp.context_length, hp.arch));
  }
  p.context_length = ctx;
  fixed_parts(ctx);
  m.activation_bytes = 0;
  m.devices.clear();
  for (const auto& dev : order) {
    DeviceParts& d = parts.at(dev);
    d.mem.states += slots * d.kv_bytes_per_token * ctx;
    d.mem.total = d.mem.weights + d.mem.arena + d.mem.io + d.mem.sampling + d.mem.states + d.mem.snapshots;
    if (d.mem.total > d.mem.budget)
      throw CompileError(fmt::format("the plan needs {:.2f} GiB on {}, more than its {:.2f} GiB budget",
                                     (double)d.mem.total / (1 << 30), dev, (double)d.mem.budget / (1 << 30)));
    m.activation_bytes = std::max(m.activation_bytes, d.mem.arena);
    m.devices.push_back(d.mem);
  }
  if (cuda) p.graph.set_attr("top_k_adjust_per_row", kTopKAdjustPerRow);
  if (p.pipeline_micro_batch > 0 && p.pipeline_micro_batch < p.max_batch_tokens &&
      p.pipeline_micro_batch < ir::pipeline_min_micro_batch(p))
    throw CompileError(fmt::format("the pipeline micro-batch (--micro-batch) of {} tokens is below {}: a short last "
                                   "piece of a prefill takes whole 64-token chunks from the piece before it",
                                   p.pipeline_micro_batch, ir::pipeline_min_micro_batch(p)));
  p.notes.push_back(fmt::format("memory: weights {:.1f} MiB, kv {} B/token, state {:.1f} MiB/sequence, activations "
                                "{:.1f} MiB, snapshots {} x {:.1f} MiB per slot; context {} tokens x {} sequences "
                                "(model max {}, fits {})",
                                (double)m.weight_bytes / (1 << 20), m.kv_bytes_per_token,
                                (double)m.state_bytes_per_sequence / (1 << 20), (double)m.activation_bytes / (1 << 20),
                                m.snapshots_per_slot, (double)m.snapshot_bytes / (1 << 20), ctx, slots,
                                hp.context_length, fits));
  if (p.draft_tokens > 0)
    p.notes.push_back(fmt::format("memory: drafting holds per sequence the MTP head's cache ({} B/token) and {} "
                                  "rollback copies of the recurrent states ({:.1f} MiB), counted in the states above",
                                  m.draft_kv_bytes_per_token, p.draft_tokens,
                                  (double)m.draft_rollback_bytes / (1 << 20)));
  if (p.draft_tokens > 0 && cuda)
    p.notes.push_back(fmt::format("memory: the MTP head on {}: its own weights {:.2f} MiB (the embedding and lm_head "
                                  "are the main model's), its activations {:.2f} MiB sharing the arena with the main "
                                  "graph's (they never run at once), {} B per sequence of hidden rows waiting for it "
                                  "(in the states), {} B of step buffers (in io)",
                                  order.back(), (double)m.draft_weight_bytes / (1 << 20),
                                  (double)m.draft_arena_bytes / (1 << 20), m.draft_pending_bytes,
                                  parts.at(order.back()).draft_io));
  if (p.prefix_cache.budget_bytes > 0)
    p.notes.push_back(fmt::format("prefix cache: {:.1f} MiB shared by all slots on {} (KV spans + snapshots, LRU; "
                                  "--prefix-cache-mib), cut every {} tokens and at message markers: {}",
                                  (double)p.prefix_cache.budget_bytes / (1 << 20), order[0], p.prefix_cache.chunk,
                                  p.prefix_cache.markers));
}

}  // namespace qrig::compiler::passes
