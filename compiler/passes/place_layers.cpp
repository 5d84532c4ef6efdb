// Pass: layer-to-device placement. One device gets every layer; several devices (GPUs, or CPU "devices" of a
// test rig) form a pipeline of contiguous layer ranges ("stages") joined by bridges: only the residual stream
// (fp32 rows) crosses, through pinned host memory. Stages are balanced by a cost model of each layer's time
// (prefill: matmul MACs / the device's dp4a rate, plus attention at a typical depth; decode: bytes read per token /
// its bandwidth, GDN state traffic included) subject to memory: every stage's weights, its layers' KV and GDN state
// for every slot at the context, activations and a workspace allowance must fit its device's budget. The token
// embedding lives on the first stage, the output norm and lm_head on the last. With no --ctx, the placement is made
// for the largest context that fits; when nothing fits, the error says how many of these devices would.
// Every op is tagged with its device; a `bridge` op is inserted where the residual stream changes device.
#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "compiler/passes/passes.h"

namespace qrig::compiler::passes {

namespace {

constexpr int64_t kWorkspaceAllowance = 64ll << 20;  // scratch of the GDN and attention kernels, per stage
constexpr int64_t kTypicalDepth = 8192;               // decode cost model: KV read at half of min(ctx, this)

struct LayerCost {
  int64_t weight_bytes = 0;      // as the device holds them
  int64_t macs_per_token = 0;    // matmul multiply-adds per token
  int64_t state_bytes = 0;       // per sequence, non-positional (conv + GDN)
  int64_t kv_bytes_per_token = 0;
  int64_t act_bytes_per_row = 0; // the layer's op results, f32, per token row (an upper bound of what is live)
  int64_t attn_macs_per_depth = 0;  // per token and context position (attention layers)
};

struct Cost {  // of one stage on one device
  double prefill_s = 0, decode_s = 0;
  int64_t bytes = 0;
};

bool is_layer_tensor(const std::string& name, int64_t L) { return name.rfind(fmt::format("blk.{}.", L), 0) == 0; }

// What the stage [a, b] of an n-layer model needs on a device of this kind (first/last carry the embedding and head).
struct Model {
  std::vector<LayerCost> layers;
  int64_t embed_bytes = 0, head_bytes = 0, head_macs = 0, head_act_per_row = 0, sampling_bytes = 0;
  int64_t slots = 1, snapshots_per_slot = 4, rows = 512, logit_rows = 1;
  int64_t n() const { return (int64_t)layers.size(); }

  int64_t bytes(int64_t a, int64_t b, int64_t ctx) const {
    int64_t w = 0, st = 0, kv = 0, act = 0;
    for (int64_t L = a; L <= b; ++L) {
      const LayerCost& c = layers[(size_t)L];
      w += c.weight_bytes;
      st += c.state_bytes;
      kv += c.kv_bytes_per_token;
      act = std::max(act, c.act_bytes_per_row * rows);
    }
    if (a == 0) w += embed_bytes;
    if (b == n() - 1) {
      w += head_bytes + sampling_bytes;
      act = std::max(act, head_act_per_row * logit_rows);
    }
    return w + slots * (1 + snapshots_per_slot) * st + slots * kv * ctx + act + kWorkspaceAllowance;
  }
};

Cost stage_cost(const Model& m, int64_t a, int64_t b, int64_t ctx, const RigDevice& d) {
  const double bw = d.mem_bw_gbps > 0 ? d.mem_bw_gbps * 1e9 : 1e11;  // unmeasured: any constant (only ratios count)
  const double rate = d.dp4a_tops > 0 ? d.dp4a_tops * 1e12 : 1e13;
  const int64_t depth = std::min(ctx, kTypicalDepth) / 2;
  Cost c;
  for (int64_t L = a; L <= b; ++L) {
    const LayerCost& l = m.layers[(size_t)L];
    c.prefill_s += 2.0 * (double)(l.macs_per_token + l.attn_macs_per_depth * depth) / rate;
    c.decode_s += (double)(l.weight_bytes + 2 * l.state_bytes + l.kv_bytes_per_token * depth) / bw;
  }
  if (b == m.n() - 1) {
    c.prefill_s += 2.0 * (double)m.head_macs / rate / (double)std::max<int64_t>(1, m.rows);  // one row per step
    c.decode_s += (double)m.head_bytes / bw;
  }
  c.bytes = m.bytes(a, b, ctx);
  return c;
}

// Contiguous split of the layers over `devs` minimising the largest stage's share of the prefill time plus its
// share of the decode time, every stage fitting its budget at `ctx`. Empty when no split fits.
std::vector<std::pair<int64_t, int64_t>> best_split(const Model& m, const std::vector<const RigDevice*>& devs,
                                                    const std::vector<int64_t>& budgets, int64_t ctx) {
  const int64_t n = m.n(), S = (int64_t)devs.size();
  if (S > n) return {};
  double total_p = 0, total_d = 0;
  {
    const Cost all = stage_cost(m, 0, n - 1, ctx, *devs[0]);
    total_p = std::max(all.prefill_s, 1e-30);
    total_d = std::max(all.decode_s, 1e-30);
  }
  auto score = [&](int64_t a, int64_t b, int64_t s) {
    const Cost c = stage_cost(m, a, b, ctx, *devs[(size_t)s]);
    if (c.bytes > budgets[(size_t)s]) return (double)INFINITY;
    return c.prefill_s / total_p + c.decode_s / total_d;
  };
  // best[s][k]: the smallest bottleneck placing layers 0..k-1 on stages 0..s-1 (every stage non-empty).
  std::vector<std::vector<double>> best((size_t)S + 1, std::vector<double>((size_t)n + 1, INFINITY));
  std::vector<std::vector<int64_t>> from((size_t)S + 1, std::vector<int64_t>((size_t)n + 1, -1));
  best[0][0] = 0;
  for (int64_t s = 1; s <= S; ++s)
    for (int64_t k = s; k <= n - (S - s); ++k)
      for (int64_t j = s - 1; j < k; ++j) {
        if (!std::isfinite(best[(size_t)s - 1][(size_t)j])) continue;
        const double v = std::max(best[(size_t)s - 1][(size_t)j], score(j, k - 1, s - 1));
        if (v < best[(size_t)s][(size_t)k]) {
          best[(size_t)s][(size_t)k] = v;
          from[(size_t)s][(size_t)k] = j;
        }
      }
  if (!std::isfinite(best[(size_t)S][(size_t)n])) return {};
  std::vector<std::pair<int64_t, int64_t>> ranges((size_t)S);
  int64_t k = n;
  for (int64_t s = S; s >= 1; --s) {
    const int64_t j = from[(size_t)s][(size_t)k];
    ranges[(size_t)s - 1] = {j, k - 1};
    k = j;
  }
  return ranges;
}

Model model_costs(const CompileContext& cx) {
  const ir::Plan& p = cx.plan;
  const auto& hp = cx.params;
  const bool cuda = p.backend == "cuda";
  Model m;
  m.layers.resize((size_t)hp.n_layer);
  m.slots = p.max_sequences;
  m.snapshots_per_slot = kSnapshotsPerSlot;
  m.rows = p.pipeline_micro_batch > 0 ? p.pipeline_micro_batch : p.max_batch_tokens;
  m.logit_rows = p.max_logit_rows;
  for (const auto& t : cx.file.tensors()) {
    const int64_t b = device_weight_bytes(t, cuda);
    const int64_t macs = t.ne.size() == 2 ? (int64_t)t.n_elements : 0;
    if (t.name == "token_embd.weight") {
      m.embed_bytes += b;
      continue;
    }
    if (t.name == "output.weight" || t.name == "output_norm.weight") {
      m.head_bytes += b;
      m.head_macs += macs;
      continue;
    }
    for (int64_t L = 0; L < hp.n_layer; ++L)
      if (is_layer_tensor(t.name, L)) {
        m.layers[(size_t)L].weight_bytes += b;
        m.layers[(size_t)L].macs_per_token += macs;
        break;
      }
  }
  // Caches at the most compact format pair the KV pass may choose (it settles the pair once the memory is laid
  // out; placing for a wider one would refuse contexts a narrower pair fits).
  int64_t kv_row = 0;  // bytes of one position's keys + values in one attention layer
  for (const auto& pr : kv_candidates(cx)) {
    const int64_t b = kernels::kv_row_bytes(pr.k, hp.n_head_kv * hp.head_dim, !cuda) +
                      kernels::kv_row_bytes(pr.v, hp.n_head_kv * hp.head_dim, !cuda);
    kv_row = kv_row == 0 ? b : std::min(kv_row, b);
  }
  if (kv_row == 0) kv_row = 2 * hp.n_head_kv * hp.head_dim * (cuda ? 2 : 4);
  for (int64_t L = 0; L < hp.n_layer; ++L) {
    LayerCost& c = m.layers[(size_t)L];
    if (hp.is_full_attention(L)) {
      c.kv_bytes_per_token = kv_row;
      c.attn_macs_per_depth = 2 * hp.n_head * hp.head_dim;
    } else {
      c.state_bytes = ((hp.conv_kernel - 1) * hp.conv_dim() + hp.ssm_v_heads * hp.ssm_head_dim * hp.ssm_head_dim) * 4;
    }
  }
  for (const ir::Op& op : p.graph.ops) {
    const int64_t L = op.i("layer");
    int64_t w = 0;
    for (const auto& t : op.types) w += t.shape.empty() ? 0 : t.shape.back();
    if (L >= 0 && L < hp.n_layer) m.layers[(size_t)L].act_bytes_per_row += w * 4;
    else if (L >= hp.n_layer) m.head_act_per_row += w * 4;
  }
  if (cuda) m.sampling_bytes = 64ll << 20;  // top-k candidate buffers (plan_memory sizes them exactly)
  return m;
}

void tag_devices(ir::Plan& p, int64_t n_layer) {
  for (auto& op : p.graph.ops) {
    const int64_t L = op.i("layer");
    std::string dev = L < 0 ? p.placement.front().device : p.placement.back().device;
    if (L >= 0 && L < n_layer)
      for (const auto& pl : p.placement)
        if (L >= pl.first_layer && L <= pl.last_layer) dev = pl.device;
    op.set("device", dev);
  }
}

// Where the residual stream enters a stage after the first, a bridge op moves it from the previous stage: the
// value the previous stage's last layer made (its `x<first>`), renamed for its readers on the new stage.
void insert_bridges(ir::Plan& p) {
  ir::Graph& g = p.graph;
  for (size_t s = 1; s < p.placement.size(); ++s) {
    const ir::Placement& prev = p.placement[s - 1];
    const ir::Placement& cur = p.placement[s];
    const std::string from_value = fmt::format("x{}", cur.first_layer);
    size_t at = g.ops.size();
    for (size_t i = 0; i < g.ops.size(); ++i)
      if (g.ops[i].s("device") == cur.device) {
        at = i;
        break;
      }
    if (at == g.ops.size()) throw CompileError(fmt::format("placement: stage {} has no ops", cur.device));
    ir::Type type;
    bool found = false;
    for (const ir::Op& op : g.ops)
      for (size_t k = 0; k < op.results.size(); ++k)
        if (op.results[k] == from_value) type = op.types[k], found = true;
    if (!found) throw CompileError(fmt::format("placement: no value %{} to bridge into {}", from_value, cur.device));
    const std::string to_value = fmt::format("{}.stage{}", from_value, s);  // the stage's copy
    for (size_t i = at; i < g.ops.size(); ++i)
      for (auto& a : g.ops[i].args)
        if (a == from_value) a = to_value;
    ir::Op br;
    br.kind = ir::OpKind::bridge;
    br.args = {from_value};
    br.results = {to_value};
    br.types = {type};
    br.attrs = {{"from", prev.device}, {"to", cur.device}, {"layer", cur.first_layer}, {"device", cur.device}};
    g.ops.insert(g.ops.begin() + (ptrdiff_t)at, std::move(br));
  }
}

std::string gib(int64_t b) { return fmt::format("{:.2f} GiB", (double)b / (1 << 30)); }

}  // namespace

std::vector<const RigDevice*> pipeline_devices(const CompileContext& cx) {
  const bool cuda = cx.plan.backend == "cuda";
  std::vector<const RigDevice*> devs;
  for (const auto& d : cx.rig.devices) {
    if ((d.kind == "cuda") != cuda) continue;
    if (cuda && cx.options.max_gpus > 0 && (int64_t)devs.size() >= cx.options.max_gpus) break;
    devs.push_back(&d);
  }
  if ((int64_t)devs.size() > cx.params.n_layer) devs.resize((size_t)cx.params.n_layer);
  return devs;
}

void place_layers(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  const auto& hp = cx.params;
  const int64_t n = hp.n_layer;
  const bool cuda = p.backend == "cuda";
  p.placement.clear();

  // The devices of the backend's kind, in rig order (at most --gpus of the GPUs); a cuda entry's ordinal is its
  // CUDA device (by default its position among the rig's cuda devices).
  std::vector<const RigDevice*> devs = pipeline_devices(cx);
  if (devs.empty()) throw CompileError("rig has no device for the chosen backend");
  int64_t rig_count = 0;
  std::vector<int64_t> ordinals;
  for (const auto& d : cx.rig.devices)
    if ((d.kind == "cuda") == cuda) {
      if (ordinals.size() < devs.size() && &d == devs[ordinals.size()])
        ordinals.push_back(cuda ? (d.ordinal >= 0 ? d.ordinal : rig_count) : -1);
      ++rig_count;
    }
  const int64_t S = (int64_t)devs.size();

  // Micro-batches of the prefill pipeline: multiples of the GDN chunk (so the chunked GDN sees the same chunks as
  // on one device), and above the two-plane row count unless every matmul uses two planes (so each matmul input
  // is quantized as in the one-device plan).
  p.pipeline_micro_batch = 0;
  if (S > 1) {
    int64_t m = cx.options.micro_batch > 0 ? cx.options.micro_batch : cuda ? 512 : 128;
    if (m % 64 != 0)
      throw CompileError(fmt::format("the pipeline micro-batch (--micro-batch) must be a multiple of 64 tokens "
                                     "(the GDN chunk), not {}", m));
    m = std::min(m, p.max_batch_tokens);  // a step no longer than one micro-batch is not cut at all
    p.pipeline_micro_batch = m;
  }

  const Model model = model_costs(cx);
  const double use = cuda ? cx.options.gpu_memory_utilization : 1.0;
  std::vector<int64_t> budgets;
  for (const RigDevice* d : devs) budgets.push_back((int64_t)(d->memory_gib * 1024 * 1024 * 1024 * use));

  // The context the placement is made for: the one asked, or the largest (in steps of 256) that some split fits.
  const int64_t model_ctx = std::max<int64_t>(1, hp.context_length);
  int64_t ctx = cx.options.context_length > 0 ? cx.options.context_length : model_ctx;
  std::vector<std::pair<int64_t, int64_t>> ranges = best_split(model, devs, budgets, ctx);
  if (ranges.empty() && cx.options.context_length <= 0) {
    int64_t lo = 0, hi = ctx;  // best_split(lo) fits (lo = 0: unknown), best_split(hi) does not
    for (int64_t c = 256; c < hi; c = std::min(hi, c * 2)) {
      if (best_split(model, devs, budgets, c).empty()) {
        hi = c;
        break;
      }
      lo = c;
      if (c * 2 >= hi) break;
    }
    while (lo > 0 && hi - lo > 256) {
      const int64_t mid = (lo + hi) / 2;
      (best_split(model, devs, budgets, mid).empty() ? hi : lo) = mid;
    }
    if (lo > 0) {
      ctx = lo;
      ranges = best_split(model, devs, budgets, ctx);
    }
  }
  if (ranges.empty()) {
    const int64_t at = cx.options.context_length > 0 ? ctx : 256;
    int64_t need = 0;
    for (int64_t k = S + 1; k <= std::min<int64_t>(n, 64) && !need; ++k) {
      std::vector<const RigDevice*> more(devs);
      std::vector<int64_t> more_b(budgets);
      while ((int64_t)more.size() < k) more.push_back(devs.back()), more_b.push_back(budgets.back());
      if (!best_split(model, more, more_b, at).empty()) need = k;
    }
    const RigDevice& d = *devs.back();
    const std::string kind = cuda ? fmt::format("{:g} GiB GPUs ({})", d.memory_gib, d.name)
                                  : fmt::format("{:g} GiB cpu devices", d.memory_gib);
    const std::string allowed =
        cuda && cx.options.max_gpus > 0 && cx.options.max_gpus < rig_count
            ? fmt::format("{} allowed by --gpus {}", S, cx.options.max_gpus)
            : fmt::format("the rig has {}", S);
    const std::string what = fmt::format("{} ({} of weights) at ctx {} with {} sequence(s)", hp.name.empty() ? hp.arch : hp.name,
                                         gib(model.bytes(0, n - 1, 0) - kWorkspaceAllowance), at, p.max_sequences);
    if (need)
      throw CompileError(fmt::format("the model does not fit: {} needs {} of these {}; {}", what, need, kind, allowed));
    throw CompileError(fmt::format("the model does not fit: {} does not fit on any number of these {}", what, kind));
  }

  for (int64_t s = 0; s < S; ++s) {
    ir::Placement pl;
    pl.device = cuda ? fmt::format("cuda:{}", s) : S == 1 ? "cpu" : fmt::format("cpu:{}", s);
    pl.ordinal = ordinals[(size_t)s];
    pl.first_layer = ranges[(size_t)s].first;
    pl.last_layer = ranges[(size_t)s].second;
    const Cost c = stage_cost(model, pl.first_layer, pl.last_layer, ctx, *devs[(size_t)s]);
    pl.prefill_us_per_token = c.prefill_s * 1e6;
    pl.decode_us_per_token = c.decode_s * 1e6;
    p.placement.push_back(pl);
  }
  // Decode groups: a group pays for itself once its compute time reaches the time to read the stage's weights.
  if (S > 1) {
    double ratio = 1;
    for (const auto& pl : p.placement)
      if (pl.prefill_us_per_token > 0) ratio = std::max(ratio, pl.decode_us_per_token / pl.prefill_us_per_token);
    p.pipeline_decode_group_rows = cuda ? std::clamp<int64_t>((int64_t)std::ceil(ratio), 1, 4096) : 1;
  }
  std::string s = "placement:";
  for (const auto& pl : p.placement)
    s += fmt::format(" {}{} layers {}-{} (cost model: prefill {:.2f} us/token, decode {:.1f} us/token);", pl.device,
                     cuda && pl.ordinal != (&pl - p.placement.data()) ? fmt::format(" (GPU {})", pl.ordinal) : "",
                     pl.first_layer, pl.last_layer, pl.prefill_us_per_token, pl.decode_us_per_token);
  if (S == 1) {
    s += " one device";
  } else {
    s += fmt::format(" a pipeline of {} stages balanced by the cost model within each device's memory at ctx {}; the "
                     "token embedding on the first stage, the output head on the last; the residual stream crosses "
                     "as f32 rows through pinned host memory; prefill in micro-batches of {} tokens; decode steps in "
                     "groups of at least {} sequences ({})",
                     S, ctx, p.pipeline_micro_batch, p.pipeline_decode_group_rows,
                     cuda ? "where a group's compute time reaches the time to read a stage's weights"
                          : "the CPU runs each sequence on its own");
  }
  if (cuda && cx.options.max_gpus > 0) s += fmt::format("; at most {} GPU(s) by request", cx.options.max_gpus);
  p.notes.push_back(s);
  tag_devices(p, n);
  insert_bridges(p);
}

}  // namespace qrig::compiler::passes
