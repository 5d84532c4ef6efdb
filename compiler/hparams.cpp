// Reading and validating qwen35 hyperparameters and the tensor table (see ../shared/QWEN35.md, GGUF section).
#include "compiler/hparams.h"

#include <cmath>

#include <fmt/format.h>

namespace qrig::compiler {

namespace {

int64_t positive(const gguf::File& f, const std::string& key) {
  uint64_t v;
  try {
    v = f.get_uint(key);
  } catch (const gguf::Error& e) {
    throw CompileError(e.what());
  }
  if (v == 0 || v > (1ull << 31)) throw CompileError(fmt::format("{}: '{}' = {} is out of range", f.path(), key, v));
  return (int64_t)v;
}

// A float hyperparameter, finite and within [lo, hi]: a broken file (rope.freq_base = 0, a NaN epsilon) is
// refused when the model is compiled, not answered with a 500 on every request.
double in_range(const gguf::File& f, const std::string& key, double lo, double hi) {
  double v;
  try {
    v = f.get_float(key);
  } catch (const gguf::Error& e) {
    throw CompileError(e.what());
  }
  if (!std::isfinite(v) || v < lo || v > hi)
    throw CompileError(fmt::format("{}: '{}' = {} is out of range (a finite value in [{:g}, {:g}])", f.path(), key, v, lo, hi));
  return v;
}

void check_tensor(const gguf::File& f, const std::string& name, std::vector<int64_t> ne, bool matrix) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) throw CompileError(fmt::format("{}: tensor '{}' is missing", f.path(), name));
  std::vector<uint64_t> want(ne.begin(), ne.end());
  if (t->ne != want) {
    std::string w = "[";
    for (size_t k = 0; k < ne.size(); ++k) w += (k ? ", " : "") + std::to_string(ne[k]);
    throw CompileError(fmt::format("{}: tensor '{}' has shape {}, the hyperparameters need {}]", f.path(), name,
                                   t->shape_string(), w));
  }
  if (!gguf::can_dequantize(t->type))
    throw CompileError(fmt::format("{}: tensor '{}' has type {}, which qrig does not support yet (supported: {})",
                                   f.path(), name, gguf::tensor_type_name(t->type), gguf::dequantizable_types()));
  if (!matrix && t->type != gguf::TensorType::F32)
    throw CompileError(fmt::format("{}: vector tensor '{}' must be F32, is {}", f.path(), name,
                                   gguf::tensor_type_name(t->type)));
}

}  // namespace

Qwen35Params Qwen35Params::from_gguf(const gguf::File& f) {
  Qwen35Params p;
  auto arch = f.opt_string("general.architecture");
  if (!arch) throw CompileError(fmt::format("{}: no general.architecture key", f.path()));
  p.arch = *arch;
  if (p.arch != "qwen35") {
    if (p.arch == "qwen35moe")
      throw CompileError(fmt::format("{}: architecture 'qwen35moe' (Qwen3.5 MoE) is not supported yet; qrig runs the "
                                     "dense 'qwen35' models", f.path()));
    throw CompileError(fmt::format("{}: architecture '{}' is not supported (qrig runs 'qwen35')", f.path(), p.arch));
  }
  p.name = f.opt_string("general.name").value_or("");
  const std::string a = "qwen35.";
  int64_t blocks = positive(f, a + "block_count");
  p.n_mtp = f.find(a + "nextn_predict_layers") ? (int64_t)f.get_uint(a + "nextn_predict_layers") : 0;
  if (p.n_mtp >= blocks) throw CompileError(fmt::format("{}: nextn_predict_layers {} >= block_count {}", f.path(), p.n_mtp, blocks));
  p.n_layer = blocks - p.n_mtp;
  p.d = positive(f, a + "embedding_length");
  p.ffn = positive(f, a + "feed_forward_length");
  p.n_head = positive(f, a + "attention.head_count");
  p.n_head_kv = positive(f, a + "attention.head_count_kv");
  p.head_dim = positive(f, a + "attention.key_length");
  int64_t vlen = positive(f, a + "attention.value_length");
  if (vlen != p.head_dim)
    throw CompileError(fmt::format("{}: attention.value_length {} differs from key_length {}", f.path(), vlen, p.head_dim));
  if (p.n_head % p.n_head_kv)
    throw CompileError(fmt::format("{}: attention.head_count {} is not a multiple of head_count_kv {}", f.path(), p.n_head, p.n_head_kv));
  p.eps = in_range(f, a + "attention.layer_norm_rms_epsilon", 1e-12, 1e-1);
  p.rope_theta = in_range(f, a + "rope.freq_base", 1.0, 1e12);
  p.rope_dims = positive(f, a + "rope.dimension_count");
  if (p.rope_dims > p.head_dim || p.rope_dims % 2)
    throw CompileError(fmt::format("{}: rope.dimension_count {} must be even and <= head dim {}", f.path(), p.rope_dims, p.head_dim));
  if (f.find(a + "rope.dimension_sections")) {
    p.rope_sections = f.get_int_array(a + "rope.dimension_sections");
    int64_t sum = 0;
    for (int64_t x : p.rope_sections) {
      if (x < 0 || x > p.rope_dims)
        throw CompileError(fmt::format("{}: rope.dimension_sections holds {}, outside [0, {}]", f.path(), x, p.rope_dims));
      sum += x;
    }
    if (2 * sum > p.rope_dims)
      throw CompileError(fmt::format("{}: rope.dimension_sections sum to {}, more than half of rope.dimension_count {}",
                                     f.path(), sum, p.rope_dims));
  }
  p.conv_kernel = positive(f, a + "ssm.conv_kernel");
  p.ssm_head_dim = positive(f, a + "ssm.state_size");
  p.ssm_k_heads = positive(f, a + "ssm.group_count");
  p.ssm_v_heads = positive(f, a + "ssm.time_step_rank");
  p.ssm_inner = positive(f, a + "ssm.inner_size");
  if (p.ssm_v_heads % p.ssm_k_heads)
    throw CompileError(fmt::format("{}: ssm.time_step_rank {} (value heads) is not a multiple of ssm.group_count {} (key heads)",
                                   f.path(), p.ssm_v_heads, p.ssm_k_heads));
  if (p.ssm_inner != p.value_dim())
    throw CompileError(fmt::format("{}: ssm.inner_size {} != time_step_rank {} x state_size {}", f.path(), p.ssm_inner,
                                   p.ssm_v_heads, p.ssm_head_dim));
  p.full_attn_interval = positive(f, a + "full_attention_interval");
  if (p.conv_kernel > 64) throw CompileError(fmt::format("{}: ssm.conv_kernel {} is out of range (1..64)", f.path(), p.conv_kernel));
  p.context_length = positive(f, a + "context_length");
  for (int64_t dim : {p.d, p.ffn, p.head_dim, p.ssm_head_dim})
    if (dim % 32) throw CompileError(fmt::format("{}: dimension {} is not a multiple of 32", f.path(), dim));

  const gguf::TensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb || emb->ne.size() != 2) throw CompileError(fmt::format("{}: tensor 'token_embd.weight' missing or not 2-D", f.path()));
  p.vocab = (int64_t)emb->ne[1];
  check_tensor(f, "token_embd.weight", {p.d, p.vocab}, true);
  check_tensor(f, "output.weight", {p.d, p.vocab}, true);
  check_tensor(f, "output_norm.weight", {p.d}, false);
  const int64_t hd = p.head_dim, hq = p.n_head, hkv = p.n_head_kv;
  for (int64_t L = 0; L < p.n_layer; ++L) {
    auto n = [&](const char* t) { return fmt::format("blk.{}.{}.weight", L, t); };
    check_tensor(f, n("attn_norm"), {p.d}, false);
    check_tensor(f, n("post_attention_norm"), {p.d}, false);
    check_tensor(f, n("ffn_gate"), {p.d, p.ffn}, true);
    check_tensor(f, n("ffn_up"), {p.d, p.ffn}, true);
    check_tensor(f, n("ffn_down"), {p.ffn, p.d}, true);
    if (p.is_full_attention(L)) {
      check_tensor(f, n("attn_q"), {p.d, 2 * hq * hd}, true);
      check_tensor(f, n("attn_k"), {p.d, hkv * hd}, true);
      check_tensor(f, n("attn_v"), {p.d, hkv * hd}, true);
      check_tensor(f, n("attn_output"), {hq * hd, p.d}, true);
      check_tensor(f, n("attn_q_norm"), {hd}, false);
      check_tensor(f, n("attn_k_norm"), {hd}, false);
    } else {
      check_tensor(f, n("attn_qkv"), {p.d, p.conv_dim()}, true);
      check_tensor(f, n("attn_gate"), {p.d, p.value_dim()}, true);
      check_tensor(f, n("ssm_beta"), {p.d, p.ssm_v_heads}, true);
      check_tensor(f, n("ssm_alpha"), {p.d, p.ssm_v_heads}, true);
      check_tensor(f, n("ssm_conv1d"), {p.conv_kernel, p.conv_dim()}, false);
      check_tensor(f, fmt::format("blk.{}.ssm_dt.bias", L), {p.ssm_v_heads}, false);
      check_tensor(f, fmt::format("blk.{}.ssm_a", L), {p.ssm_v_heads}, false);
      check_tensor(f, n("ssm_norm"), {p.ssm_head_dim}, false);
      check_tensor(f, n("ssm_out"), {p.value_dim(), p.d}, true);
    }
  }
  // The MTP block(s): recognised and checked; the first is the draft head of speculative decoding (plan_draft.cpp).
  for (int64_t L = p.n_layer; L < blocks; ++L) {
    auto n = [&](const char* t) { return fmt::format("blk.{}.{}.weight", L, t); };
    check_tensor(f, n("nextn.eh_proj"), {2 * p.d, p.d}, true);
    check_tensor(f, n("nextn.enorm"), {p.d}, false);
    check_tensor(f, n("nextn.hnorm"), {p.d}, false);
    check_tensor(f, n("nextn.shared_head_norm"), {p.d}, false);
    check_tensor(f, n("attn_q"), {p.d, 2 * hq * hd}, true);
    check_tensor(f, n("attn_k"), {p.d, hkv * hd}, true);
    check_tensor(f, n("attn_v"), {p.d, hkv * hd}, true);
    check_tensor(f, n("attn_output"), {hq * hd, p.d}, true);
    check_tensor(f, n("attn_q_norm"), {hd}, false);
    check_tensor(f, n("attn_k_norm"), {hd}, false);
    check_tensor(f, n("attn_norm"), {p.d}, false);
    check_tensor(f, n("post_attention_norm"), {p.d}, false);
    check_tensor(f, n("ffn_gate"), {p.d, p.ffn}, true);
    check_tensor(f, n("ffn_up"), {p.d, p.ffn}, true);
    check_tensor(f, n("ffn_down"), {p.ffn, p.d}, true);
  }
  // Every matrix type of the file (a Q4_K_M download mixes Q4_K and Q6_K), in type-id order.
  std::vector<bool> seen(64, false);
  for (const auto& t : f.tensors())
    if (t.ne.size() == 2 && t.type != gguf::TensorType::F32 && (size_t)t.type < seen.size()) seen[(size_t)t.type] = true;
  std::string types;
  for (size_t k = 0; k < seen.size(); ++k)
    if (seen[k]) types += (types.empty() ? "" : ", ") + std::string(gguf::tensor_type_name((gguf::TensorType)k));
  p.weight_types = fmt::format("{} matrices, F32 vectors", types.empty() ? "F32" : types);
  return p;
}

}  // namespace qrig::compiler
