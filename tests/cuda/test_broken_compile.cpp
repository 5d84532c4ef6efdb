// CI without a GPU for the deliberately broken kernels of the GPU tests (tests/gpu/broken_kernels.h, run on a GPU
// by the [gpu][broken] cases): every bug's text occurs in its template as often as the bug says (so a template
// edit that moves the text fails here, not silently on the GPU machine), and the patched template compiles with
// NVRTC for sm_90 (the H200 runs) and for the sm_70 feature set (cmp_family.sh runs the GPU tests as sm_70 PTX),
// for the variant the GPU test runs (or one like it: GDN and attention tests take the plan's choice for the GPU's
// SMs), into PTX that differs from the unpatched template's (the bug is not in code the variant compiles out).
#include <catch2/catch.hpp>

#include <map>

#include "kernels/attention.h"
#include "kernels/gdn.h"
#include "kernels/matmul.h"
#include "runtime/cuda/ptx_scan.h"
#include "tests/gpu/broken_kernels.h"

using namespace qrig;
using namespace qrig::cuda;

namespace {

// The variant of b.kernel the GPU test runs (GEMV, GEMM) or one the tiny model's plan would choose (GDN, attention).
Variant variant_for(const broken::Bug& b) {
  const int64_t planes = b.planes == 2 ? 2 : 1;
  const kernels::GdnDims gdn{2, 4, 128, 128};
  if (b.kernel == "gemv_q8_0_dp4a") return kernels::gemv_q8_0_variant(4096, 1);
  if (b.kernel == "gemm_q8_0_dp4a_tiled") return kernels::gemm_q8_0_tiled_variant(planes, 64, 32, 4, 4, 2, 1);
  if (b.kernel == "gemm_q8_0_dp4a_skinny") return kernels::gemm_q8_0_skinny_variant(planes, 8, 2, 2, 128);
  if (b.kernel == "gdn_recurrent") return kernels::gdn_recurrent_variant(gdn);
  if (b.kernel == "gdn_chunk_prep") return kernels::gdn_chunk_prep_variant(gdn, 64);
  if (b.kernel == "gdn_chunk_scan") return kernels::gdn_chunk_scan_variant(gdn, 64);
  if (b.kernel == "attn_decode") return kernels::attn_decode_variant(2, 2);  // tiny: 2 query heads per KV head
  if (b.kernel == "attn_prefill") return kernels::attn_prefill_variant(2, 0);
  if (b.kernel == "attn_merge") return kernels::attn_merge_variant();
  if (b.kernel == "attn_decode_dp4a") return kernels::attn_decode_dp4a_variant(4, 1, {kernels::KvFormat::q8, kernels::KvFormat::t3});
  FAIL("no variant for " << b.kernel);
  return {};
}

}  // namespace

TEST_CASE("every broken kernel's patch applies to its template and compiles for sm_90 and the sm_70 feature set",
          "[cuda][broken]") {
  const auto& bugs = broken::bugs();
  std::map<std::string, int> per_kernel;
  for (const broken::Bug& b : bugs) ++per_kernel[b.kernel];
  // The GEMV and GEMM (tiled, skinny), GDN (recurrent, chunk prep, chunk scan) and attention (decode, decode with
  // the int8 query, prefill, merge) kernels each have a bug; the GPU tests count on these numbers.
  CHECK(per_kernel.size() == 10);
  CHECK(bugs.size() == 23);
  for (const broken::Bug& b : bugs) {
    const Variant v = variant_for(b);
    INFO(v.name << ", bug: " << b.what);
    const std::string original = broken::patched_source(v, {b.kernel, "", "", ""});
    const std::string patched = broken::patched_source(v, b);
    CHECK(patched != original);
    for (const int sm : {90, 70}) {
      INFO("sm_" << sm);
      const ArchChoice arch = choose_arch(sm);
      const CompiledKernel k = broken::compile_patched(v, b, arch);
      const CompiledKernel ref = broken::compile_patched(v, {b.kernel, "", "", ""}, arch);
      CHECK(!k.cubin.empty());
      const auto entries = ptx_entries(k.ptx);
      REQUIRE(entries.size() == 1);
      CHECK(entries[0].name == v.kernel);
      CHECK(k.ptx != ref.ptx);
    }
  }
  // A patch whose text is missing, or is found more often than said, is refused by name.
  broken::Bug wrong = bugs.front();
  wrong.from = "no such text in any template";
  CHECK_THROWS_WITH(broken::patched_source(variant_for(wrong), wrong), Catch::Contains("found 0"));
  broken::Bug twice = bugs.front();
  twice.count = 2;
  CHECK_THROWS_WITH(broken::patched_source(variant_for(twice), twice), Catch::Contains("expects 2"));
}
