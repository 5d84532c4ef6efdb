// `qrig synth --type`: the weight formats a synthetic model can be written in and, per format, the tensor-type
// mix llama.cpp's llama-quantize gives a Qwen3.5 model (its llama_tensor_get_type rules without an importance
// matrix, as they apply to this architecture's tensor names). Checked against ../shared/fixtures/kquant, which
// llama-quantize made from a 4-layer qwen35 model (tests/cli/test_synth_types.cpp compares the mixes):
// - output.weight: Q6_K unless the type is Q8_0 (then Q8_0) or Q6_K.
// - attn_v and the GDN layers' attn_qkv count together (i of n, in file order, n = layers):
//   Q2_K: Q4_K when n_head / n_head_kv >= 4, else Q3_K; Q3_K_M: Q5_K for i < 2, else Q4_K;
//   Q4_K_M / Q5_K_M: Q6_K where use_more_bits(i, n); Q4_K_S: Q5_K for i < 4.
// - ffn_down (i of n layers): Q2_K: Q3_K; Q3_K_M: Q5_K for i < n/16, else Q4_K; Q4_K_M / Q5_K_M: Q6_K where
//   use_more_bits(i, n); Q4_K_S: Q5_K for i < n/8.
// - attn_output: Q2_K: Q3_K; Q3_K_M: Q4_K.
// - everything else 2-D (token_embd, ssm_alpha/beta, attn_gate, ssm_out, ffn_gate/up, attn_q/k): the base type;
//   norms, ssm_a, ssm_dt.bias and ssm_conv1d stay F32.
// use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2. A K-quant whose row length is not a
// multiple of 256 falls back as llama.cpp does (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0:
// llama.cpp picks IQ4_NL there, which qrig does not write).
#include <fmt/format.h>

#include "cli/args.h"
#include "cli/synth.h"

namespace qrig::cli {

namespace {

using gguf::TensorType;

struct Format {
  const char* name;
  TensorType base;
  uint32_t file_type;  // llama.cpp's LLAMA_FTYPE_MOSTLY_*
};
const Format kFormats[] = {
    {"q8_0", TensorType::Q8_0, 7},    {"q4_0", TensorType::Q4_0, 2},    {"q4_1", TensorType::Q4_1, 3},
    {"q5_0", TensorType::Q5_0, 8},    {"q5_1", TensorType::Q5_1, 9},    {"q2_k", TensorType::Q2_K, 10},
    {"q3_k_m", TensorType::Q3_K, 12}, {"q4_k_s", TensorType::Q4_K, 14}, {"q4_k_m", TensorType::Q4_K, 15},
    {"q5_k_s", TensorType::Q5_K, 16}, {"q5_k_m", TensorType::Q5_K, 17}, {"q6_k", TensorType::Q6_K, 18},
};

bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }
bool ends_with(const std::string& s, const char* suffix) {
  const std::string t(suffix);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

TensorType fallback(TensorType t) {
  switch (t) {
    case TensorType::Q4_K: return TensorType::Q5_0;
    case TensorType::Q5_K: return TensorType::Q5_1;
    case TensorType::Q6_K: return TensorType::Q8_0;
    case TensorType::Q2_K: case TensorType::Q3_K: return TensorType::Q4_0;
    default: return t;
  }
}

}  // namespace

std::vector<std::string> synth_type_names() {
  std::vector<std::string> out;
  for (const Format& f : kFormats) out.push_back(f.name);
  return out;
}

SynthMix synth_mix(const std::string& type, const SynthPreset& p) {
  for (const Format& f : kFormats)
    if (type == f.name) return SynthMix{f.name, f.base, f.file_type, (int64_t)p.layers, (int64_t)p.layers,
                                        (int64_t)(p.n_head / std::max<uint64_t>(1, p.n_head_kv))};
  std::string all;
  for (const auto& n : synth_type_names()) all += (all.empty() ? "" : ", ") + n;
  throw UsageError(fmt::format("unknown synth type '{}' (types: {})", type, all));
}

TensorType SynthMix::next(const std::string& name, uint64_t row_length) {
  const std::string t = this->name;
  TensorType out = base;
  if (name == "output.weight") {
    out = base == TensorType::Q8_0 ? TensorType::Q8_0 : TensorType::Q6_K;
  } else if (ends_with(name, "attn_v.weight") || ends_with(name, "attn_qkv.weight")) {
    const int64_t i = i_wv++, n = n_wv;
    if (t == "q2_k") out = gqa >= 4 ? TensorType::Q4_K : TensorType::Q3_K;
    else if (t == "q3_k_m") out = i < 2 ? TensorType::Q5_K : TensorType::Q4_K;
    else if ((t == "q4_k_m" || t == "q5_k_m") && use_more_bits(i, n)) out = TensorType::Q6_K;
    else if (t == "q4_k_s" && i < 4) out = TensorType::Q5_K;
  } else if (ends_with(name, "ffn_down.weight")) {
    const int64_t i = i_down++, n = n_down;
    if (t == "q2_k") out = TensorType::Q3_K;
    else if (t == "q3_k_m") out = i < n / 16 ? TensorType::Q5_K : TensorType::Q4_K;
    else if ((t == "q4_k_m" || t == "q5_k_m") && use_more_bits(i, n)) out = TensorType::Q6_K;
    else if (t == "q4_k_s" && i < n / 8) out = TensorType::Q5_K;
  } else if (ends_with(name, "attn_output.weight")) {
    if (t == "q2_k") out = TensorType::Q3_K;
    else if (t == "q3_k_m") out = TensorType::Q4_K;
  }
  const gguf::TypeTraits* tr = gguf::type_traits(static_cast<uint32_t>(out));
  if (row_length % tr->block_elems != 0) out = fallback(out);
  return out;
}

}  // namespace qrig::cli
