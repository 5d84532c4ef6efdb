// CI without a GPU for the Gated DeltaNet kernels (runtime/cuda/gdn.h): every variant gdn_variants() gives for
// the tiny fixture, 9B and 27B dims (QWEN35.md: Hk/Hv 2/4, 16/32, 16/48, head dims 128) and for the odd dims the
// GPU tests use compiles with NVRTC for sm_75 and sm_90 with no register spills and the declared block size;
// the sm_70 feature set's PTX holds nothing newer than sm_70. Also the host-side checks: variant choice
// errors, workspace size, and run()'s argument checks (which throw before anything reaches a GPU).
#include <catch2/catch.hpp>

#include <map>

#include <fmt/format.h>

#include "runtime/cuda/gdn.h"
#include "tests/cuda/kernel_sets.h"
#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/ptx_scan.h"
#include "tests/cuda/compiled_checks.h"
#include "tests/cuda/cuda_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::kernels;

namespace {

const std::vector<GdnDims> kDims = {{2, 4, 128, 128}, {16, 32, 128, 128}, {16, 48, 128, 128}, {1, 3, 64, 32}};

}  // namespace

TEST_CASE("gdn variants compile for sm_75 and sm_90 without spills; the sm_70 feature set is sm_70-only",
          "[cuda][gdn]") {
  std::map<std::string, Variant> all;
  for (const GdnDims& d : kDims)
    for (const Variant& v : gdn_variants(d, 64)) all.emplace(v.name, v);
  // Head dims 128 give one set whatever the head counts (they are launch arguments): 3 variants, + 3 odd.
  REQUIRE(all.size() == 6);
  std::vector<test::CompileJob> jobs;
  for (const auto& [name, v] : all)
    for (int sm : {70, 75, 90}) jobs.push_back({v, sm});

  test::compile_and_check("gdn-compile", jobs);
}

TEST_CASE("gdn variant names spell every parameter and parse back", "[cuda][gdn]") {
  const auto vs = gdn_variants({16, 32, 128, 128}, 64);
  REQUIRE(vs.size() == 3);
  CHECK(vs[0].name == "gdn_recurrent_dk128_dv128_cw8_b0_t128");
  CHECK(vs[1].name == "gdn_chunk_prep_dk128_dv128_c64_t256");
  CHECK(vs[2].name == "gdn_chunk_scan_dk128_dv128_c64_ct16_t256");
  for (const Variant& v : vs) CHECK(parse_variant(v.name) == v);
  // Shorter chunks need fewer row groups in the scan (C / groups a multiple of 4).
  CHECK(gdn_variants({16, 32, 128, 128}, 32)[2].name == "gdn_chunk_scan_dk128_dv128_c32_ct16_t128");
  CHECK(gdn_variants({16, 32, 128, 128}, 16)[2].name == "gdn_chunk_scan_dk128_dv128_c16_ct16_t64");
  CHECK(gdn_variants({16, 32, 128, 128}, 48)[2].name == "gdn_chunk_scan_dk128_dv128_c48_ct16_t64");
}

TEST_CASE("gdn dims and chunk lengths the kernels cannot take are refused", "[cuda][gdn]") {
  CHECK_THROWS_AS(gdn_variants({16, 33, 128, 128}, 64), KernelError);  // Hv not a multiple of Hk
  CHECK_THROWS_AS(gdn_variants({0, 32, 128, 128}, 64), KernelError);
  CHECK_THROWS_AS(gdn_variants({16, 32, 256, 128}, 64), KernelError);  // dk over the prep's shared memory
  CHECK_THROWS_AS(gdn_variants({16, 32, 128, 100}, 64), KernelError);  // dv not a multiple of 32
  CHECK_THROWS_AS(gdn_variants({16, 32, 128, 128}, 128), KernelError);
  CHECK_THROWS_AS(gdn_variants({16, 32, 128, 128}, 40), KernelError);
}

TEST_CASE("gdn workspace size and run() argument checks (no GPU: they throw before any launch)", "[cuda][gdn]") {
  // A loader that hands back the variants without a cubin: enough for everything that happens before a launch.
  std::vector<std::string> asked;
  const KernelLoader fake = [&](const Variant& v) {
    asked.push_back(v.name);
    return LoadedKernel{v, Kernel{}};
  };
  const GdnDims d{16, 32, 128, 128};
  const GdnKernels k = test::gdn_kernels(fake, d, 64);
  CHECK(asked.size() == 3);  // recurrent below 64 tokens, the chunked pair from there
  CHECK(k.recurrent_for(63));
  CHECK(!k.recurrent_for(64));
  CHECK(gdn_workspace_bytes(d, 64, 0) == 0);
  // Per (value head, chunk): W 64x128, U 64x128, P 64x64, fq/fk/e_last 3x64 (padded) floats.
  const int64_t per = 64 * (128 + 128 + 64 + 4) * 4;
  CHECK(gdn_workspace_bytes(d, 64, 1) == 32 * per);
  CHECK(gdn_workspace_bytes(d, 64, 64) == 32 * per);
  CHECK(gdn_workspace_bytes(d, 64, 65) == 2 * 32 * per);
  CHECK(gdn_workspace_bytes(d, 64, 4096) == 64 * 32 * per);

  alignas(256) static float buf[64];
  float* p = buf;
  StreamHandle s = nullptr;
  CHECK_NOTHROW(k.run(p, p, p, p, p, 0, p, p, nullptr, s));  // no tokens: nothing to do
  CHECK_THROWS_AS(k.run(p, p, p, p, p, -1, p, p, nullptr, s), KernelError);
  CHECK_THROWS_AS(k.run(nullptr, p, p, p, p, 1, p, p, nullptr, s), KernelError);
  CHECK_THROWS_AS(k.run(p + 1, p, p, p, p, 1, p, p, nullptr, s), KernelError);  // mixed misaligned
  CHECK_THROWS_AS(k.run(p, p, p, p, p, 1, p + 2, p, nullptr, s), KernelError);  // state misaligned
  CHECK_THROWS_AS(k.run(p, p, p, p, p, 1, p, p + 1, nullptr, s), KernelError);  // out misaligned
  CHECK_THROWS_AS(k.run(p, p, p, p, p, 65, p, p, nullptr, s), KernelError);     // chunked needs workspace
  CHECK_THROWS_AS(k.run(p, p, p, p, p, 65, p, p, p + 4, s), KernelError);       // not 256-byte aligned
  CHECK_THROWS_AS(k.run(p, p, p, p, p, 70000, p, p, p, s), KernelError);        // beyond the plan's ranges

  // A loader handing back a variant of other dims or another template is caught at construction.
  const KernelLoader wrong = [&](const Variant& v) {
    if (v.kernel == "gdn_chunk_scan")
      return LoadedKernel{make_variant("gdn_chunk_scan", {{"dk", 64}, {"dv", 128}, {"c", 64}, {"ct", 32}, {"t", 256}}),
                          Kernel{}};
    return LoadedKernel{v, Kernel{}};
  };
  CHECK_THROWS_AS(test::gdn_kernels(wrong, d, 64), KernelError);
  const KernelLoader bad_tiling = [&](const Variant& v) {
    if (v.kernel == "gdn_chunk_scan")  // 32 row groups: 2 chunk rows per thread
      return LoadedKernel{make_variant("gdn_chunk_scan", {{"dk", 128}, {"dv", 128}, {"c", 64}, {"ct", 8}, {"t", 256}}),
                          Kernel{}};
    return LoadedKernel{v, Kernel{}};
  };
  CHECK_THROWS_AS(test::gdn_kernels(bad_tiling, d, 64), KernelError);
  const KernelLoader too_much_smem = [&](const Variant& v) {
    if (v.kernel == "gdn_chunk_scan")  // 32 columns of 128 state rows + the 64 x 132 tile: over 48 KiB
      return LoadedKernel{make_variant("gdn_chunk_scan", {{"dk", 128}, {"dv", 128}, {"c", 64}, {"ct", 32}, {"t", 256}}),
                          Kernel{}};
    return LoadedKernel{v, Kernel{}};
  };
  CHECK_THROWS_AS(test::gdn_kernels(too_much_smem, d, 64), KernelError);
}
