// The template registry and variant names (see variant.h). Adding a template: its file in templates/, an
// entry in its area's list (kernels/<area>.cpp), its choice in the area's choice function, a launcher in
// runtime/cuda, a CPU reference comparison in tests/gpu (docs/ir.md lists the steps).
#include "kernels/variant.h"
#include "kernels/registry.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

namespace qrig::kernels {

TemplateParam threads_param() {
  return {"t", "QRIG_THREADS", 32, 1024, 32, "threads per block (a multiple of the warp size)"};
}

TemplateParam planes_param() {
  return {"p", "QRIG_PLANES", 1, 2, 1, "activation planes: 1 int8 q, 2 q + the residual's int8 q2 (x = d*(q + q2/254))"};
}
TemplateParam batched_param() {
  return {"b", "QRIG_BATCHED", 0, 1, 1,
          "0: one sequence per launch; 1: one launch over a decode step's sequences (one token each)"};
}

const std::vector<TemplateInfo>& template_registry() {
  static const std::vector<TemplateInfo> reg = [] {
    std::vector<TemplateInfo> all;
    for (auto part : {pointwise_templates, matmul_templates, gdn_templates, attention_templates, sampling_templates})
      for (auto& t : part()) all.push_back(std::move(t));
    return all;
  }();
  return reg;
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
  for (const auto& given : params)  // not a structured binding: clang before 16 cannot capture one in a lambda
    if (std::none_of(t->params.begin(), t->params.end(), [&](const TemplateParam& p) { return given.first == p.key; }))
      throw KernelError(fmt::format("kernel {} has no parameter '{}'", kernel, given.first));
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

}  // namespace qrig::kernels
