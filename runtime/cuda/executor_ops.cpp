// The CUDA executor's op tables: per op kind, what binding loads (the kernels its `kernel` attribute names per
// range of rows, its weights, its arena places) and what a step launches. A new op kind is one row in each
// (tests/cuda/test_cuda_layout.cpp checks both are complete). Nothing here chooses a kernel: every launch is
// the plan's variant for the op's number of rows.
#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "ir/kernel_attr.h"
#include "kernels/matmul.h"
#include "runtime/cuda/executor_impl.h"

namespace qrig::runtime {

const cuda::LoadedKernel& CudaStep::kernel_for(int64_t n) const {
  for (size_t i = 0; i < ranges.size(); ++i)
    if (n >= ranges[i].first && n <= ranges[i].last) return *kernel_of_range.at(i);
  throw RuntimeError(fmt::format("{}: {} rows, outside the plan's kernel ranges", b->op->describe(), n));
}

int CudaStep::batched_range_for(int64_t n) const {
  for (size_t i = 0; i < decode_ranges.size(); ++i)
    if (n >= decode_ranges[i].first && n <= decode_ranges[i].last) return decode_batched[i] ? (int)i : -1;
  return -1;
}

namespace {

using ir::OpKind;
using Impl = CudaExecutor::Impl;

// ---- binding: kernels (no device needed, given a loader) -------------------------------------------------

void bind_ranges(CudaStep& s) {
  const ir::Op& op = *s.b->op;
  if (!op.has("kernel")) throw RuntimeError(fmt::format("{}: names no kernel (recompile the plan)", op.describe()));
  s.ranges = ir::parse_launch_ranges(op.s("kernel"));
}

// Ops launching one kernel per range: load them, each of the expected template.
void bind_single(KernelBinder& kb, CudaStep& s, const char* kernel) {
  bind_ranges(s);
  for (const auto& r : s.ranges) {
    if (r.parts.size() != 1 || r.parts[0].size() != 1)
      throw RuntimeError(fmt::format("{}: rows {}-{} must name one {} variant", s.b->op->describe(), r.first, r.last, kernel));
    const cuda::LoadedKernel* k = kb.load(r.parts[0][0]);
    if (k->variant.kernel != kernel)
      throw RuntimeError(fmt::format("{}: the plan names {} where a {} variant runs", s.b->op->describe(), k->variant.name,
                                     kernel));
    s.kernel_of_range.push_back(k);
  }
}

// Planes of the q8 value `value` for n rows: those of its producer's kernel for n rows.
int64_t producer_planes(const KernelBinder& kb, int value, int64_t n) {
  for (const CudaStep& p : kb.steps)
    if (p.b && std::find(p.b->results.begin(), p.b->results.end(), value) != p.b->results.end())
      return p.kernel_for(n).variant.param(p.b->kind == OpKind::rmsnorm_quant ? "q" : "p");
  throw RuntimeError(fmt::format("no producer of %{}", kb.graph.values[(size_t)value].name));
}

// A matmul's kernels must read the planes its input was quantized to, at every row count where either changes.
void check_planes(const KernelBinder& kb, const CudaStep& s, const cuda::MatmulKernels& mm) {
  std::set<int64_t> cuts;
  for (const auto& r : s.ranges) cuts.insert({r.first, r.last});
  for (const CudaStep& p : kb.steps)  // its producer (the q8 value is add_rmsnorm_quant's second result)
    if (p.b && std::find(p.b->results.begin(), p.b->results.end(), s.b->args[0]) != p.b->results.end())
      for (const auto& r : p.ranges) cuts.insert({r.first, r.last});
  for (int64_t n : cuts) {
    if (n < mm.min_rows() || n > mm.max_rows()) continue;
    const int64_t want = producer_planes(kb, s.b->args[0], n), got = mm.planes_for(n);
    if (want != got)
      throw RuntimeError(fmt::format("{}: at {} rows its kernel reads {} activation plane(s), its input has {}",
                                     s.b->op->describe(), n, got, want));
  }
}

// The embedding's kernel follows the table's type: embed_q8_0, or embed_wq for the other block types (its launcher
// checks the table is of the variant's type).
// The op's decode_kernel attribute (choose_kernels.cpp): one sequence runs the kernels its `kernel` attribute names
// for one token (its own launches), 2 or more sequences the batched variants (b1) of `kernel`, checked here: conv
// taps, the KV write's formats; gdn and attention check their dims in their launcher / kernel set.
kernels::KvPair cache_pair(const KernelBinder& kb, const CudaStep& s);
void bind_decode(KernelBinder& kb, CudaStep& s, const char* kernel) {
  const ir::Op& op = *s.b->op;
  if (!op.has("decode_kernel")) return;
  s.decode_ranges = ir::parse_launch_ranges(op.s("decode_kernel"));
  const bool att = s.b->kind == OpKind::attention;
  const std::vector<ir::LaunchRange> own = ir::parse_launch_ranges(op.s("kernel"));
  for (const ir::LaunchRange& r : s.decode_ranges) {
    if (r.parts.size() != 1 || r.parts[0].size() != (att ? 2u : 1u))
      throw RuntimeError(fmt::format("{}: decode_kernel {}-{} must name {}", op.describe(), r.first, r.last,
                                     att ? "a decode kernel and its merge" : "one kernel"));
    const std::vector<std::string>& names = r.parts[0];
    const bool batched = r.first >= 2;
    if (!batched) {  // one sequence: its own kernels, as `kernel` names them for one token
      const ir::LaunchRange* one = ir::launch_range_for(own, 1);
      if (r.last != 1 || !one || one->parts.size() != 1 || one->parts[0] != names)
        throw RuntimeError(fmt::format("{}: decode_kernel for one sequence must name the kernels of one token",
                                       op.describe()));
      s.decode_batched.push_back(false);
      s.decode_kernel_of_range.push_back(nullptr);
      s.decode_att_of_range.push_back(nullptr);
      continue;
    }
    s.decode_batched.push_back(true);
    if (att) {
      const cuda::AttentionDims d{op.i("heads"), op.i("kv_heads"), op.i("head_dim")};
      const auto c = op.ints("split_ctas");
      kb.batched_attentions.push_back(std::make_unique<cuda::BatchedDecodeAttention>(
          kb.loader, d, kb.plan.context_length, kernels::AttentionCtas{c.at(0), c.at(1), c.at(2)}, names[0], names[1],
          cache_pair(kb, s), op.i("layer")));
      const bool q8 = kb.batched_attentions.back()->decode_variant().kernel == "attn_decode_dp4a";
      if (q8 != (op.has("query_int8_tokens") && op.i("query_int8_tokens") >= 1))
        throw RuntimeError(fmt::format("{}: the batched decode kernel {} and query_int8_tokens disagree on the "
                                       "query's precision", op.describe(), names[0]));
      s.decode_kernel_of_range.push_back(nullptr);
      s.decode_att_of_range.push_back(kb.batched_attentions.back().get());
      continue;
    }
    const cuda::LoadedKernel* k = kb.load(names[0]);
    if (k->variant.kernel != kernel || k->variant.param("b") != 1)
      throw RuntimeError(fmt::format("{}: decode steps of {}-{} sequences name {}, not a batched {}", op.describe(),
                                     r.first, r.last, k->variant.name, kernel));
    if (s.b->kind == OpKind::conv1d_silu && k->variant.param("k") != s.taps)
      throw RuntimeError(fmt::format("{}: {} does not have {} taps", op.describe(), k->variant.name, s.taps));
    if (s.b->kind == OpKind::kv_write && k->variant != kernels::kv_write_batched_variant(cache_pair(kb, s)))
      throw RuntimeError(fmt::format("{}: the plan names {} for {} caches", op.describe(), k->variant.name,
                                     kernels::kv_pair_name(cache_pair(kb, s))));
    s.decode_kernel_of_range.push_back(k);
    s.decode_att_of_range.push_back(nullptr);
  }
}

void kernels_embed(KernelBinder& kb, CudaStep& s) {
  bind_ranges(s);
  const bool wq = !s.ranges.empty() && !s.ranges[0].parts.empty() && !s.ranges[0].parts[0].empty() &&
                  s.ranges[0].parts[0][0].rfind("embed_wq_", 0) == 0;
  s.ranges.clear();
  bind_single(kb, s, wq ? "embed_wq" : "embed_q8_0");
}
void kernels_rmsnorm(KernelBinder& kb, CudaStep& s) {
  bind_single(kb, s, "rmsnorm_f32");
  const bool quant = s.b->kind == OpKind::rmsnorm_quant;
  for (const auto* k : s.kernel_of_range)
    if ((k->variant.param("q") > 0) != quant)
      throw RuntimeError(fmt::format("{}: {} {} its output", s.b->op->describe(), k->variant.name,
                                     quant ? "does not quantize" : "quantizes"));
}
void kernels_quantize(KernelBinder& kb, CudaStep& s) { bind_single(kb, s, "quant_act_q8"); }
void kernels_matmul(KernelBinder& kb, CudaStep& s) {
  bind_ranges(s);
  kb.matmuls.push_back(std::make_unique<cuda::MatmulKernels>(kb.loader, s.ranges));
  s.mm = {kb.matmuls.back().get()};
  check_planes(kb, s, *s.mm[0]);
}
void kernels_matmul_stack(KernelBinder& kb, CudaStep& s) {
  bind_ranges(s);
  const ir::Op& op = *s.b->op;
  const size_t members = op.strs("weights").size();
  bool separate = false;
  for (const auto& r : s.ranges) {
    if (r.parts.size() == 1) {
      if (r.first != 1 || r.last != 1 || r.parts[0].size() != 1)
        throw RuntimeError(fmt::format("{}: a single launch over the stack runs one row, not {}-{}", op.describe(),
                                       r.first, r.last));
      s.stacked_gemv = kb.load(r.parts[0][0]);
      // Q8_0's GEMV, or a block type's one-row kernel (gemv_wq_dp4a / gemv_wq_k4_dp4a, or the skinny kernel the
      // tuning runs as one).
      const std::string& t = s.stacked_gemv->variant.kernel;
      if (t != "gemv_q8_0_dp4a" && !kernels::is_wq_gemv(t) && t != "gemm_wq_dp4a_skinny")
        throw RuntimeError(fmt::format("{}: {} is not a GEMV", op.describe(), s.stacked_gemv->variant.name));
    } else if (r.parts.size() != members) {
      throw RuntimeError(fmt::format("{}: rows {}-{} name {} parts for {} weights", op.describe(), r.first, r.last,
                                     r.parts.size(), members));
    } else {
      separate = true;
    }
  }
  if (!s.stacked_gemv) throw RuntimeError(op.describe() + ": no single-row launch over the stack");
  if (s.stacked_gemv->variant.param("p") != producer_planes(kb, s.b->args[0], 1))
    throw RuntimeError(op.describe() + ": the stacked GEMV reads other planes than its input has");
  if (separate)
    for (size_t k = 0; k < members; ++k) {
      kb.matmuls.push_back(std::make_unique<cuda::MatmulKernels>(kb.loader, s.ranges, k));
      s.mm.push_back(kb.matmuls.back().get());
      check_planes(kb, s, *s.mm.back());
    }
}
void kernels_add(KernelBinder& kb, CudaStep& s) { bind_single(kb, s, "add_f32"); }
void kernels_swiglu(KernelBinder& kb, CudaStep& s) { bind_single(kb, s, "swiglu_f32"); }
void kernels_add_rmsnorm_quant(KernelBinder& kb, CudaStep& s) { bind_single(kb, s, "add_rmsnorm_q8"); }
void kernels_swiglu_quant(KernelBinder& kb, CudaStep& s) { bind_single(kb, s, "swiglu_q8"); }
void kernels_conv(KernelBinder& kb, CudaStep& s) {
  bind_single(kb, s, "conv1d_silu_f32");
  const BoundState& st = kb.graph.states.at((size_t)s.b->state);
  s.taps = st.shape.at(0) + 1;
  for (const auto* k : s.kernel_of_range)
    if (k->variant.param("k") != s.taps)
      throw RuntimeError(fmt::format("{}: {} does not have {} taps", s.b->op->describe(), k->variant.name, s.taps));
  bind_decode(kb, s, "conv1d_silu_f32");
}
void kernels_gdn(KernelBinder& kb, CudaStep& s) {
  bind_ranges(s);
  const ir::Op& op = *s.b->op;
  const cuda::GdnDims d{op.i("key_heads"), op.i("value_heads"), op.i("key_dim"), op.i("value_dim")};
  kb.gdns.push_back(std::make_unique<cuda::GdnKernels>(kb.loader, d, op.i("chunk"), s.ranges));
  s.gdn = kb.gdns.back().get();
  if (kb.graph.states.at((size_t)s.b->state).elements != d.Hv * d.dk * d.dv)
    throw RuntimeError(fmt::format("{}: state size does not match the heads", op.describe()));
  bind_decode(kb, s, "gdn_recurrent");
}
void kernels_gated_rmsnorm(KernelBinder& kb, CudaStep& s) { bind_single(kb, s, "gated_rmsnorm_f32"); }
void kernels_head_rmsnorm(KernelBinder& kb, CudaStep& s) { bind_single(kb, s, "head_rmsnorm_f32"); }
void kernels_rope(KernelBinder& kb, CudaStep& s) { bind_single(kb, s, "rope_neox_f32"); }
// The step's key and value cache formats (their graph states' types).
kernels::KvPair cache_pair(const KernelBinder& kb, const CudaStep& s) {
  return {cuda::cache_format(kb.graph.states.at((size_t)s.b->k_state)),
          cuda::cache_format(kb.graph.states.at((size_t)s.b->v_state))};
}
void kernels_kv_write(KernelBinder& kb, CudaStep& s) {
  const kernels::KvPair kv = cache_pair(kb, s);
  bind_single(kb, s, kernels::kv_write_variant(kv).kernel.c_str());
  for (const cuda::LoadedKernel* k : s.kernel_of_range)
    if (k->variant != kernels::kv_write_variant(kv))
      throw RuntimeError(fmt::format("{}: the plan names {} for {} caches", s.b->op->describe(), k->variant.name,
                                     kernels::kv_pair_name(kv)));
  bind_decode(kb, s, "kv_write");
}
std::vector<int64_t> offsets(const ir::Op& op, const char* key, size_t n) {
  if (!op.has(key)) throw RuntimeError(fmt::format("{}: no {} attribute (recompile the plan)", op.describe(), key));
  const auto& v = op.ints(key);
  if (v.size() != n) throw RuntimeError(fmt::format("{}: {} has {} entries, not {}", op.describe(), key, v.size(), n));
  return v;
}
void kernels_attention(KernelBinder& kb, CudaStep& s) {
  bind_ranges(s);
  const ir::Op& op = *s.b->op;
  const cuda::AttentionDims d{op.i("heads"), op.i("kv_heads"), op.i("head_dim")};
  const auto c = offsets(op, "split_ctas", 3);
  kb.attentions.push_back(std::make_unique<cuda::AttentionKernels>(kb.loader, d, kb.plan.context_length,
                                                                   kernels::AttentionCtas{c[0], c[1], c[2]}, s.ranges,
                                                                   cache_pair(kb, s), op.i("layer")));
  s.att = kb.attentions.back().get();
  // The int8 query is the plan's (the CPU backend computes it from query_int8_tokens): the kernels must agree.
  const int64_t int8_tokens = op.has("query_int8_tokens") ? op.i("query_int8_tokens") : 0;
  if (s.att->int8_query_tokens() != int8_tokens)
    throw RuntimeError(fmt::format("{}: its kernels quantize the query for calls of up to {} tokens, its "
                                   "query_int8_tokens is {}", op.describe(), s.att->int8_query_tokens(), int8_tokens));
  for (int st : {s.b->k_state, s.b->v_state})
    if (kb.graph.states.at((size_t)st).row_width != d.Hkv * d.hd)
      throw RuntimeError(fmt::format("{}: cache width does not match the heads", op.describe()));
  bind_decode(kb, s, "attn_decode");
}
void kernels_none(KernelBinder&, CudaStep&) {}
// The MTP draft graph's [enorm(e) ; hnorm(h)] (docs/speculative.md).
void kernels_concat(KernelBinder& kb, CudaStep& s) { bind_single(kb, s, "concat_f32"); }

using KernelsFn = void (*)(KernelBinder&, CudaStep&);
constexpr std::array<KernelsFn, ir::kOpKindCount> kKernels = [] {
  std::array<KernelsFn, ir::kOpKindCount> t{};
  t[(size_t)OpKind::embed] = kernels_embed;
  t[(size_t)OpKind::rmsnorm] = kernels_rmsnorm;
  t[(size_t)OpKind::rmsnorm_quant] = kernels_rmsnorm;
  t[(size_t)OpKind::add_rmsnorm_quant] = kernels_add_rmsnorm_quant;
  t[(size_t)OpKind::quantize] = kernels_quantize;
  t[(size_t)OpKind::matmul] = kernels_matmul;
  t[(size_t)OpKind::matmul_stack] = kernels_matmul_stack;
  t[(size_t)OpKind::add] = kernels_add;
  t[(size_t)OpKind::swiglu] = kernels_swiglu;
  t[(size_t)OpKind::swiglu_quant] = kernels_swiglu_quant;
  t[(size_t)OpKind::conv1d_silu] = kernels_conv;
  t[(size_t)OpKind::gdn] = kernels_gdn;
  t[(size_t)OpKind::gated_rmsnorm] = kernels_gated_rmsnorm;
  t[(size_t)OpKind::head_rmsnorm] = kernels_head_rmsnorm;
  t[(size_t)OpKind::rope] = kernels_rope;
  t[(size_t)OpKind::kv_write] = kernels_kv_write;
  t[(size_t)OpKind::attention] = kernels_attention;
  t[(size_t)OpKind::gather_rows] = kernels_none;
  t[(size_t)OpKind::bridge] = kernels_none;
  t[(size_t)OpKind::concat] = kernels_concat;
  return t;
}();

// ---- binding: weights and arena places --------------------------------------------------------------------

// The places of the values of the op's graph (the main one or the draft head's).
std::vector<float*>& f32_places(Impl& m, const CudaStep& s) {
  return s.g == m.draft_graph.get() ? m.draft_f32_of : m.f32_of;
}
std::vector<Q8Value>& q8_places(Impl& m, const CudaStep& s) {
  return s.g == m.draft_graph.get() ? m.draft_q8_of : m.q8_of;
}

// The arena places of the op's results (f32) and scratch, checked against the arena's size.
void bind_places(Impl& m, CudaStep& s) {
  const ir::Op& op = *s.b->op;
  if (s.b->results.empty()) return;
  const auto at = offsets(op, "at", s.b->results.size());
  for (size_t k = 0; k < at.size(); ++k) {
    const BoundValue& v = s.g->values[(size_t)s.b->results[k]];
    const int64_t rows = v.rows ? m.layout.max_r : m.layout.max_t;
    const int64_t bytes = v.type.dtype == ir::DType::q8 ? rows * v.width * 2 : rows * v.width * 4;  // a lower bound
    if (at[k] < 0 || at[k] % 256 != 0 || at[k] + bytes > m.layout.arena_bytes)
      throw RuntimeError(fmt::format("{}: result %{} at arena offset {} does not fit the {}-byte arena", op.describe(),
                                     v.name, at[k], m.layout.arena_bytes));
    if (v.type.dtype == ir::DType::q8) {
      s.q8_out = m.q8_at(at[k], rows, v.width);
      q8_places(m, s)[(size_t)s.b->results[k]] = s.q8_out;
    } else {
      s.out.push_back(reinterpret_cast<float*>(m.arena.data() + at[k]));
      f32_places(m, s)[(size_t)s.b->results[k]] = s.out.back();
    }
  }
  if (op.has("scratch")) {
    const auto sc = offsets(op, "scratch", 2);
    if (sc[0] < 0 || sc[0] % 256 != 0 || sc[1] < 0 || sc[0] + sc[1] > m.layout.arena_bytes)
      throw RuntimeError(fmt::format("{}: scratch [{}, +{}] does not fit the arena", op.describe(), sc[0], sc[1]));
    s.scratch = m.arena.data() + sc[0];
  }
}

const cuda::Q8Matrix& q8_weight(Impl& m, const std::string& name, const ir::Op& op) {
  auto it = m.q8_by_name.find(name);
  if (it == m.q8_by_name.end()) throw RuntimeError(fmt::format("{}: weight '{}' was not uploaded", op.describe(), name));
  return it->second;
}
const float* f32_weight(Impl& m, const std::string& name, const ir::Op& op) {
  auto it = m.f32_by_name.find(name);
  if (it == m.f32_by_name.end()) throw RuntimeError(fmt::format("{}: weight '{}' was not uploaded", op.describe(), name));
  return it->second;
}
int64_t scratch_bytes(const CudaStep& s) { return s.scratch ? s.b->op->ints("scratch").at(1) : 0; }

// A matrix must map the op's input width to its result width (a GGUF whose shapes disagree with the plan's).
void require_shape(const cuda::Q8Matrix& w, int64_t rows, int64_t cols, const ir::Op& op, const std::string& name) {
  if (w.rows != rows || w.cols != cols)
    throw RuntimeError(fmt::format("{}: weight '{}' is [{}][{}], the op needs [{}][{}]", op.describe(), name, w.rows,
                                   w.cols, rows, cols));
}

void res_embed(Impl& m, CudaStep& s) {
  s.w = {q8_weight(m, s.b->op->s("weight"), *s.b->op)};
  require_shape(s.w[0], s.w[0].rows, s.g->width(s.b->results[0]), *s.b->op, s.b->op->s("weight"));
}
void res_norm(Impl& m, CudaStep& s) {
  s.vec = f32_weight(m, s.b->op->s("weight"), *s.b->op);
  s.eps = (float)s.b->op->f("eps");
  if (s.b->kind == OpKind::rmsnorm_quant &&
      scratch_bytes(s) < m.layout.max_t * s.g->width(s.b->results[0]) * 4)
    throw RuntimeError(fmt::format("{}: no scratch for the normalised rows (recompile the plan)", s.b->op->describe()));
}
// add_rmsnorm_quant: the norm's weight and eps (its kernel writes no normalised f32 rows: no scratch).
void res_add_norm(Impl& m, CudaStep& s) {
  s.vec = f32_weight(m, s.b->op->s("weight"), *s.b->op);
  s.eps = (float)s.b->op->f("eps");
}
void res_matmul(Impl& m, CudaStep& s) {
  s.w = {q8_weight(m, s.b->op->s("weight"), *s.b->op)};
  require_shape(s.w[0], s.g->width(s.b->results[0]), s.g->width(s.b->args[0]), *s.b->op, s.b->op->s("weight"));
}
void res_matmul_stack(Impl& m, CudaStep& s) {
  const ir::Op& op = *s.b->op;
  const auto& ws = op.strs("weights");
  if (ws.size() > 4) throw RuntimeError(op.describe() + ": at most 4 stacked weights");
  for (size_t k = 0; k < ws.size(); ++k) {
    s.w.push_back(q8_weight(m, ws[k], op));
    require_shape(s.w.back(), s.g->width(s.b->results[k]), s.g->width(s.b->args[0]), op, ws[k]);
  }
  auto it = m.stack_by_head.find(ws.at(0));
  if (it == m.stack_by_head.end()) throw RuntimeError(op.describe() + ": its weights were not uploaded as a stack");
  s.stacked = it->second;
  // The single-row launch reads the stack's layout: Q8_0's GEMV a Q8_0 stack, a block type's kernel its own type.
  const cuda::Variant& v = s.stacked_gemv->variant;
  if ((v.kernel == "gemv_q8_0_dp4a") != (s.stacked.wtype == 8) || (s.stacked.wtype != 8 && v.param("w") != s.stacked.wtype))
    throw RuntimeError(fmt::format("{}: the plan's single-row launch {} cannot read its stack of ggml type {}",
                                   op.describe(), v.name, s.stacked.wtype));
}
void res_conv(Impl& m, CudaStep& s) { s.vec = f32_weight(m, s.b->op->s("weight"), *s.b->op); }
void res_gdn(Impl& m, CudaStep& s) {
  const ir::Op& op = *s.b->op;
  s.ssm_a = f32_weight(m, op.s("ssm_a"), op);
  s.dt_bias = f32_weight(m, op.s("dt_bias"), op);
  const cuda::GdnDims d{op.i("key_heads"), op.i("value_heads"), op.i("key_dim"), op.i("value_dim")};
  const int64_t most = std::min<int64_t>(m.layout.max_t, m.plan.context_length);
  const int64_t need = kernels::gdn_workspace_bytes(d, op.i("chunk"), m.layout.max_t);
  if (!s.gdn->recurrent_for(most) && scratch_bytes(s) < need)
    throw RuntimeError(fmt::format("{}: its scratch is smaller than the chunked kernels' {} bytes", op.describe(), need));
}
void res_head_norm(Impl& m, CudaStep& s) {
  s.vec = f32_weight(m, s.b->op->s("weight"), *s.b->op);
  s.eps = (float)s.b->op->f("eps");
}
void res_rope(Impl& m, CudaStep& s) {
  auto it = m.rope_by_op.find(s.b->op);
  if (it == m.rope_by_op.end()) throw RuntimeError(s.b->op->describe() + ": no RoPE table was uploaded");
  s.inv_freq = it->second;
}
void res_attention(Impl& m, CudaStep& s) {
  const ir::Op& op = *s.b->op;
  const cuda::AttentionDims d{op.i("heads"), op.i("kv_heads"), op.i("head_dim")};
  const auto c = op.ints("split_ctas");
  const int64_t seqs = s.decode_ranges.empty() ? 1 : s.decode_ranges.back().last;  // a batched decode's partials
  const int64_t need = kernels::attention_workspace_bytes(d, {c.at(0), c.at(1), c.at(2)}, m.plan.context_length,
                                                          std::min(m.layout.max_t, m.plan.context_length), seqs);
  if (need > 0 && scratch_bytes(s) < need)
    throw RuntimeError(fmt::format("{}: its scratch is smaller than the {} bytes of split partials", op.describe(), need));
}
void res_none(Impl&, CudaStep&) {}

using ResFn = void (*)(Impl&, CudaStep&);
constexpr std::array<ResFn, ir::kOpKindCount> kResources = [] {
  std::array<ResFn, ir::kOpKindCount> t{};
  t[(size_t)OpKind::embed] = res_embed;
  t[(size_t)OpKind::rmsnorm] = res_norm;
  t[(size_t)OpKind::rmsnorm_quant] = res_norm;
  t[(size_t)OpKind::add_rmsnorm_quant] = res_add_norm;
  t[(size_t)OpKind::quantize] = res_none;
  t[(size_t)OpKind::matmul] = res_matmul;
  t[(size_t)OpKind::matmul_stack] = res_matmul_stack;
  t[(size_t)OpKind::add] = res_none;
  t[(size_t)OpKind::swiglu] = res_none;
  t[(size_t)OpKind::swiglu_quant] = res_none;
  t[(size_t)OpKind::conv1d_silu] = res_conv;
  t[(size_t)OpKind::gdn] = res_gdn;
  t[(size_t)OpKind::gated_rmsnorm] = res_head_norm;
  t[(size_t)OpKind::head_rmsnorm] = res_head_norm;
  t[(size_t)OpKind::rope] = res_rope;
  t[(size_t)OpKind::kv_write] = res_none;
  t[(size_t)OpKind::attention] = res_attention;
  t[(size_t)OpKind::gather_rows] = res_none;
  t[(size_t)OpKind::bridge] = res_none;
  t[(size_t)OpKind::concat] = res_none;
  return t;
}();

// ---- running ----------------------------------------------------------------------------------------------

float* f32_in(const StepCx&, const CudaStep& s, size_t a) { return s.in.at(a); }
const Q8Value& q8_in(const StepCx&, const CudaStep& s) { return s.q8_in; }

void run_embed(const StepCx& c, const CudaStep& s) {
  const cuda::LoadedKernel& k = s.kernel_for(c.T);
  if (k.variant.kernel == "embed_wq")
    cuda::launch_embed_wq(k, s.w[0], c.m.tokens_dev.data(), c.T, s.out[0], c.stream);
  else
    cuda::launch_embed_q8_0(k, s.w[0], c.m.tokens_dev.data(), c.T, s.out[0], c.stream);
}
void run_rmsnorm(const StepCx& c, const CudaStep& s) {
  const int64_t n = s.b->rows ? c.R : c.T;
  cuda::launch_rmsnorm_f32(s.kernel_for(n), f32_in(c, s, 0), s.vec, s.out[0], n, s.eps, c.stream);
}
void run_rmsnorm_quant(const StepCx& c, const CudaStep& s) {
  const int64_t n = s.b->rows ? c.R : c.T;
  cuda::launch_rmsnorm_quant_f32(s.kernel_for(n), f32_in(c, s, 0), s.vec, reinterpret_cast<float*>(s.scratch), n, s.eps,
                                 s.q8_out.q, s.q8_out.d, s.q8_out.q2, c.stream);
}
void run_quantize(const StepCx& c, const CudaStep& s) {
  const int64_t n = s.b->rows ? c.R : c.T;
  cuda::launch_quant_act_q8(s.kernel_for(n), f32_in(c, s, 0), s.q8_out.q, s.q8_out.d, s.q8_out.q2,
                            n * s.g->width(s.b->results[0]), c.stream);
}
void run_add_rmsnorm_quant(const StepCx& c, const CudaStep& s) {
  const int64_t n = s.b->rows ? c.R : c.T;
  cuda::launch_add_rmsnorm_q8(s.kernel_for(n), f32_in(c, s, 0), f32_in(c, s, 1), s.out[0], s.vec, n,
                              s.g->width(s.b->results[0]), s.eps, s.q8_out.q, s.q8_out.d, s.q8_out.q2, c.stream);
}
void run_matmul(const StepCx& c, const CudaStep& s) {
  const int64_t n = s.b->rows ? c.R : c.T;
  const Q8Value& x = q8_in(c, s);
  s.mm[0]->run(s.w[0], x.q, x.d, x.q2, n, s.out[0], c.stream);
}
void run_matmul_stack(const StepCx& c, const CudaStep& s) {
  const Q8Value& x = q8_in(c, s);
  if (c.T == 1) {  // one GEMV over the stacked weights, each member's rows to its own result
    float* ys[4] = {nullptr, nullptr, nullptr, nullptr};
    int64_t rows_of[4] = {0, 0, 0, 0};
    if (s.w.size() > 4) throw RuntimeError(s.b->op->describe() + ": at most 4 stacked weights");
    for (size_t i = 0; i < s.w.size(); ++i) {
      ys[i] = s.out[i];
      rows_of[i] = s.w[i].rows;
    }
    if (s.stacked.wtype == 8)
      cuda::launch_gemv_q8_0_split(*s.stacked_gemv, s.stacked, x.q, x.d, x.q2, ys, rows_of, c.stream);
    else
      cuda::launch_matmul_wq_split(*s.stacked_gemv, s.stacked, x.q, x.d, x.q2, ys, rows_of, c.stream);
    return;
  }
  for (size_t i = 0; i < s.w.size(); ++i) s.mm.at(i)->run(s.w[i], x.q, x.d, x.q2, c.T, s.out[i], c.stream);
}
void run_add(const StepCx& c, const CudaStep& s) {
  const int64_t n = s.b->rows ? c.R : c.T;
  cuda::launch_add_f32(s.kernel_for(n), f32_in(c, s, 0), f32_in(c, s, 1), s.out[0], n * s.g->width(s.b->results[0]),
                       c.stream);
}
void run_swiglu(const StepCx& c, const CudaStep& s) {
  const int64_t n = s.b->rows ? c.R : c.T;
  cuda::launch_swiglu_f32(s.kernel_for(n), f32_in(c, s, 0), f32_in(c, s, 1), s.out[0],
                          n * s.g->width(s.b->results[0]), c.stream);
}
void run_swiglu_quant(const StepCx& c, const CudaStep& s) {
  const int64_t n = s.b->rows ? c.R : c.T;
  cuda::launch_swiglu_q8(s.kernel_for(n), f32_in(c, s, 0), f32_in(c, s, 1), n * s.g->width(s.b->results[0]),
                         s.q8_out.q, s.q8_out.d, s.q8_out.q2, c.stream);
}
void run_gated_rmsnorm(const StepCx& c, const CudaStep& s) {
  cuda::launch_gated_rmsnorm_f32(s.kernel_for(c.T), f32_in(c, s, 0), f32_in(c, s, 1), s.vec, c.T, s.b->op->i("heads"),
                                 s.eps, s.out[0], c.stream);
}
void run_head_rmsnorm(const StepCx& c, const CudaStep& s) {
  const ir::Op& op = *s.b->op;
  cuda::launch_head_rmsnorm_f32(s.kernel_for(c.T), f32_in(c, s, 0), s.g->width(s.b->args[0]), op.i("head_stride"),
                                op.i("head_offset"), s.vec, c.T, op.i("heads"), s.eps, s.out[0], c.stream);
}
void run_rope(const StepCx& c, const CudaStep& s) {
  cuda::launch_rope_neox_f32(s.kernel_for(c.T), f32_in(c, s, 0), s.out[0], c.m.pos_dev.data(), c.T,
                             s.b->op->i("heads"), s.inv_freq, c.stream);
}
void run_gather_rows(const StepCx& c, const CudaStep& s) {
  const int64_t w = s.g->width(s.b->results[0]);
  const float* x = f32_in(c, s, 0);
  for (int64_t r = 0; r < c.R; ++r)
    cuda::copy_on_device(s.out[0] + r * w, x + (int64_t)c.out_rows[(size_t)r] * w, (size_t)w * 4, c.stream,
                         "gather of output rows");
}
void run_concat(const StepCx& c, const CudaStep& s) {
  const int64_t n = s.b->rows ? c.R : c.T;
  cuda::launch_concat_f32(s.kernel_for(n), f32_in(c, s, 0), s.g->width(s.b->args[0]), f32_in(c, s, 1),
                          s.g->width(s.b->args[1]), n, s.out[0], c.stream);
}
// The receiving side of a bridge: the stage's step copied the rows in from its bridge buffer before any op ran
// (outside CUDA graphs: the buffer alternates between steps), so nothing is left to launch.
void run_bridge(const StepCx&, const CudaStep&) {}
// A decode step of several sequences (one token each, row k = sequence k) where the plan runs them batched: one
// launch (attention: decode, then merge) over all of them, each sequence's slot and position read from decode_seq.
void run_batched(const StepCx& c, const CudaStep& s, int range) {
  Impl& m = c.m;
  const int64_t B = (int64_t)c.batch.size();
  const ir::Op& op = *s.b->op;
  switch (s.b->kind) {
    case OpKind::conv1d_silu: {
      const int64_t w = s.g->width(s.b->results[0]), so = m.layout.state_offset[(size_t)s.b->state];
      cuda::launch_conv1d_silu_batched(*s.decode_kernel_of_range[(size_t)range], f32_in(c, s, 0), B, w, s.vec,
                                       m.rec_table(), m.seq_slots(), so, s.out[0], c.stream);
      break;
    }
    case OpKind::gdn: {
      const cuda::GdnDims d{op.i("key_heads"), op.i("value_heads"), op.i("key_dim"), op.i("value_dim")};
      cuda::launch_gdn_recurrent_batched(*s.decode_kernel_of_range[(size_t)range], d, f32_in(c, s, 0), f32_in(c, s, 1),
                                         f32_in(c, s, 2), s.ssm_a, s.dt_bias, B, m.rec_table(), m.seq_slots(),
                                         m.layout.state_offset[(size_t)s.b->state], s.out[0], c.stream);
      break;
    }
    case OpKind::kv_write: {
      const kernels::KvPair kv{cuda::cache_format(s.g->states[(size_t)s.b->k_state]),
                               cuda::cache_format(s.g->states[(size_t)s.b->v_state])};
      cuda::launch_kv_write_batched(*s.decode_kernel_of_range[(size_t)range], f32_in(c, s, 0), f32_in(c, s, 1),
                                    m.cache_table(s.b->k_state), m.cache_table(s.b->v_state), m.seq_slots(),
                                    m.seq_positions(), B, s.g->states[(size_t)s.b->k_state].row_width,
                                    op.i("layer"), kv, c.stream);
      break;
    }
    case OpKind::attention: {
      std::vector<int64_t> pos((size_t)B);
      for (size_t k = 0; k < c.batch.size(); ++k) pos[k] = m.slot(c.batch[k].slot).n_past;
      s.decode_att_of_range[(size_t)range]->run(f32_in(c, s, 0), m.cache_table(s.b->k_state),
                                                m.cache_table(s.b->v_state), m.seq_slots(), m.seq_positions(), pos,
                                                (float)op.f("scale"), f32_in(c, s, 1) + op.i("gate_offset"),
                                                s.g->width(s.b->args[1]), op.i("gate_head_stride"), s.out[0],
                                                s.scratch, c.stream);
      break;
    }
    default: throw RuntimeError(op.describe() + ": not a per-sequence op");
  }
}

// Ops on a sequence's own state: once per input of the step, on its rows (or, in a decode step the plan batches,
// once over all of them).
void run_per_sequence(const StepCx& c, const CudaStep& s) {
  Impl& m = c.m;
  if (c.decode && c.batch.size() >= 2 && !c.draft)
    if (const int r = s.batched_range_for((int64_t)c.batch.size()); r >= 0) return run_batched(c, s, r);
  for (size_t k = 0; k < c.batch.size(); ++k) {
    Slot& sl = m.slot(c.batch[k].slot);
    const int64_t off = c.offset[k], nt = (int64_t)c.batch[k].tokens.size();
    // The draft head's call: its own caches, at its own positions.
    std::vector<cuda::DeviceBuffer<uint16_t>>& cache = c.draft ? sl.draft_cache : sl.cache;
    const int64_t past = c.draft ? c.draft_pos : sl.n_past;
    auto in = [&](size_t a) { return f32_in(c, s, a) + off * s.g->width(s.b->args[a]); };
    switch (s.b->kind) {
      case OpKind::conv1d_silu: {
        const int64_t w = s.g->width(s.b->results[0]), so = m.layout.state_offset[(size_t)s.b->state];
        cuda::launch_conv1d_silu_f32(s.kernel_for(nt), in(0), nt, w, s.vec, sl.rec.data() + so, s.out[0] + off * w,
                                     c.stream, c.keep[k] > 0 ? sl.kept.data() + so : nullptr, c.keep[k],
                                     m.layout.rec_floats);
        break;
      }
      case OpKind::gdn: {
        const int64_t w = s.g->width(s.b->results[0]), so = m.layout.state_offset[(size_t)s.b->state];
        s.gdn->run(in(0), in(1), in(2), s.ssm_a, s.dt_bias, nt, sl.rec.data() + so, s.out[0] + off * w, s.scratch,
                   c.stream, c.keep[k] > 0 ? sl.kept.data() + so : nullptr, c.keep[k], m.layout.rec_floats);
        break;
      }
      case OpKind::kv_write: {
        const ir::Op& op = *s.b->op;
        const kernels::KvPair kv{cuda::cache_format(s.g->states[(size_t)s.b->k_state]),
                                 cuda::cache_format(s.g->states[(size_t)s.b->v_state])};
        const int64_t W = s.g->states[(size_t)s.b->k_state].row_width;
        cuda::launch_kv_write(s.kernel_for(nt), in(0), in(1), cache[(size_t)s.b->k_state].data(),
                              cache[(size_t)s.b->v_state].data(), past, nt, W, op.i("layer"), kv, c.stream);
        break;
      }
      case OpKind::attention: {
        const ir::Op& op = *s.b->op;
        const int64_t w = s.g->width(s.b->results[0]);
        s.att->run(in(0), cache[(size_t)s.b->k_state].data(), cache[(size_t)s.b->v_state].data(), nt, past,
                   (float)op.f("scale"), in(1) + op.i("gate_offset"), s.g->width(s.b->args[1]),
                   op.i("gate_head_stride"), s.out[0] + off * w, s.scratch, c.stream);
        break;
      }
      default: throw RuntimeError(s.b->op->describe() + ": not a per-sequence op");
    }
  }
}

using RunFn = void (*)(const StepCx&, const CudaStep&);
constexpr std::array<RunFn, ir::kOpKindCount> kRun = [] {
  std::array<RunFn, ir::kOpKindCount> t{};
  t[(size_t)OpKind::embed] = run_embed;
  t[(size_t)OpKind::rmsnorm] = run_rmsnorm;
  t[(size_t)OpKind::rmsnorm_quant] = run_rmsnorm_quant;
  t[(size_t)OpKind::add_rmsnorm_quant] = run_add_rmsnorm_quant;
  t[(size_t)OpKind::quantize] = run_quantize;
  t[(size_t)OpKind::matmul] = run_matmul;
  t[(size_t)OpKind::matmul_stack] = run_matmul_stack;
  t[(size_t)OpKind::add] = run_add;
  t[(size_t)OpKind::swiglu] = run_swiglu;
  t[(size_t)OpKind::swiglu_quant] = run_swiglu_quant;
  t[(size_t)OpKind::conv1d_silu] = run_per_sequence;
  t[(size_t)OpKind::gdn] = run_per_sequence;
  t[(size_t)OpKind::gated_rmsnorm] = run_gated_rmsnorm;
  t[(size_t)OpKind::head_rmsnorm] = run_head_rmsnorm;
  t[(size_t)OpKind::rope] = run_rope;
  t[(size_t)OpKind::kv_write] = run_per_sequence;
  t[(size_t)OpKind::attention] = run_per_sequence;
  t[(size_t)OpKind::gather_rows] = run_gather_rows;
  t[(size_t)OpKind::bridge] = run_bridge;
  t[(size_t)OpKind::concat] = run_concat;
  return t;
}();

}  // namespace

void bind_op_kernels(KernelBinder& kb, CudaStep& s) { kKernels[(size_t)s.b->kind](kb, s); }

void bind_output_kernels(KernelBinder& kb, const cuda::LoadedKernel*& argmax, std::vector<std::string>& top_k) {
  const ir::AttrValue* am = kb.plan.graph.attr("argmax_kernel");
  const ir::AttrValue* tk = kb.plan.graph.attr("top_k_kernels");
  if (!am || !std::holds_alternative<std::string>(*am) || !tk || !std::holds_alternative<std::vector<std::string>>(*tk))
    throw RuntimeError("plan: the graph names no argmax_kernel / top_k_kernels (recompile the plan)");
  argmax = kb.load(std::get<std::string>(*am));
  if (argmax->variant.kernel != "argmax_f32") throw RuntimeError("plan: argmax_kernel is not an argmax_f32 variant");
  top_k = std::get<std::vector<std::string>>(*tk);
}

void bind_op_resources(Impl& m, CudaStep& s) {
  std::vector<float*>& f32_of = f32_places(m, s);
  std::vector<Q8Value>& q8_of = q8_places(m, s);
  if (f32_of.empty()) {
    f32_of.assign(s.g->values.size(), nullptr);
    q8_of.assign(s.g->values.size(), Q8Value{});
  }
  if (s.g->has_hidden) f32_of[BoundGraph::kHidden] = m.draft_hidden.data();  // the draft head's %hidden rows
  // A bridge's argument lives on the stage before: the rows arrive in the bridge buffer.
  if (s.b->kind == OpKind::bridge) {
    s.in.push_back(nullptr);
    bind_places(m, s);
    return;
  }
  // Arguments: the places their producers were given (inputs are read from the step's own buffers).
  for (size_t a = 0; a < s.b->args.size(); ++a) {
    const int id = s.b->args[a];
    if (id <= BoundGraph::kRows) {
      s.in.push_back(nullptr);
      continue;
    }
    const BoundValue& v = s.g->values[(size_t)id];
    if (v.type.dtype == ir::DType::q8) {
      if (a != 0 || !q8_of[(size_t)id].q) throw RuntimeError(fmt::format("{}: %{} has no place", s.b->op->describe(), v.name));
      s.q8_in = q8_of[(size_t)id];
      s.in.push_back(nullptr);
    } else {
      if (!f32_of[(size_t)id]) throw RuntimeError(fmt::format("{}: %{} has no place", s.b->op->describe(), v.name));
      s.in.push_back(f32_of[(size_t)id]);
    }
  }
  bind_places(m, s);
  kResources[(size_t)s.b->kind](m, s);
}

std::vector<std::string> kernels_loaded_by(const ir::Plan& plan) {
  const BoundGraph graph(plan);
  std::optional<BoundGraph> draft;
  if (plan.draft_tokens > 0) draft.emplace(plan, plan.draft);
  std::set<std::string> names;
  std::map<std::string, std::unique_ptr<cuda::LoadedKernel>> owned;
  std::vector<std::unique_ptr<cuda::MatmulKernels>> matmuls;
  std::vector<std::unique_ptr<cuda::GdnKernels>> gdns;
  std::vector<std::unique_ptr<cuda::AttentionKernels>> attentions;
  std::vector<std::unique_ptr<cuda::BatchedDecodeAttention>> batched_attentions;
  std::vector<CudaStep> steps(graph.ops.size());
  // A loader without a GPU: the variant alone (the kernel sets read only its parameters before a launch).
  auto fake = [&](const std::string& name) -> const cuda::LoadedKernel* {
    names.insert(name);
    auto& k = owned[name];
    if (!k) k = std::make_unique<cuda::LoadedKernel>(cuda::LoadedKernel{cuda::parse_variant(name), cuda::Kernel{}});
    return k.get();
  };
  KernelBinder kb{plan, graph, fake, [&](const cuda::Variant& v) { return *fake(v.name); }, matmuls, gdns, attentions,
                  batched_attentions, steps};
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    steps[i].g = &graph;
    steps[i].b = &graph.ops[i];
    bind_op_kernels(kb, steps[i]);
  }
  if (draft) {  // the draft head's ops, bound over their own graph
    std::vector<CudaStep> draft_steps(draft->ops.size());
    KernelBinder dkb{plan, *draft, fake, [&](const cuda::Variant& v) { return *fake(v.name); }, matmuls, gdns,
                     attentions, batched_attentions, draft_steps};
    for (size_t i = 0; i < draft->ops.size(); ++i) {
      draft_steps[i].g = &*draft;
      draft_steps[i].b = &draft->ops[i];
      bind_op_kernels(dkb, draft_steps[i]);
    }
  }
  const cuda::LoadedKernel* argmax = nullptr;
  std::vector<std::string> top_k;
  bind_output_kernels(kb, argmax, top_k);
  for (const auto& n : top_k) names.insert(n);  // the selector loads them (its constructor checks what they are)
  return {names.begin(), names.end()};
}

void run_op(const StepCx& c, const CudaStep& s) { kRun[(size_t)s.b->kind](c, s); }

bool patchable(ir::OpKind k) { return k == OpKind::kv_write || k == OpKind::attention; }

bool slot_free_step(const Impl& m, int64_t seqs) {
  if (seqs < 2) return false;
  for (const CudaStep& s : m.steps) {
    const OpKind k = s.b->kind;
    const bool per_sequence = k == OpKind::conv1d_silu || k == OpKind::gdn || k == OpKind::kv_write || k == OpKind::attention;
    if (per_sequence && s.batched_range_for(seqs) < 0) return false;
  }
  return true;
}

bool cuda_op_tables_complete() {
  for (size_t k = 0; k < ir::kOpKindCount; ++k)
    if (!kKernels[k] || !kResources[k] || !kRun[k]) return false;
  return true;
}

}  // namespace qrig::runtime
