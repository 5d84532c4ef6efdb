// Kernel variants: a template of templates/ plus a value for every one of its compile-time parameters, named
// by a string that spells them all out (FlashInfer's habit), e.g. "gemv_q8_0_dp4a_k4096_p2_r1_u2_t256". The
// name is what plans carry and what the cubin cache is keyed by; parse_variant() turns it back into the
// template and the -D options NVRTC compiles it with. The registry below is the list of templates.
//
// kernels/ is the host half of templates/: it builds without CUDA. The compiler uses it to choose variants
// (the choice functions of each area, kernels/<area>.h); the runtime uses only the registry and the geometry
// facts of a variant (what the name says, how much scratch it needs) to load and launch what the plan names.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qrig::kernels {

// A bad variant name or parameter, a missing template, an NVRTC failure, a cache failure.
struct KernelError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One compile-time parameter of a template: its key in variant names, the macro it sets, its valid range.
struct TemplateParam {
  const char* key;    // "k": appears as "_k4096" in names
  const char* macro;  // "QRIG_K": passed as -DQRIG_K=4096
  int64_t min, max;   // inclusive
  int64_t multiple;   // the value must be a multiple of this
  const char* doc;
};

struct TemplateInfo {
  const char* kernel;  // entry point (extern "C") and variant-name prefix, e.g. "gemv_q8_0_dp4a"
  const char* file;    // in templates/, e.g. "gemv_q8_0_dp4a.cu"
  std::vector<TemplateParam> params;  // in name order; the last one is always the block size "t"
  const char* doc;
  // Launched plainly even in a plan with programmatic_launch: the template has no qrig_grid_dependency_wait
  // (the tiled GEMMs: placed early beside the kernel before them, their few long CTAs lost 19-25% of a
  // 32-sequence decode step on an H200; docs/gpu.md "launch overlap").
  bool plain_launch = false;
};

// Every template of the default family (no tensor cores).
const std::vector<TemplateInfo>& template_registry();
const TemplateInfo* find_template_info(std::string_view kernel);

struct Variant {
  std::string name;    // canonical: kernel + "_" + key + value for every parameter, in order
  std::string kernel;  // entry point symbol = template name
  std::string file;    // template file in templates/
  std::vector<std::pair<std::string, int64_t>> params;

  int64_t param(std::string_view key) const;    // throws KernelError naming the variant and key
  std::vector<std::string> defines() const;     // {"-DQRIG_K=4096", ...}
  int64_t threads() const { return param("t"); }  // block size (every kernel has __launch_bounds__(t))
  bool operator==(const Variant& o) const { return name == o.name; }
  bool operator<(const Variant& o) const { return name < o.name; }
};

// Validates every value against the registry (range, multiple, all present, none extra) and builds the
// canonical name. Throws KernelError saying what is wrong.
Variant make_variant(std::string_view kernel, const std::vector<std::pair<std::string, int64_t>>& params);
// The inverse of Variant::name: throws KernelError for unknown templates, missing, extra, reordered or
// non-canonical parameters (so one variant has exactly one name, and one cache entry).
Variant parse_variant(std::string_view name);

// The parameter every template ends with: the block size {"t", "QRIG_THREADS", 32..1024, a multiple of 32}.
TemplateParam threads_param();
// The activation-planes parameter of the quantizer and every matmul: {"p", "QRIG_PLANES", 1..2}.
TemplateParam planes_param();
// The batching parameter of the kernels on a sequence's state (conv1d_silu_f32, gdn_recurrent, kv_write, attn_decode,
// attn_merge, attn_merge_rot): {"b", "QRIG_BATCHED", 0..1}: 0 one sequence per launch, 1 one launch over all the
// sequences of a decode step (one token each), each sequence's state, caches and position read from the step's
// per-sequence device arrays.
TemplateParam batched_param();

}  // namespace qrig::kernels
