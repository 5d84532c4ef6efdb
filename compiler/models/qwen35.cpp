// qwen35 -> IR. One short function per block kind; the math is ../shared/QWEN35.md, the names are GGUF's.
// Every op is tagged with its layer (-1 the embedding, n_layer the output head) and every matmul with its
// weight's GGUF type, read from the tensor table (metadata only).
#include "compiler/models/qwen35.h"

#include <cmath>

#include <fmt/format.h>

namespace qrig::compiler {

namespace {

using ir::kContext;
using ir::kRows;
using ir::kTokens;
using ir::OpKind;

std::string lower_name(const char* s) {
  std::string o(s);
  for (char& c : o) c = (char)std::tolower((unsigned char)c);
  return o;
}

struct Builder {
  const gguf::File& file;
  ir::Graph g;
  int64_t layer = -1;
  std::string op(const std::string& result, OpKind kind, std::vector<std::string> args,
                 std::vector<std::pair<std::string, ir::AttrValue>> attrs, std::vector<int64_t> shape) {
    ir::Op o;
    o.kind = kind;
    o.args = std::move(args);
    o.attrs = std::move(attrs);
    o.attrs.emplace_back("layer", layer);
    if (kind == OpKind::matmul) {
      const gguf::TensorInfo* t = file.find_tensor(o.s("weight"));
      if (!t) throw CompileError(fmt::format("tensor '{}' is missing", o.s("weight")));
      o.attrs.emplace_back("format", lower_name(gguf::tensor_type_name(t->type)));
    }
    if (!result.empty()) {
      o.results = {result};
      o.types = {{ir::DType::f32, std::move(shape)}};
    }
    g.ops.push_back(std::move(o));
    return result;
  }
};

std::string w(int64_t L, const char* t) { return fmt::format("blk.{}.{}.weight", L, t); }

std::string gdn_mixer(Builder& b, const Qwen35Params& p, int64_t L, const std::string& n) {
  const std::string pre = fmt::format("l{}.", L);
  const int64_t Hv = p.ssm_v_heads, hd = p.ssm_head_dim;
  b.g.states.push_back({fmt::format("conv.{}", L), {ir::DType::f32, {p.conv_kernel - 1, p.conv_dim()}}});
  b.g.states.push_back({fmt::format("gdn.{}", L), {ir::DType::f32, {Hv, hd, hd}}});
  auto qkv = b.op(pre + "qkv", OpKind::matmul, {n}, {{"weight", w(L, "attn_qkv")}}, {kTokens, p.conv_dim()});
  auto z = b.op(pre + "z", OpKind::matmul, {n}, {{"weight", w(L, "attn_gate")}}, {kTokens, p.value_dim()});
  auto beta = b.op(pre + "beta", OpKind::matmul, {n}, {{"weight", w(L, "ssm_beta")}}, {kTokens, Hv});
  auto alpha = b.op(pre + "alpha", OpKind::matmul, {n}, {{"weight", w(L, "ssm_alpha")}}, {kTokens, Hv});
  auto conv = b.op(pre + "conv", OpKind::conv1d_silu, {qkv},
                   {{"weight", w(L, "ssm_conv1d")}, {"state", fmt::format("conv.{}", L)}}, {kTokens, p.conv_dim()});
  auto o = b.op(pre + "gdn", OpKind::gdn, {conv, alpha, beta},
                {{"ssm_a", fmt::format("blk.{}.ssm_a", L)},
                 {"dt_bias", fmt::format("blk.{}.ssm_dt.bias", L)},
                 {"key_heads", p.ssm_k_heads},
                 {"value_heads", Hv},
                 {"key_dim", hd},
                 {"value_dim", hd},
                 {"state", fmt::format("gdn.{}", L)}},
                {kTokens, p.value_dim()});
  auto y = b.op(pre + "gnorm", OpKind::gated_rmsnorm, {o, z},
                {{"weight", w(L, "ssm_norm")}, {"heads", Hv}, {"head_dim", hd}, {"eps", p.eps}},
                {kTokens, p.value_dim()});
  return b.op(pre + "mix", OpKind::matmul, {y}, {{"weight", w(L, "ssm_out")}}, {kTokens, p.d});
}

std::string attention_mixer(Builder& b, const Qwen35Params& p, int64_t L, const std::string& n) {
  const std::string pre = fmt::format("l{}.", L);
  const int64_t hq = p.n_head, hkv = p.n_head_kv, hd = p.head_dim;
  const std::string kc = fmt::format("k.{}", L), vc = fmt::format("v.{}", L);
  b.g.states.push_back({kc, {ir::DType::f32, {kContext, hkv * hd}}});
  b.g.states.push_back({vc, {ir::DType::f32, {kContext, hkv * hd}}});
  auto qg = b.op(pre + "qg", OpKind::matmul, {n}, {{"weight", w(L, "attn_q")}}, {kTokens, 2 * hq * hd});
  auto k = b.op(pre + "k", OpKind::matmul, {n}, {{"weight", w(L, "attn_k")}}, {kTokens, hkv * hd});
  auto v = b.op(pre + "v", OpKind::matmul, {n}, {{"weight", w(L, "attn_v")}}, {kTokens, hkv * hd});
  auto q = b.op(pre + "qn", OpKind::head_rmsnorm, {qg},
                {{"weight", w(L, "attn_q_norm")}, {"heads", hq}, {"head_dim", hd}, {"head_stride", 2 * hd},
                 {"head_offset", int64_t{0}}, {"eps", p.eps}},
                {kTokens, hq * hd});
  auto kn = b.op(pre + "kn", OpKind::head_rmsnorm, {k},
                 {{"weight", w(L, "attn_k_norm")}, {"heads", hkv}, {"head_dim", hd}, {"head_stride", hd},
                  {"head_offset", int64_t{0}}, {"eps", p.eps}},
                 {kTokens, hkv * hd});
  auto rope_attrs = [&](int64_t heads) {
    return std::vector<std::pair<std::string, ir::AttrValue>>{
        {"heads", heads}, {"head_dim", hd}, {"rope_dims", p.rope_dims}, {"theta", p.rope_theta}};
  };
  auto qr = b.op(pre + "qr", OpKind::rope, {q, "pos"}, rope_attrs(hq), {kTokens, hq * hd});
  auto kr = b.op(pre + "kr", OpKind::rope, {kn, "pos"}, rope_attrs(hkv), {kTokens, hkv * hd});
  b.op("", OpKind::kv_write, {kr, v, "pos"}, {{"k_cache", kc}, {"v_cache", vc}}, {});
  auto att = b.op(pre + "att", OpKind::attention, {qr, qg, "pos"},
                  {{"k_cache", kc}, {"v_cache", vc}, {"heads", hq}, {"kv_heads", hkv}, {"head_dim", hd},
                   {"scale", 1.0 / std::sqrt((double)hd)}, {"gate_head_stride", 2 * hd}, {"gate_offset", hd}},
                  {kTokens, hq * hd});
  return b.op(pre + "mix", OpKind::matmul, {att}, {{"weight", w(L, "attn_output")}}, {kTokens, p.d});
}

// The decoder layer shared by the main model's stack and the MTP block: pre-norm mixer, then SwiGLU FFN.
std::string decoder_layer(Builder& b, const Qwen35Params& p, int64_t L, std::string x, bool attention) {
  const std::string pre = fmt::format("l{}.", L);
  auto n = b.op(pre + "norm", OpKind::rmsnorm, {x}, {{"weight", w(L, "attn_norm")}, {"eps", p.eps}}, {kTokens, p.d});
  auto mix = attention ? attention_mixer(b, p, L, n) : gdn_mixer(b, p, L, n);
  auto h = b.op(pre + "h", OpKind::add, {x, mix}, {}, {kTokens, p.d});
  auto n2 = b.op(pre + "ffn_norm", OpKind::rmsnorm, {h}, {{"weight", w(L, "post_attention_norm")}, {"eps", p.eps}},
                 {kTokens, p.d});
  auto gate = b.op(pre + "gate", OpKind::matmul, {n2}, {{"weight", w(L, "ffn_gate")}}, {kTokens, p.ffn});
  auto up = b.op(pre + "up", OpKind::matmul, {n2}, {{"weight", w(L, "ffn_up")}}, {kTokens, p.ffn});
  auto act = b.op(pre + "act", OpKind::swiglu, {gate, up}, {}, {kTokens, p.ffn});
  auto down = b.op(pre + "down", OpKind::matmul, {act}, {{"weight", w(L, "ffn_down")}}, {kTokens, p.d});
  return b.op(fmt::format("x{}", L + 1), OpKind::add, {h, down}, {}, {kTokens, p.d});
}

}  // namespace

ir::Graph lower_qwen35_mtp(const Qwen35Params& p, const gguf::File& file) {
  if (p.n_mtp < 1) throw CompileError("the model has no MTP block (nextn_predict_layers)");
  const int64_t L = p.n_layer;  // blk.{n_layer}: the (first) MTP block
  Builder b{file, {}, L};
  b.g.name = "qwen35.mtp";
  b.g.inputs = {{"tokens", {ir::DType::i32, {kTokens}}},
                {"pos", {ir::DType::i32, {kTokens}}},
                {"rows", {ir::DType::i32, {kRows}}},
                {"hidden", {ir::DType::f32, {kTokens, p.d}}}};
  b.g.set_attr("hidden_from", fmt::format("hidden.{}", p.n_layer));  // the main model's final-normed output
  auto nx = [&](const char* t) { return fmt::format("blk.{}.nextn.{}.weight", L, t); };
  auto e = b.op("m.e", OpKind::embed, {"tokens"}, {{"weight", "token_embd.weight"}}, {kTokens, p.d});
  auto en = b.op("m.en", OpKind::rmsnorm, {e}, {{"weight", nx("enorm")}, {"eps", p.eps}}, {kTokens, p.d});
  auto hn = b.op("m.hn", OpKind::rmsnorm, {"hidden"}, {{"weight", nx("hnorm")}, {"eps", p.eps}}, {kTokens, p.d});
  auto u = b.op("m.u", OpKind::concat, {en, hn}, {}, {kTokens, 2 * p.d});  // embedding half first
  auto x = b.op("m.eh", OpKind::matmul, {u}, {{"weight", nx("eh_proj")}}, {kTokens, p.d});
  b.g.ops.back().set("tap", std::string("mtp_eh"));
  auto y = decoder_layer(b, p, L, x, true);
  auto hf = b.op("m.out", OpKind::rmsnorm, {y},
                 {{"weight", nx("shared_head_norm")}, {"eps", p.eps}, {"tap", std::string("mtp_hidden_out")}},
                 {kTokens, p.d});
  auto last = b.op("out_rows", OpKind::gather_rows, {hf, "rows"}, {}, {kRows, p.d});
  b.op("logits", OpKind::matmul, {last}, {{"weight", "output.weight"}}, {kRows, p.vocab});
  b.g.outputs = {"logits"};
  ir::verify(b.g);
  return b.g;
}

ir::Graph lower_qwen35(const Qwen35Params& p, const gguf::File& file) {
  Builder b{file, {}, -1};
  b.g.name = "qwen35";
  b.g.inputs = {{"tokens", {ir::DType::i32, {kTokens}}},
                {"pos", {ir::DType::i32, {kTokens}}},
                {"rows", {ir::DType::i32, {kRows}}}};
  std::string x =
      b.op("x0", OpKind::embed, {"tokens"}, {{"weight", "token_embd.weight"}, {"tap", "hidden.0"}}, {kTokens, p.d});
  for (int64_t L = 0; L < p.n_layer; ++L) {
    b.layer = L;
    const std::string pre = fmt::format("l{}.", L);
    auto n = b.op(pre + "norm", OpKind::rmsnorm, {x}, {{"weight", w(L, "attn_norm")}, {"eps", p.eps}}, {kTokens, p.d});
    auto mix = p.is_full_attention(L) ? attention_mixer(b, p, L, n) : gdn_mixer(b, p, L, n);
    auto h = b.op(pre + "h", OpKind::add, {x, mix}, {}, {kTokens, p.d});
    auto n2 = b.op(pre + "ffn_norm", OpKind::rmsnorm, {h}, {{"weight", w(L, "post_attention_norm")}, {"eps", p.eps}},
                   {kTokens, p.d});
    auto gate = b.op(pre + "gate", OpKind::matmul, {n2}, {{"weight", w(L, "ffn_gate")}}, {kTokens, p.ffn});
    auto up = b.op(pre + "up", OpKind::matmul, {n2}, {{"weight", w(L, "ffn_up")}}, {kTokens, p.ffn});
    auto act = b.op(pre + "act", OpKind::swiglu, {gate, up}, {}, {kTokens, p.ffn});
    auto down = b.op(pre + "down", OpKind::matmul, {act}, {{"weight", w(L, "ffn_down")}}, {kTokens, p.d});
    std::vector<std::pair<std::string, ir::AttrValue>> tap;
    if (L + 1 < p.n_layer) tap.push_back({"tap", fmt::format("hidden.{}", L + 1)});
    x = b.op(fmt::format("x{}", L + 1), OpKind::add, {h, down}, tap, {kTokens, p.d});
  }
  b.layer = p.n_layer;  // the output head
  auto xf = b.op("xf", OpKind::rmsnorm, {x},
                 {{"weight", "output_norm.weight"}, {"eps", p.eps}, {"tap", fmt::format("hidden.{}", p.n_layer)}},
                 {kTokens, p.d});
  auto last = b.op("out_rows", OpKind::gather_rows, {xf, "rows"}, {}, {kRows, p.d});
  b.op("logits", OpKind::matmul, {last}, {{"weight", "output.weight"}}, {kRows, p.vocab});
  b.g.outputs = {"logits"};
  ir::verify(b.g);
  return b.g;
}

}  // namespace qrig::compiler
