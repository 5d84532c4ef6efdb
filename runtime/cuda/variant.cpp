// The template registry and variant names (see variant.h). Adding a template: its file in templates/, an
// entry here, a launcher in launch.cpp, a CPU reference comparison in tests/gpu.
#include "runtime/cuda/variant.h"
#include "runtime/cuda/variant_parts.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

namespace qrig::cuda {

namespace {

int64_t pow2_at_most(int64_t n) {
  int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

}  // namespace

TemplateParam threads_param() {
  return {"t", "QRIG_THREADS", 32, 1024, 32, "threads per block (a multiple of the warp size)"};
}

TemplateParam planes_param() {
  return {"p", "QRIG_PLANES", 1, 2, 1, "activation planes: 1 int8 q, 2 q + the residual's int8 q2 (x = d*(q + q2/254))"};
}

const std::vector<TemplateInfo>& template_registry() {
  static const std::vector<TemplateInfo> reg = [] {
    std::vector<TemplateInfo> all = base_templates();
    for (auto part : {pointwise_templates, gemm_templates, gdn_templates, attention_templates, sampling_templates})
      for (auto& t : part()) all.push_back(std::move(t));
    return all;
  }();
  return reg;
}

std::vector<TemplateInfo> base_templates() {
  return {
      {"rmsnorm_f32", "rmsnorm_f32.cu",
       {{"d", "QRIG_D", 4, 65536, 4, "row length"},
        {"q", "QRIG_QUANT", 0, 2, 1, "also quantize the output for the matmuls it feeds: 0 no, 1 or 2 planes"},
        threads_param()},
       "out = x * rsqrt(mean(x^2) + eps) * w per row of f32 (+ quant_act_q8 of out, fused); one block per row"},
      {"quant_act_q8", "quant_act_q8.cu",
       {planes_param(), threads_param()},
       "f32 activations -> int8 + one f32 scale per 32 values (d = amax/127, q = round(x/d)), and with p2 the "
       "residual's int8 plane on the step d/254; one warp per 32"},
      {"gemv_q8_0_dp4a", "gemv_q8_0_dp4a.cu",
       {{"k", "QRIG_K", 32, 32768, 32, "input length (weight row length)"}, planes_param(),
        {"r", "QRIG_ROWS", 1, 8, 1, "output rows per warp"},
        {"u", "QRIG_UNROLL", 1, 8, 1, "512-byte chunks of each row loaded before use"},
        threads_param()},
       "decode GEMV: repacked Q8_0 weights [n][k] x quantized activation [k] with dp4a, f32 out"},
      {"embed_q8_0", "embed_q8_0.cu",
       {{"d", "QRIG_D", 32, 65536, 32, "row length"}, threads_param()},
       "rows of a repacked Q8_0 table -> f32, one block per token; ids out of range give NaN rows"},
  };
}

const TemplateInfo* find_template_info(std::string_view kernel) {
  for (const auto& t : template_registry())
    if (kernel == t.kernel) return &t;
  return nullptr;
}

int64_t Variant::param(std::string_view key) const {
  for (const auto& [k, v] : params)
    if (k == key) return v;
  throw KernelError(fmt::format("kernel variant {} has no parameter '{}'", name, key));
}

std::vector<std::string> Variant::defines() const {
  const TemplateInfo* t = find_template_info(kernel);
  if (!t) throw KernelError(fmt::format("kernel variant {}: unknown template '{}'", name, kernel));
  std::vector<std::string> out;
  for (size_t i = 0; i < t->params.size(); ++i)
    out.push_back(fmt::format("-D{}={}", t->params[i].macro, params.at(i).second));
  return out;
}

Variant make_variant(std::string_view kernel, const std::vector<std::pair<std::string, int64_t>>& params) {
  const TemplateInfo* t = find_template_info(kernel);
  if (!t) {
    std::string known;
    for (const auto& r : template_registry()) known += (known.empty() ? "" : ", ") + std::string(r.kernel);
    throw KernelError(fmt::format("unknown kernel template '{}' (templates: {})", kernel, known));
  }
  Variant v;
  v.kernel = t->kernel;
  v.file = t->file;
  v.name = t->kernel;
  for (const auto& p : t->params) {
    auto it = std::find_if(params.begin(), params.end(), [&](const auto& kv) { return kv.first == p.key; });
    if (it == params.end())
      throw KernelError(fmt::format("kernel {}: parameter '{}' ({}) is missing", kernel, p.key, p.doc));
    const int64_t x = it->second;
    if (x < p.min || x > p.max || x % p.multiple != 0)
      throw KernelError(fmt::format("kernel {}: parameter {} = {} is invalid ({}: {}..{}, a multiple of {})", kernel,
                                    p.key, x, p.doc, p.min, p.max, p.multiple));
    v.params.emplace_back(p.key, x);
    v.name += fmt::format("_{}{}", p.key, x);
  }
  for (const auto& [k, x] : params)
    if (std::none_of(t->params.begin(), t->params.end(), [&](const TemplateParam& p) { return k == p.key; }))
      throw KernelError(fmt::format("kernel {} has no parameter '{}'", kernel, k));
  if (params.size() != t->params.size())
    throw KernelError(fmt::format("kernel {}: a parameter is given more than once", kernel));
  return v;
}

Variant parse_variant(std::string_view name) {
  std::string why = "no template name is a prefix of it";
  for (const auto& t : template_registry()) {
    const std::string prefix = std::string(t.kernel) + "_";
    if (name.substr(0, prefix.size()) != prefix) continue;
    std::string_view rest = name.substr(prefix.size());
    std::vector<std::pair<std::string, int64_t>> params;
    bool ok = true;
    while (ok && !rest.empty()) {
      const size_t end = std::min(rest.find('_'), rest.size());
      std::string_view tok = rest.substr(0, end);
      rest = end < rest.size() ? rest.substr(end + 1) : std::string_view{};
      size_t i = 0;
      while (i < tok.size() && std::isalpha((unsigned char)tok[i])) ++i;
      if (i == 0 || i == tok.size() || tok.size() - i > 9) {
        ok = false;
        why = fmt::format("'{}' is not a parameter (a key then a number, e.g. k4096)", tok);
        break;
      }
      int64_t x = 0;
      for (size_t j = i; j < tok.size(); ++j) {
        if (!std::isdigit((unsigned char)tok[j])) {
          ok = false;
          why = fmt::format("'{}' is not a parameter (a key then a number, e.g. k4096)", tok);
          break;
        }
        x = x * 10 + (tok[j] - '0');
      }
      params.emplace_back(std::string(tok.substr(0, i)), x);
    }
    if (!ok) continue;
    Variant v;
    try {
      v = make_variant(t.kernel, params);
    } catch (const KernelError& e) {
      why = e.what();
      continue;
    }
    if (v.name != name)
      throw KernelError(fmt::format("kernel variant name '{}' is not canonical: it should read '{}'", name, v.name));
    return v;
  }
  throw KernelError(fmt::format("bad kernel variant name '{}': {}", name, why));
}

Variant rmsnorm_f32_variant(int64_t d, int64_t quant_planes) {
  return make_variant("rmsnorm_f32",
                      {{"d", d}, {"q", quant_planes}, {"t", std::clamp<int64_t>(pow2_at_most(d / 4), 32, 256)}});
}

Variant quant_act_q8_variant(int64_t planes) { return make_variant("quant_act_q8", {{"p", planes}, {"t", 256}}); }

// r1 u2 t256 was the fastest tiling at every 9B decode shape on the H200 (bench/RESULTS.md, 2026-11-30).
Variant gemv_q8_0_variant(int64_t k, int64_t planes) { return gemv_q8_0_variant(k, planes, 1, 2, 256); }

Variant gemv_q8_0_variant(int64_t k, int64_t planes, int64_t rows_per_warp, int64_t unroll, int64_t threads) {
  return make_variant("gemv_q8_0_dp4a",
                      {{"k", k}, {"p", planes}, {"r", rows_per_warp}, {"u", unroll}, {"t", threads}});
}

Variant embed_q8_0_variant(int64_t d) {
  return make_variant("embed_q8_0", {{"d", d}, {"t", std::clamp<int64_t>(pow2_at_most(d / 16), 32, 256)}});
}

}  // namespace qrig::cuda
