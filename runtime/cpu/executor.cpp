// CpuExecutor: binds the plan's graph to weights and op functions once, then interprets it per call.
#include "runtime/cpu/executor.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "runtime/cpu/thread_pool.h"

namespace qrig::runtime {

void CpuSequence::reset() {
  for (auto& b : buffers) std::fill(b.begin(), b.end(), 0.0f);
  n_past = 0;
}

// One bound op: argument/result value slots, weights resolved to pointers.
struct CpuExecutor::Step {
  const ir::Op* op;
  std::string kind;
  int64_t result = -1;              // value slot
  std::vector<int64_t> args;        // value slots; inputs are slots 0 (tokens), 1 (pos), 2 (rows)
  int64_t width = 0;                // result columns (last dim)
  bool rows_result = false;         // result has R rows instead of T
  cpu::Matrix w{};                  // matmul / embed
  const float* vec = nullptr;       // norm weights, conv weight
  const float* vec2 = nullptr;      // gdn dt_bias
  const float* vec3 = nullptr;      // gdn ssm_a
  int64_t state = -1;               // state index
  std::string tap;
};

namespace {

constexpr int64_t kTokensSlot = 0, kPosSlot = 1, kRowsSlot = 2;

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

}  // namespace

std::shared_ptr<const gguf::File> open_plan_model(const ir::Plan& plan) {
  auto f = std::make_shared<gguf::File>(gguf::File::open(plan.model_path));
  if ((int64_t)f->file_size() != plan.model_size)
    throw RuntimeError(fmt::format("{} has {} bytes but the plan was compiled for a file of {} bytes: recompile the plan",
                                   plan.model_path, f->file_size(), plan.model_size));
  return f;
}

CpuExecutor::~CpuExecutor() = default;
CpuExecutor::CpuExecutor(CpuExecutor&&) noexcept = default;

CpuExecutor::CpuExecutor(const ir::Plan& plan, std::shared_ptr<const gguf::File> file)
    : plan_(plan), file_(std::move(file)) {
  if (plan_.backend != "cpu")
    throw RuntimeError(fmt::format("the CPU executor cannot run a '{}' plan", plan_.backend));
  if (plan_.threads > 0) cpu::set_num_threads((int)plan_.threads);
  const ir::Graph& g = plan_.graph;
  const gguf::File& f = *file_;
  std::map<std::string, int64_t> slot;
  for (const char* in : {"tokens", "pos", "rows"}) {
    bool found = false;
    for (const auto& i : g.inputs) found |= i.name == in;
    if (!found) throw RuntimeError(fmt::format("graph lacks input %{}", in));
    slot[in] = (int64_t)slot.size();
  }
  if (g.inputs.size() != 3) throw RuntimeError("graph inputs must be %tokens, %pos, %rows");
  std::map<std::string, int64_t> state_index;
  for (const auto& st : g.states) {
    if (st.type.dtype != ir::DType::f32)
      throw RuntimeError(fmt::format("state %{} is {}: the CPU backend keeps state in f32", st.name,
                                     ir::dtype_name(st.type.dtype)));
    state_index[st.name] = (int64_t)state_shapes_.size();
    std::vector<int64_t> shape;
    for (int64_t d : st.type.shape) shape.push_back(d == ir::kContext ? plan_.context_length : d);
    state_shapes_.push_back(shape);
  }
  for (const ir::Op& op : g.ops) {
    Step s;
    s.op = &op;
    s.kind = op.kind;
    for (const auto& a : op.args) s.args.push_back(slot.at(a));
    if (!op.result.empty()) {
      if (op.type.shape.size() != 2) throw RuntimeError(fmt::format("{}: results must be 2-D", op.describe()));
      s.width = op.type.shape[1];
      s.rows_result = op.type.shape[0] == ir::kRows;
    }
    if (op.has("tap")) s.tap = op.s("tap");
    if (op.has("state")) s.state = state_index.at(op.s("state"));
    if (op.has("cache")) s.state = state_index.at(op.s("cache"));
    if (op.kind == "matmul" || op.kind == "embed") {
      const gguf::TensorInfo& t = need_tensor(f, op.s("weight"), op);
      if (t.ne.size() != 2 || !gguf::can_dequantize(t.type))
        throw RuntimeError(fmt::format("{}: weight '{}' ({} {}) is not a supported matrix", op.describe(), t.name,
                                       gguf::tensor_type_name(t.type), t.shape_string()));
      s.w = {t.type, f.tensor_data(t), (int64_t)t.ne[0], (int64_t)t.ne[1]};
      int64_t want = op.kind == "embed" ? s.w.in : s.w.out;
      if (want != s.width)
        throw RuntimeError(fmt::format("{}: weight '{}' {} does not give {} columns", op.describe(), t.name,
                                       t.shape_string(), s.width));
      if (op.kind == "matmul") {
        const ir::Type* at = g.type_of(op.args[0]);
        if (!at || at->shape.back() != s.w.in)
          throw RuntimeError(fmt::format("{}: input width does not match weight '{}' {}", op.describe(), t.name,
                                         t.shape_string()));
      }
      if (op.kind == "embed") vocab_rows_ = s.w.out;
      if (op.kind == "matmul" && op.result == "logits") vocab_rows_ = s.w.out;
    } else if (op.kind == "rmsnorm") {
      s.vec = f32_vector(f, op.s("weight"), op, s.width);
    } else if (op.kind == "head_rmsnorm") {
      s.vec = f32_vector(f, op.s("weight"), op, op.i("head_dim"));
    } else if (op.kind == "gated_rmsnorm") {
      s.vec = f32_vector(f, op.s("weight"), op, op.i("head_dim"));
    } else if (op.kind == "conv1d_silu") {
      const auto& shape = state_shapes_.at(s.state);
      s.vec = f32_vector(f, op.s("weight"), op, (shape[0] + 1) * s.width);
    } else if (op.kind == "gdn") {
      int64_t hv = op.i("value_heads");
      s.vec3 = f32_vector(f, op.s("ssm_a"), op, hv);
      s.vec2 = f32_vector(f, op.s("dt_bias"), op, hv);
    }
    if (!op.result.empty()) slot[op.result] = (int64_t)slot.size();
    s.result = op.result.empty() ? -1 : slot.at(op.result);
    steps_.push_back(std::move(s));
  }
  n_values_ = (int64_t)slot.size();
  if (g.outputs.size() != 1 || g.outputs[0] != "logits") throw RuntimeError("graph output must be %logits");
}

CpuSequence CpuExecutor::new_sequence() const {
  CpuSequence s;
  for (const auto& shape : state_shapes_) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    s.buffers.emplace_back((size_t)n, 0.0f);
  }
  return s;
}

std::vector<float> CpuExecutor::forward(CpuSequence& seq, const std::vector<int32_t>& tokens,
                                        const std::vector<int32_t>& rows, const TapFn& tap) const {
  const int64_t T = (int64_t)tokens.size();
  const int64_t R = (int64_t)rows.size();
  if (T == 0) throw RuntimeError("forward with no tokens");
  if (seq.buffers.size() != state_shapes_.size()) throw RuntimeError("sequence does not belong to this executor");
  if (seq.n_past + T > plan_.context_length)
    throw RuntimeError(fmt::format("context overflow: {} tokens in the sequence + {} new > context length {}",
                                   seq.n_past, T, plan_.context_length));
  for (int32_t t : tokens)
    if (t < 0 || t >= vocab_rows_) throw RuntimeError(fmt::format("token id {} is out of range [0, {})", t, vocab_rows_));
  for (int32_t r : rows)
    if (r < 0 || r >= T) throw RuntimeError(fmt::format("output row {} is out of range [0, {})", r, T));

  std::vector<int32_t> pos((size_t)T);
  for (int64_t t = 0; t < T; ++t) pos[(size_t)t] = (int32_t)(seq.n_past + t);
  // Everything that can be wrong with the request was checked above: from here on the states change.
  std::vector<std::vector<float>>& states = seq.buffers;
  std::vector<std::vector<float>> vals((size_t)n_values_);
  auto val = [&](int64_t slot) -> float* { return vals[(size_t)slot].data(); };

  for (const Step& s : steps_) {
    const ir::Op& op = *s.op;
    const int64_t rows_out = s.rows_result ? R : T;
    float* out = nullptr;
    if (s.result >= 0) {
      vals[(size_t)s.result].assign((size_t)(rows_out * s.width), NAN);
      out = val(s.result);
    }
    if (s.kind == "embed") {
      cpu::embed(s.w, tokens.data(), T, out);
    } else if (s.kind == "rmsnorm") {
      cpu::rmsnorm(val(s.args[0]), s.vec, rows_out, s.width, (float)op.f("eps"), out);
    } else if (s.kind == "matmul") {
      if (emulate_dp4a_) {
        const int64_t n = rows_out * s.w.in;
        const bool two = rows_out <= emulate_precise_rows_;
        std::vector<int8_t> q((size_t)n), q2(two ? (size_t)n : 0);
        std::vector<float> d((size_t)(n / 32)), xq((size_t)n);
        cpu::quantize_q8_activation(val(s.args[0]), n, q.data(), d.data(), two ? q2.data() : nullptr);
        for (int64_t i = 0; i < n; ++i) {
          const float db = d[(size_t)(i / 32)];
          xq[(size_t)i] = two ? db * std::fma((float)q2[(size_t)i], 1.0f / 254.0f, (float)q[(size_t)i])
                              : (float)q[(size_t)i] * db;
        }
        cpu::matmul(s.w, xq.data(), rows_out, out);
      } else {
        cpu::matmul(s.w, val(s.args[0]), rows_out, out);
      }
    } else if (s.kind == "add") {
      cpu::add(val(s.args[0]), val(s.args[1]), rows_out * s.width, out);
    } else if (s.kind == "swiglu") {
      cpu::swiglu(val(s.args[0]), val(s.args[1]), rows_out * s.width, out);
    } else if (s.kind == "conv1d_silu") {
      const int64_t K = state_shapes_[(size_t)s.state][0] + 1;
      cpu::conv1d_causal_silu(val(s.args[0]), T, s.width, s.vec, K, states[(size_t)s.state].data(), out);
    } else if (s.kind == "gdn") {
      cpu::GdnShape sh{op.i("key_heads"), op.i("value_heads"), op.i("key_dim"), op.i("value_dim")};
      float* st = states[(size_t)s.state].data();
      if (T < op.i_or("recurrent_below", 1))
        cpu::gdn_recurrent(sh, val(s.args[0]), val(s.args[1]), val(s.args[2]), s.vec3, s.vec2, T, st, out);
      else
        cpu::gdn_chunked(sh, val(s.args[0]), val(s.args[1]), val(s.args[2]), s.vec3, s.vec2, T, st, out,
                         op.i_or("chunk", 64));
    } else if (s.kind == "gated_rmsnorm") {
      cpu::gated_rmsnorm(val(s.args[0]), val(s.args[1]), s.vec, T, op.i("heads"), op.i("head_dim"),
                         (float)op.f("eps"), out);
    } else if (s.kind == "head_rmsnorm") {
      const ir::Type* in = plan_.graph.type_of(op.args[0]);
      cpu::head_rmsnorm(val(s.args[0]), in->shape[1], op.i("head_stride"), op.i("head_offset"), s.vec, T,
                        op.i("heads"), op.i("head_dim"), (float)op.f("eps"), out);
    } else if (s.kind == "rope") {
      std::copy(val(s.args[0]), val(s.args[0]) + T * s.width, out);
      cpu::rope_neox(out, pos.data(), T, op.i("heads"), op.i("head_dim"), op.i("rope_dims"), (float)op.f("theta"));
    } else if (s.kind == "kv_write") {
      float* cache = states[(size_t)s.state].data();
      const int64_t width = state_shapes_[(size_t)s.state][2];
      const int64_t ctx = state_shapes_[(size_t)s.state][1];
      for (int64_t t = 0; t < T; ++t) {
        std::copy(val(s.args[0]) + t * width, val(s.args[0]) + (t + 1) * width, cache + (pos[(size_t)t]) * width);
        std::copy(val(s.args[1]) + t * width, val(s.args[1]) + (t + 1) * width,
                  cache + (ctx + pos[(size_t)t]) * width);
        if (emulate_dp4a_)
          for (float* row : {cache + pos[(size_t)t] * width, cache + (ctx + pos[(size_t)t]) * width})
            for (int64_t j = 0; j < width; ++j) row[j] = gguf::fp16_to_float(gguf::float_to_fp16(row[j]));
      }
    } else if (s.kind == "attention") {
      const float* cache = states[(size_t)s.state].data();
      const int64_t width = state_shapes_[(size_t)s.state][2];
      const int64_t ctx = state_shapes_[(size_t)s.state][1];
      const ir::Type* gt = plan_.graph.type_of(op.args[1]);
      cpu::attention_gated(val(s.args[0]), cache, cache + ctx * width, T, seq.n_past, op.i("heads"), op.i("kv_heads"),
                           op.i("head_dim"), (float)op.f("scale"), val(s.args[1]) + op.i("gate_offset"),
                           gt->shape[1], op.i("gate_head_stride"), out);
    } else if (s.kind == "gather_rows") {
      const float* x = val(s.args[0]);
      for (int64_t r = 0; r < R; ++r) std::copy(x + rows[(size_t)r] * s.width, x + (rows[(size_t)r] + 1) * s.width, out + r * s.width);
    } else {
      throw RuntimeError(fmt::format("the CPU backend has no op '{}'", s.kind));
    }
    if (tap && !s.tap.empty()) tap(s.tap, out, rows_out, s.width);
  }
  seq.n_past += T;
  return std::move(vals[(size_t)steps_.back().result]);
}

}  // namespace qrig::runtime
