// CpuExecutor: binds the plan's graph to weights once (the bind table, one row per op kind), then interprets it
// per call (the run table). A new op kind is a row in each (tests/runtime/test_op_tables.cpp checks both are
// complete).
#include "runtime/cpu/executor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "kernels/kv_format.h"

#include "runtime/cpu/thread_pool.h"

namespace qrig::runtime {

void CpuSequence::reset() {
  for (auto& b : buffers) std::fill(b.begin(), b.end(), 0.0f);
  n_past = 0;
  keep = 0;
  kept_from = -1;
  kept_count = 0;
}

void CpuSequence::rollback(int64_t position) {
  if (position == n_past) return;  // everything the last step ran is kept
  if (kept_from < 0 || position <= kept_from || position > kept_from + kept_count)
    throw RuntimeError(fmt::format("rollback to position {}: the sequence is at {} and its last step kept positions "
                                   "{}..{}", position, n_past, kept_from + 1, kept_from + kept_count));
  const int64_t idx = position - kept_from - 1;  // the copy after token `position - 1`
  for (size_t i = 0; i < buffers.size() && i < kept.size(); ++i)
    if (!kept[i].empty()) {
      const int64_t n = (int64_t)buffers[i].size();
      std::copy(kept[i].begin() + idx * n, kept[i].begin() + (idx + 1) * n, buffers[i].begin());
    }
  n_past = position;
  kept_from = -1;  // what was kept after `position` is stale now
  kept_count = 0;
}

struct CpuExecutor::Step {
  const BoundOp* b = nullptr;
  std::vector<cpu::Matrix> w;  // embed, matmul: one; matmul_stack: one per weight
  const float* vec = nullptr;  // norm weight, conv weight
  const float* ssm_a = nullptr;
  const float* dt_bias = nullptr;
  int64_t taps = 0;            // conv1d_silu
};

namespace {

using ir::OpKind;
using Step = CpuExecutor::Step;

// q8, t4 and t3 caches are held as bytes in the GPU's layout; f32 and f16 ones as fp32 values.
std::optional<kernels::KvFormat> quantized_format(ir::DType d) {
  if (d == ir::DType::q8) return kernels::KvFormat::q8;
  if (d == ir::DType::t4) return kernels::KvFormat::t4;
  if (d == ir::DType::t3) return kernels::KvFormat::t3;
  return std::nullopt;
}

// Floats of a state's buffer.
int64_t state_floats(const BoundState& st) {
  const auto f = st.positional ? quantized_format(st.dtype) : std::nullopt;
  return f ? st.shape[0] * kernels::kv_row_bytes(*f, st.row_width, true) / 4 : st.elements;
}

const gguf::TensorInfo& need_tensor(const gguf::File& f, const std::string& name, const ir::Op& op) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) throw RuntimeError(fmt::format("{}: weight '{}' is not in {}", op.describe(), name, f.path()));
  return *t;
}

const float* f32_vector(const gguf::File& f, const std::string& name, const ir::Op& op, int64_t n) {
  const gguf::TensorInfo& t = need_tensor(f, name, op);
  if (t.type != gguf::TensorType::F32 || (int64_t)t.n_elements != n)
    throw RuntimeError(fmt::format("{}: weight '{}' must be F32 with {} values, is {} {}", op.describe(), name, n,
                                   gguf::tensor_type_name(t.type), t.shape_string()));
  return reinterpret_cast<const float*>(f.tensor_data(t));
}

// Corrupt blocks are refused at load, not met mid-forward: every fp16 scale of a block-quantized matrix must be
// finite (gguf::check_blocks; rows checked in parallel).
void check_scales(const gguf::TensorInfo& t, const cpu::Matrix& m, const ir::Op& op) {
  const gguf::TypeTraits* tr = gguf::type_traits(static_cast<uint32_t>(t.type));
  if (!tr || tr->block_elems == 1) return;
  const size_t row_bytes = (size_t)(m.in / tr->block_elems) * tr->block_bytes;
  try {
    cpu::parallel_for(m.out, [&](int64_t b, int64_t e) {
      gguf::check_blocks(t.type, m.data + (size_t)b * row_bytes, (size_t)((e - b) * m.in),
                         fmt::format("weight '{}' rows {}..{}", t.name, b, e - 1));
    }, std::max<int64_t>(1, (1 << 20) / (int64_t)row_bytes));
  } catch (const gguf::Error& e) {
    throw RuntimeError(fmt::format("{}: {}", op.describe(), e.what()));
  }
}

cpu::Matrix matrix(const gguf::File& f, const std::string& name, const ir::Op& op, int64_t in, int64_t out) {
  const gguf::TensorInfo& t = need_tensor(f, name, op);
  if (t.ne.size() != 2 || !gguf::can_dequantize(t.type))
    throw RuntimeError(fmt::format("{}: weight '{}' ({} {}) is not a supported matrix", op.describe(), t.name,
                                   gguf::tensor_type_name(t.type), t.shape_string()));
  cpu::Matrix m{t.type, f.tensor_data(t), (int64_t)t.ne[0], (int64_t)t.ne[1]};
  if (m.in != in || m.out != out)
    throw RuntimeError(fmt::format("{}: weight '{}' {} does not map {} to {} values", op.describe(), t.name,
                                   t.shape_string(), in, out));
  check_scales(t, m, op);
  return m;
}

// ---- bind table: weights per op kind ----------------------------------------------------------------------

struct BindCx {
  const gguf::File& f;
  const BoundGraph& g;
  int64_t& vocab_rows;
};
using BindFn = void (*)(const BindCx&, Step&);

void bind_none(const BindCx&, Step&) {}
void bind_embed(const BindCx& c, Step& s) {
  const ir::Op& op = *s.b->op;
  const gguf::TensorInfo& t = need_tensor(c.f, op.s("weight"), op);
  const int64_t width = c.g.width(s.b->results[0]);
  s.w = {matrix(c.f, op.s("weight"), op, width, t.ne.size() == 2 ? (int64_t)t.ne[1] : 0)};
  c.vocab_rows = s.w[0].out;
}
void bind_norm(const BindCx& c, Step& s) {
  s.vec = f32_vector(c.f, s.b->op->s("weight"), *s.b->op, c.g.width(s.b->results[0]));
}
void bind_head_norm(const BindCx& c, Step& s) {
  s.vec = f32_vector(c.f, s.b->op->s("weight"), *s.b->op, s.b->op->i("head_dim"));
}
void bind_matmul(const BindCx& c, Step& s) {
  const ir::Op& op = *s.b->op;
  s.w = {matrix(c.f, op.s("weight"), op, c.g.width(s.b->args[0]), c.g.width(s.b->results[0]))};
  if (c.g.values[(size_t)s.b->results[0]].name == "logits") c.vocab_rows = s.w[0].out;
}
void bind_matmul_stack(const BindCx& c, Step& s) {
  const ir::Op& op = *s.b->op;
  const auto& ws = op.strs("weights");
  for (size_t k = 0; k < ws.size(); ++k)
    s.w.push_back(matrix(c.f, ws[k], op, c.g.width(s.b->args[0]), c.g.width(s.b->results[k])));
}
void bind_conv(const BindCx& c, Step& s) {
  const BoundState& st = c.g.states.at((size_t)s.b->state);
  if (st.shape.size() != 2) throw RuntimeError(s.b->op->describe() + ": the conv state must be [K-1, C]");
  s.taps = st.shape[0] + 1;
  s.vec = f32_vector(c.f, s.b->op->s("weight"), *s.b->op, s.taps * c.g.width(s.b->results[0]));
}
// kv_write, attention: the caches' formats are the ones the op was planned with, and can hold the rows.
void bind_kv(const BindCx& c, Step& s) {
  const ir::Op& op = *s.b->op;
  for (const auto& [key, state] : {std::pair{"k_format", s.b->k_state}, std::pair{"v_format", s.b->v_state}}) {
    const BoundState& st = c.g.states.at((size_t)state);
    if (op.has(key) && op.s(key) != ir::dtype_name(st.dtype))
      throw RuntimeError(fmt::format("{}: {} '{}' but state %{} is {}", op.describe(), key, op.s(key), st.name,
                                     ir::dtype_name(st.dtype)));
    const auto f = quantized_format(st.dtype);
    if (!f && st.dtype != ir::DType::f32 && st.dtype != ir::DType::f16)
      throw RuntimeError(fmt::format("{}: state %{} is {}, not a key/value cache format", op.describe(), st.name,
                                     ir::dtype_name(st.dtype)));
    if (f && !kernels::kv_width_ok(*f, st.row_width))
      throw RuntimeError(fmt::format("{}: a {} cache cannot hold rows of {} values", op.describe(),
                                     ir::dtype_name(st.dtype), st.row_width));
    if (f && kernels::kv_format_rotated(*f) && op.kind == OpKind::attention && op.i("head_dim") % 256 != 0)
      throw RuntimeError(fmt::format("{}: {} caches need a head_dim that is a multiple of 256", op.describe(),
                                     ir::dtype_name(st.dtype)));
  }
}
void bind_gdn(const BindCx& c, Step& s) {
  const ir::Op& op = *s.b->op;
  s.ssm_a = f32_vector(c.f, op.s("ssm_a"), op, op.i("value_heads"));
  s.dt_bias = f32_vector(c.f, op.s("dt_bias"), op, op.i("value_heads"));
}

constexpr std::array<BindFn, ir::kOpKindCount> kBind = [] {
  std::array<BindFn, ir::kOpKindCount> t{};
  t[(size_t)OpKind::embed] = bind_embed;
  t[(size_t)OpKind::rmsnorm] = bind_norm;
  t[(size_t)OpKind::rmsnorm_quant] = bind_norm;
  t[(size_t)OpKind::add_rmsnorm_quant] = bind_norm;  // the norm's weight, of the sum's width
  t[(size_t)OpKind::quantize] = bind_none;
  t[(size_t)OpKind::matmul] = bind_matmul;
  t[(size_t)OpKind::matmul_stack] = bind_matmul_stack;
  t[(size_t)OpKind::add] = bind_none;
  t[(size_t)OpKind::swiglu] = bind_none;
  t[(size_t)OpKind::swiglu_quant] = bind_none;
  t[(size_t)OpKind::conv1d_silu] = bind_conv;
  t[(size_t)OpKind::gdn] = bind_gdn;
  t[(size_t)OpKind::gated_rmsnorm] = bind_head_norm;
  t[(size_t)OpKind::head_rmsnorm] = bind_head_norm;
  t[(size_t)OpKind::rope] = bind_none;
  t[(size_t)OpKind::kv_write] = bind_kv;
  t[(size_t)OpKind::attention] = bind_kv;
  t[(size_t)OpKind::gather_rows] = bind_none;
  t[(size_t)OpKind::bridge] = bind_none;
  t[(size_t)OpKind::concat] = bind_none;
  return t;
}();

// ---- run table ------------------------------------------------------------------------------------------

struct RunCx {
  const BoundGraph& g;
  std::vector<std::vector<float>>& vals;
  CpuSequence& seq;
  const std::vector<int32_t>& tokens;
  const std::vector<int32_t>& pos;
  const std::vector<int32_t>& rows;
  int64_t T, R;
  const float* hidden_in = nullptr;  // a stage's incoming bridge rows
  float* val(int id) const { return vals[(size_t)id].data(); }
  int64_t n(const Step& s) const { return s.b->rows ? R : T; }
  float* out(const Step& s, size_t k = 0) const { return val(s.b->results[k]); }
  float* in(const Step& s, size_t a) const { return val(s.b->args[a]); }
  float* state(int i) const { return seq.buffers[(size_t)i].data(); }
};
using RunFn = void (*)(const RunCx&, const Step&);

// The dp4a family's matmul input, as the matmul sees it: int8 per 32 values (cpu::quantize_q8_activation), with
// the second plane in steps of at most precise_rows rows, dequantized back to f32.
void quantize_rows(const float* x, int64_t rows, int64_t width, int64_t precise_rows, float* out) {
  const int64_t n = rows * width;
  const bool two = rows <= precise_rows;
  std::vector<int8_t> q((size_t)n), q2(two ? (size_t)n : 0);
  std::vector<float> d((size_t)(n / 32));
  cpu::quantize_q8_activation(x, n, q.data(), d.data(), two ? q2.data() : nullptr);
  for (int64_t i = 0; i < n; ++i) {
    const float db = d[(size_t)(i / 32)];
    out[i] = two ? db * std::fma((float)q2[(size_t)i], 1.0f / 254.0f, (float)q[(size_t)i]) : (float)q[(size_t)i] * db;
  }
}

void run_embed(const RunCx& c, const Step& s) { cpu::embed(s.w[0], c.tokens.data(), c.T, c.out(s)); }
void run_rmsnorm(const RunCx& c, const Step& s) {
  cpu::rmsnorm(c.in(s, 0), s.vec, c.n(s), c.g.width(s.b->results[0]), (float)s.b->op->f("eps"), c.out(s));
}
void run_rmsnorm_quant(const RunCx& c, const Step& s) {
  const int64_t w = c.g.width(s.b->results[0]);
  std::vector<float> normed((size_t)(c.n(s) * w));
  cpu::rmsnorm(c.in(s, 0), s.vec, c.n(s), w, (float)s.b->op->f("eps"), normed.data());
  quantize_rows(normed.data(), c.n(s), w, s.b->op->i("precise_rows"), c.out(s));
}
// The fusions into the quantization (the CUDA kernels make the same values in one launch): exactly the unfused ops.
void run_add_rmsnorm_quant(const RunCx& c, const Step& s) {
  const int64_t n = c.n(s), w = c.g.width(s.b->results[0]);
  cpu::add(c.in(s, 0), c.in(s, 1), n * w, c.out(s, 0));
  std::vector<float> normed((size_t)(n * w));
  cpu::rmsnorm(c.out(s, 0), s.vec, n, w, (float)s.b->op->f("eps"), normed.data());
  quantize_rows(normed.data(), n, w, s.b->op->i("precise_rows"), c.out(s, 1));
}
void run_swiglu_quant(const RunCx& c, const Step& s) {
  const int64_t n = c.n(s), w = c.g.width(s.b->results[0]);
  std::vector<float> act((size_t)(n * w));
  cpu::swiglu(c.in(s, 0), c.in(s, 1), n * w, act.data());
  quantize_rows(act.data(), n, w, s.b->op->i("precise_rows"), c.out(s));
}
void run_quantize(const RunCx& c, const Step& s) {
  quantize_rows(c.in(s, 0), c.n(s), c.g.width(s.b->results[0]), s.b->op->i("precise_rows"), c.out(s));
}
void run_matmul(const RunCx& c, const Step& s) { cpu::matmul(s.w[0], c.in(s, 0), c.n(s), c.out(s)); }
void run_matmul_stack(const RunCx& c, const Step& s) {
  for (size_t k = 0; k < s.w.size(); ++k) cpu::matmul(s.w[k], c.in(s, 0), c.n(s), c.out(s, k));
}
void run_add(const RunCx& c, const Step& s) {
  cpu::add(c.in(s, 0), c.in(s, 1), c.n(s) * c.g.width(s.b->results[0]), c.out(s));
}
void run_swiglu(const RunCx& c, const Step& s) {
  cpu::swiglu(c.in(s, 0), c.in(s, 1), c.n(s) * c.g.width(s.b->results[0]), c.out(s));
}
// A verify step (CpuSequence::keep): token by token (the same arithmetic as whole: both ops are token-serial), the
// state copied after each of the first `keep` tokens.
void keep_state(const RunCx& c, int state, int64_t t) {
  auto& dst = c.seq.kept[(size_t)state];
  const auto& src = c.seq.buffers[(size_t)state];
  std::copy(src.begin(), src.end(), dst.begin() + t * (int64_t)src.size());
}
int64_t kept_tokens(const RunCx& c) { return std::min<int64_t>(c.seq.keep, c.T - 1); }
void run_conv(const RunCx& c, const Step& s) {
  const int64_t W = c.g.width(s.b->results[0]), keep = kept_tokens(c);
  if (keep <= 0) {
    cpu::conv1d_causal_silu(c.in(s, 0), c.T, W, s.vec, s.taps, c.state(s.b->state), c.out(s));
    return;
  }
  for (int64_t t = 0; t < c.T; ++t) {
    cpu::conv1d_causal_silu(c.in(s, 0) + t * W, 1, W, s.vec, s.taps, c.state(s.b->state), c.out(s) + t * W);
    if (t < keep) keep_state(c, s.b->state, t);
  }
}
void run_gdn(const RunCx& c, const Step& s) {
  const ir::Op& op = *s.b->op;
  const cpu::GdnShape sh{op.i("key_heads"), op.i("value_heads"), op.i("key_dim"), op.i("value_dim")};
  float* st = c.state(s.b->state);
  if (const int64_t keep = kept_tokens(c); keep > 0) {
    if (c.T >= op.i_or("recurrent_below", 1))
      throw RuntimeError(fmt::format("{}: a verify step of {} tokens would run the chunked GDN", op.describe(), c.T));
    const int64_t conv_dim = c.g.width(s.b->args[0]), hv = sh.Hv, out_w = c.g.width(s.b->results[0]);
    for (int64_t t = 0; t < c.T; ++t) {
      cpu::gdn_recurrent(sh, c.in(s, 0) + t * conv_dim, c.in(s, 1) + t * hv, c.in(s, 2) + t * hv, s.ssm_a, s.dt_bias,
                         1, st, c.out(s) + t * out_w);
      if (t < keep) keep_state(c, s.b->state, t);
    }
    return;
  }
  if (c.T < op.i_or("recurrent_below", 1))
    cpu::gdn_recurrent(sh, c.in(s, 0), c.in(s, 1), c.in(s, 2), s.ssm_a, s.dt_bias, c.T, st, c.out(s));
  else
    cpu::gdn_chunked(sh, c.in(s, 0), c.in(s, 1), c.in(s, 2), s.ssm_a, s.dt_bias, c.T, st, c.out(s),
                     op.i_or("chunk", 64));
}
void run_gated_rmsnorm(const RunCx& c, const Step& s) {
  const ir::Op& op = *s.b->op;
  cpu::gated_rmsnorm(c.in(s, 0), c.in(s, 1), s.vec, c.T, op.i("heads"), op.i("head_dim"), (float)op.f("eps"), c.out(s));
}
void run_head_rmsnorm(const RunCx& c, const Step& s) {
  const ir::Op& op = *s.b->op;
  cpu::head_rmsnorm(c.in(s, 0), c.g.width(s.b->args[0]), op.i("head_stride"), op.i("head_offset"), s.vec, c.T,
                    op.i("heads"), op.i("head_dim"), (float)op.f("eps"), c.out(s));
}
void run_rope(const RunCx& c, const Step& s) {
  const ir::Op& op = *s.b->op;
  const int64_t w = c.g.width(s.b->results[0]);
  std::copy(c.in(s, 0), c.in(s, 0) + c.T * w, c.out(s));
  cpu::rope_neox(c.out(s), c.pos.data(), c.T, op.i("heads"), op.i("head_dim"), op.i("rope_dims"), (float)op.f("theta"));
}
void run_kv_write(const RunCx& c, const Step& s) {
  for (const auto& [arg, state] : {std::pair{0, s.b->k_state}, std::pair{1, s.b->v_state}}) {
    const BoundState& st = c.g.states[(size_t)state];
    const int64_t width = st.row_width;
    float* cache = c.state(state);
    if (const auto f = quantized_format(st.dtype)) {  // rows in the GPU's byte layout (kernels/kv_format.h)
      const int64_t rb = kernels::kv_row_bytes(*f, width, true);
      uint8_t* bytes = reinterpret_cast<uint8_t*>(cache);
      for (int64_t t = 0; t < c.T; ++t)
        cpu::kv_quantize_row(*f, c.in(s, (size_t)arg) + t * width, width, s.b->op->i("layer"),
                             bytes + (int64_t)c.pos[(size_t)t] * rb);
      continue;
    }
    for (int64_t t = 0; t < c.T; ++t) {
      float* row = cache + (int64_t)c.pos[(size_t)t] * width;
      std::copy(c.in(s, (size_t)arg) + t * width, c.in(s, (size_t)arg) + (t + 1) * width, row);
      if (st.dtype == ir::DType::f16)  // the cache holds fp16 values (as a GPU's does)
        for (int64_t j = 0; j < width; ++j) row[j] = gguf::fp16_to_float(gguf::float_to_fp16(row[j]));
    }
  }
}
void run_attention(const RunCx& c, const Step& s) {
  const ir::Op& op = *s.b->op;
  auto view = [&](int state) {
    const BoundState& st = c.g.states[(size_t)state];
    const auto f = quantized_format(st.dtype);
    return cpu::KvCacheView{f ? *f : kernels::KvFormat::f32, reinterpret_cast<const uint8_t*>(c.state(state)),
                            f ? kernels::kv_row_bytes(*f, st.row_width, true) : st.row_width * 4};
  };
  // The plan's int8 query (the dp4a family's decode kernels over quantized keys): calls of at most
  // query_int8_tokens tokens of the sequence.
  const bool int8_query = op.has("query_int8_tokens") && c.T <= op.i("query_int8_tokens");
  cpu::attention_gated_kv(c.in(s, 0), view(s.b->k_state), view(s.b->v_state), op.i("layer"), c.T, c.seq.n_past,
                          op.i("heads"), op.i("kv_heads"), op.i("head_dim"), (float)op.f("scale"),
                          c.in(s, 1) + op.i("gate_offset"), c.g.width(s.b->args[1]), op.i("gate_head_stride"),
                          c.out(s), int8_query);
}
void run_gather_rows(const RunCx& c, const Step& s) {
  const int64_t w = c.g.width(s.b->results[0]);
  const float* x = c.in(s, 0);
  for (int64_t r = 0; r < c.R; ++r)
    std::copy(x + c.rows[(size_t)r] * w, x + (c.rows[(size_t)r] + 1) * w, c.out(s) + r * w);
}

// The receiving side of a bridge: the rows arrived in the stage's input (RunCx::hidden_in); in a one-stage
// executor of a multi-stage plan (every op), the value itself.
void run_bridge(const RunCx& c, const Step& s) {
  const int64_t n = c.T * c.g.width(s.b->results[0]);
  const float* src = c.hidden_in ? c.hidden_in : c.in(s, 0);
  std::copy(src, src + n, c.out(s));
}

void run_concat(const RunCx& c, const Step& s) {
  cpu::concat_rows(c.in(s, 0), c.g.width(s.b->args[0]), c.in(s, 1), c.g.width(s.b->args[1]), c.n(s), c.out(s));
}

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
  t[(size_t)OpKind::conv1d_silu] = run_conv;
  t[(size_t)OpKind::gdn] = run_gdn;
  t[(size_t)OpKind::gated_rmsnorm] = run_gated_rmsnorm;
  t[(size_t)OpKind::head_rmsnorm] = run_head_rmsnorm;
  t[(size_t)OpKind::rope] = run_rope;
  t[(size_t)OpKind::kv_write] = run_kv_write;
  t[(size_t)OpKind::attention] = run_attention;
  t[(size_t)OpKind::gather_rows] = run_gather_rows;
  t[(size_t)OpKind::bridge] = run_bridge;
  t[(size_t)OpKind::concat] = run_concat;
  return t;
}();

}  // namespace

bool cpu_op_tables_complete() {
  for (size_t k = 0; k < ir::kOpKindCount; ++k)
    if (!kBind[k] || !kRun[k]) return false;
  return true;
}

CpuExecutor::~CpuExecutor() = default;
CpuExecutor::CpuExecutor(CpuExecutor&&) noexcept = default;

CpuExecutor::CpuExecutor(const ir::Plan& plan, std::shared_ptr<const gguf::File> file, const std::string& device,
                         bool draft)
    : plan_(plan), file_(std::move(file)), device_(device) {
  if (draft && plan_.draft_tokens <= 0) throw RuntimeError("the plan has no draft graph (draft_tokens = 0)");
  if (plan_.backend != "cpu")
    throw RuntimeError(fmt::format("the CPU executor cannot run a '{}' plan", plan_.backend));
  if (!device_.empty()) {
    bool found = false;
    for (const auto& pl : plan_.placement) found |= pl.device == device_;
    if (!found) throw RuntimeError(fmt::format("the plan has no stage on '{}'", device_));
  }
  if (plan_.threads > 0) cpu::set_num_threads((int)plan_.threads);
  graph_ = std::make_unique<BoundGraph>(plan_, draft ? plan_.draft : plan_.graph);
  if (graph_->has_hidden != draft) throw RuntimeError("a draft graph (and only it) has a %hidden input");
  own_state_.assign(graph_->states.size(), device_.empty());
  const BindCx cx{*file_, *graph_, vocab_rows_};
  for (const BoundOp& b : graph_->ops) {
    const std::string& dev = b.op->s("device");
    if (!device_.empty() && b.kind == OpKind::bridge && b.op->s("from") == device_) bridge_out_ = b.args[0];
    if (!device_.empty() && dev != device_) continue;
    if (!device_.empty() && b.kind == OpKind::bridge) bridge_in_ = b.results[0];
    for (int st : {b.state, b.k_state, b.v_state})
      if (st >= 0) own_state_[(size_t)st] = true;
    Step s;
    s.b = &b;
    kBind[(size_t)b.kind](cx, s);
    steps_.push_back(std::move(s));
  }
  // Stages without the embedding still take token ids (for the step's shape and checks): the table's rows.
  if (vocab_rows_ <= 0)
    if (const gguf::TensorInfo* t = file_->find_tensor("token_embd.weight"); t && t->ne.size() == 2)
      vocab_rows_ = (int64_t)t->ne[1];
  if (vocab_rows_ <= 0) throw RuntimeError("graph has no embedding");
}

int64_t CpuExecutor::bridge_width() const { return bridge_out_ < 0 ? 0 : graph_->width(bridge_out_); }

CpuSequence CpuExecutor::new_sequence() const {
  CpuSequence s;
  for (size_t i = 0; i < graph_->states.size(); ++i)
    s.buffers.emplace_back(own_state_[i] ? (size_t)state_floats(graph_->states[i]) : 0, 0.0f);
  return s;
}

int64_t CpuExecutor::sequence_bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < graph_->states.size(); ++i)
    if (own_state_[i]) b += state_floats(graph_->states[i]) * 4;
  return b;
}

std::vector<float> CpuExecutor::forward(CpuSequence& seq, const std::vector<int32_t>& tokens,
                                        const std::vector<int32_t>& rows, const TapFn& tap, const float* hidden_in,
                                        float* hidden_out) const {
  const int64_t T = (int64_t)tokens.size();
  const int64_t R = (int64_t)rows.size();
  if (T == 0) throw RuntimeError("forward with no tokens");
  if (seq.buffers.size() != graph_->states.size()) throw RuntimeError("sequence does not belong to this executor");
  if (seq.n_past + T > plan_.context_length)
    throw RuntimeError(fmt::format("context overflow: {} tokens in the sequence + {} new > context length {}",
                                   seq.n_past, T, plan_.context_length));
  for (int32_t t : tokens)
    if (t < 0 || t >= vocab_rows_) throw RuntimeError(fmt::format("token id {} is out of range [0, {})", t, vocab_rows_));
  for (int32_t r : rows)
    if (r < 0 || r >= T) throw RuntimeError(fmt::format("output row {} is out of range [0, {})", r, T));
  if (graph_->has_hidden) {
    if (!hidden_in || hidden_out) throw RuntimeError("the draft head takes its %hidden rows and hands on none");
  } else if ((bridge_in_ >= 0) != (hidden_in != nullptr) || (bridge_out_ >= 0) != (hidden_out != nullptr))
    throw RuntimeError(fmt::format("stage {}: the incoming and outgoing rows must be given exactly where the stage "
                                   "has bridges", device_));

  std::vector<int32_t> pos((size_t)T);
  for (int64_t t = 0; t < T; ++t) pos[(size_t)t] = (int32_t)(seq.n_past + t);
  // Everything that can be wrong with the request was checked above: from here on the states change.
  std::vector<std::vector<float>> vals(graph_->values.size());
  if (graph_->has_hidden) vals[BoundGraph::kHidden].assign(hidden_in, hidden_in + T * hidden_width());
  // A verify step keeps the non-positional states after each of its first tokens (CpuSequence::keep).
  seq.kept_from = -1;
  seq.kept_count = 0;
  const int64_t keep = std::min<int64_t>(seq.keep, T - 1);
  seq.keep = 0;
  if (keep > 0) {
    seq.kept.resize(seq.buffers.size());
    for (size_t i = 0; i < seq.buffers.size(); ++i)
      if (!graph_->states[i].positional && own_state_[i]) seq.kept[i].resize(seq.buffers[i].size() * (size_t)keep);
    seq.keep = keep;
  }
  const RunCx cx{*graph_, vals, seq, tokens, pos, rows, T, R, graph_->has_hidden ? nullptr : hidden_in};
  for (const Step& s : steps_) {
    const int64_t n = s.b->rows ? R : T;
    for (int r : s.b->results) vals[(size_t)r].assign((size_t)(n * graph_->width(r)), NAN);
    kRun[(size_t)s.b->kind](cx, s);
    if (tap && !s.b->tap.empty()) tap(s.b->tap, cx.out(s), n, graph_->width(s.b->results[0]));
  }
  if (keep > 0) {
    seq.kept_from = seq.n_past;
    seq.kept_count = keep;
    seq.keep = 0;
  }
  seq.n_past += T;
  if (bridge_out_ >= 0) {
    const auto& v = vals[(size_t)bridge_out_];
    std::copy(v.begin(), v.end(), hidden_out);
    return {};
  }
  return std::move(vals[(size_t)graph_->logits]);
}

}  // namespace qrig::runtime
