// Deliberately broken kernels, to show that the GPU tests' thresholds catch real bugs (issue 21): a bug is a text
// patch of one template's source (the shipped template as embedded in the binary, never the file), compiled by
// NVRTC like any variant. Each entry is a bug class the kernels could really have (an off-by-one in a tile or
// mask index, a dropped scale or decay term, a softmax that forgets to rescale, a wrong constant); the GPU tests
// ([gpu][broken]) run every entry through the same comparison and threshold as the real kernel's test and
// require it to FAIL there, while the unpatched template through the same path passes. tests/cuda/
// test_broken_compile.cpp checks without a GPU that every patch applies and compiles for sm_90.
// No GPU is needed here: this header is shared by the GPU tests and that compile check.
#pragma once

#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/templates.h"
#include "runtime/cuda/variant.h"

namespace qrig::cuda::broken {

struct Bug {
  std::string kernel;  // the template's kernel (Variant::kernel): only its variants are patched
  std::string what;    // the bug, in words (the report's row)
  std::string from;    // text of the template ...
  std::string to;      // ... replaced by this
  int count = 1;       // occurrences of `from` in the template (all are replaced)
  int64_t planes = 0;  // GEMM bugs of the two-plane code: the test runs them with two planes (0: one plane)
};

// Every bug, by kernel.
inline const std::vector<Bug>& bugs() {
  static const std::vector<Bug> all = {
      // GEMV (tests/gpu/test_gpu_kernels.cpp)
      {"gemv_q8_0_dp4a", "activation scale of the next block (off by one)",
       "const float ad = s_xd[(c0 + u) * 16 + (lane >> 1)];", "const float ad = s_xd[((c0 + u) * 16 + (lane >> 1) + 1) % NB];"},
      {"gemv_q8_0_dp4a", "weight scale dropped", "(qrig_half_to_float(s[u][r]) * ad)", "ad"},
      // GEMM, tiled (tests/gpu/test_gpu_gemm.cpp)
      {"gemm_q8_0_dp4a_tiled", "token scales staged one token over in the tile (off by one)",
       "sXd[(buf * KBS + idx % KBS) * BT + idx / KBS] = rxd[i];",
       "sXd[(buf * KBS + idx % KBS) * BT + (idx / KBS + 1) % BT] = rxd[i];"},
      {"gemm_q8_0_dp4a_tiled", "last K stage dropped (loop bound off by one)", "s < STAGES; ++s", "s < STAGES - 1; ++s"},
      {"gemm_q8_0_dp4a_tiled", "second plane's step 1/256 instead of 1/254", "constexpr float INV254 = 1.0f / 254.0f;",
       "constexpr float INV254 = 1.0f / 256.0f;", 1, 2},
      // GEMM, skinny
      {"gemm_q8_0_dp4a_skinny", "activation scale of the next 16-byte piece's block (off by one)",
       "const float ad = __ldg(drow[c] + (v >> 1));", "const float ad = __ldg(drow[c] + min((v + 1) >> 1, NB - 1));"},
      {"gemm_q8_0_dp4a_skinny", "last vector of the partial chunk dropped (tail bound off by one)", "if (lane < TAIL) {",
       "if (lane < TAIL - 1) {"},
      {"gemm_q8_0_dp4a_skinny", "second plane's step 1/256 instead of 1/254", "constexpr float INV254 = 1.0f / 254.0f;",
       "constexpr float INV254 = 1.0f / 256.0f;", 1, 2},
      // GDN, recurrent (tests/gpu/test_gpu_gdn.cpp)
      {"gdn_recurrent", "state decay dropped for every 4th column", "        s[i].w *= decay;\n", "\n"},
      {"gdn_recurrent", "softplus without its log1p term above 0 (softplus(x) = x)",
       "return x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x));", "return x > 0.0f ? x : log1pf(expf(x));"},
      {"gdn_recurrent", "query scale 1/sqrt(dk) dropped", "if (!(v & 1)) mul = mul / sqrtf((float)DK);", ""},
      // GDN, chunked
      {"gdn_chunk_prep", "causal mask of P off by one (a token's own key dropped)", "p = sqmul[i] * qk[r][s] * d;",
       "if (m < i) p = sqmul[i] * qk[r][s] * d;"},
      {"gdn_chunk_prep", "decay exp(gamma) dropped from W's right-hand side", "sbeta[i] * seg[i] * skmul[i] *",
       "sbeta[i] * skmul[i] *"},
      {"gdn_chunk_scan", "state decay over a chunk dropped (S = S + K^T V')", "sreg[q] *= e;", "sreg[q] *= 1.0f;"},
      // Attention (tests/gpu/test_gpu_attention.cpp)
      {"attn_decode", "running sum not rescaled when the row max grows", "l[r] = l[r] * alpha + p[r];",
       "l[r] = l[r] + p[r];"},
      {"attn_decode", "causal mask off by one (a token sees the next key)", "kp > pos0 + t)", "kp > pos0 + t + 1)"},
      {"attn_decode", "warps' partial sums merged without their max's rescale", "lsum = fmaf(wl[ww][r], f, lsum);",
       "lsum += wl[ww][r];", 2},
      {"attn_prefill", "output not rescaled when the row max grows (fp32 P.V)",
       "for (int cc = 0; cc < 8; ++cc) o[rr][cc] *= a[rr];", "for (int cc = 0; cc < 8; ++cc) o[rr][cc] *= 1.0f;"},
      {"attn_prefill", "causal mask off by one (a token sees the next key)", "k0 + kg + 8 * j > lim[i]",
       "k0 + kg + 8 * j > lim[i] + 1"},
      {"attn_merge", "split-KV merge: partial sums not rescaled to the common max", "lsum = fmaf(sm_l[g], f, lsum);",
       "lsum += sm_l[g];"},
      // Decode over quantized keys with the int8 query (tests/gpu/test_gpu_kv.cpp)
      {"attn_decode_dp4a", "q8 key block scale dropped", "const float wk = __fmul_rn(dqb, qrig_half_to_float(",
       "const float wk = fmaxf(dqb, 0.0f * qrig_half_to_float("},
      {"attn_decode_dp4a", "causal mask off by one (a token sees the next key)", "kp > pos0 + t) x = QRIG_NEG_INF;",
       "kp > pos0 + t + 1) x = QRIG_NEG_INF;"},
      // (The max itself must move for this to be a bug: a state kept at an old max is exact, only its range
      // shrinks, and that earlier version of this bug went uncaught on the H200, session 12.)
      {"attn_decode_dp4a", "running state not rescaled when the row max grows (the max moves)",
       "const float alpha = qrig_exp2(m[r] - mu[r]);", "const float alpha = m[r] == QRIG_NEG_INF ? 0.0f : 1.0f;"},
  };
  return all;
}

// The bugs of the kernels whose names start with `prefix` ("gemm", "gdn", "attn", "gemv").
inline std::vector<Bug> bugs_of(const std::string& prefix) {
  std::vector<Bug> out;
  for (const Bug& b : bugs())
    if (b.kernel.compare(0, prefix.size(), prefix) == 0) out.push_back(b);
  return out;
}

// The template of `v` with the bug patched in (b.from empty: as is). Throws KernelError when the bug is for
// another kernel or its text does not occur in the template exactly b.count times (a template changed: the
// patch needs updating).
inline std::string patched_source(const Variant& v, const Bug& b) {
  const TemplateFile* src = find_template(v.file);
  if (!src) throw KernelError(fmt::format("no embedded template {}", v.file));
  std::string s = src->source;
  if (b.from.empty()) return s;
  if (b.kernel != v.kernel) throw KernelError(fmt::format("bug for {} applied to {}", b.kernel, v.name));
  int n = 0;
  for (size_t at = s.find(b.from); at != std::string::npos; at = s.find(b.from, at + b.to.size())) {
    s.replace(at, b.from.size(), b.to);
    ++n;
  }
  if (n != b.count)
    throw KernelError(fmt::format("{}: the bug '{}' expects {} occurrence(s) of its text, found {}", v.file, b.what,
                                  b.count, n));
  return s;
}

// The patched template compiled by NVRTC for `arch`, with the embedded headers (not cached: a broken kernel never
// reaches the cubin cache).
inline CompiledKernel compile_patched(const Variant& v, const Bug& b, const ArchChoice& arch) {
  std::vector<NvrtcHeader> headers;
  for (const auto& f : embedded_templates()) {
    const std::string name = f.name;
    if (name.size() > 4 && name.substr(name.size() - 4) == ".cuh") headers.push_back({name, f.source});
  }
  const NvrtcOutput o = nvrtc_compile("broken_" + v.file, patched_source(v, b), headers, variant_options(v, arch), arch.lib);
  CompiledKernel ck;
  ck.variant = v;
  ck.arch = arch;
  ck.cubin = o.cubin;
  ck.ptx = o.ptx;
  ck.log = o.log;
  return ck;
}

}  // namespace qrig::cuda::broken
