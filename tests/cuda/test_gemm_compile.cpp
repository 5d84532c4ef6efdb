// CI without a GPU, for the GEMM kernel set (gemm.h): every variant that matmul_q8_0_variants can request for
// the 9B and 27B matmul shapes (prefill chunks up to 8192 rows, on an H200's 132 SMs and a CMP 100-210's 80)
// compiles with NVRTC for sm_75 and sm_90 without register spills, declares its block size, uses dp4a, and
// for the sm_70 feature set (the CMP plans) holds no PTX instruction newer than sm_70. Also the choice logic
// itself: every T maps to one listed variant, T = 1 to the decode GEMV, small T to the skinny kernel.
#include <catch2/catch.hpp>

#include <set>

#include <fmt/format.h>

#include "runtime/cuda/gemm.h"
#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/ptx_scan.h"
#include "tests/cuda/compiled_checks.h"
#include "tests/cuda/cuda_test_util.h"

using namespace qrig;
using namespace qrig::cuda;

namespace {

// (k, n) of every Q8_0 matmul of Qwen3.5 9B and 27B (QWEN35.md): FFN, GDN qkv/gate/alpha/beta/out, attention
// q/k/v/o, lm_head.
const std::vector<std::pair<int64_t, int64_t>> kShapes = {
    {4096, 12288}, {12288, 4096}, {4096, 8192}, {4096, 4096}, {4096, 32}, {4096, 1024}, {4096, 248320},
    {5120, 17408}, {17408, 5120}, {5120, 10240}, {5120, 6144}, {6144, 5120}, {5120, 48}, {5120, 12288},
    {5120, 1024}, {5120, 248320}};
const std::vector<int64_t> kMaxT = {8, 64, 512, 8192};
const std::vector<int> kSms = {132, 80};

std::vector<Variant> all_gemm_variants() {
  std::set<std::string> seen;
  std::vector<Variant> out;
  for (const auto& [k, n] : kShapes)
    for (const int64_t max_t : kMaxT)
      for (const int sms : kSms)
        for (Variant& v : matmul_q8_0_variants(k, n, max_t, sms))
          if (seen.insert(v.name).second) out.push_back(std::move(v));
  return out;
}

}  // namespace

TEST_CASE("matmul_q8_0 picks one listed variant for every T: GEMV, skinny, tiled", "[cuda][gemm]") {
  for (const auto& [k, n] : kShapes)
    for (const int sms : kSms) {
      const int64_t max_t = 4096;
      const std::vector<Variant> vs = matmul_q8_0_variants(k, n, max_t, sms);
      INFO(k << " -> " << n << " on " << sms << " SMs");
      CHECK(vs.front() == gemv_q8_0_variant(k));
      std::set<std::string> used;
      for (int64_t T = 1; T <= max_t; ++T) {
        const Variant v = matmul_q8_0_choice(k, n, T, sms);
        INFO("T = " << T << ": " << v.name);
        REQUIRE(std::find(vs.begin(), vs.end(), v) != vs.end());
        used.insert(v.name);
        if (T == 1) {
          CHECK(v.kernel == "gemv_q8_0_dp4a");
        } else if (T <= kSkinnyMaxT) {
          CHECK(v.kernel == "gemm_q8_0_dp4a_skinny");
          CHECK(v.param("c") >= T);
        } else {
          CHECK(v.kernel == "gemm_q8_0_dp4a_tiled");
          CHECK(k % (32 * v.param("kb") * v.param("sk")) == 0);
        }
      }
      CHECK(used.size() == vs.size());  // nothing listed that no T uses
      CHECK(matmul_q8_0_variants(k, n, 1, sms) == std::vector<Variant>{gemv_q8_0_variant(k)});
    }
  // Large prefill chunks of the big shapes run the 128 x 128 tile.
  for (const int64_t T : {512, 1024, 4096}) {
    const Variant v = matmul_q8_0_choice(4096, 12288, T, 132);
    CHECK(v.param("bn") * v.param("bt") >= 128 * 64);
    CHECK(v.param("sk") == 1);
  }
  CHECK_THROWS_AS(matmul_q8_0_choice(100, 64, 4, 132), KernelError);
  CHECK_THROWS_AS(matmul_q8_0_variants(4096, 64, 0, 132), KernelError);
  CHECK_THROWS_AS(gemm_q8_0_tiled_variant(128, 128, 8, 8, 3), KernelError);
  CHECK_THROWS_AS(gemm_q8_0_tiled_variant(96, 128, 8, 8, 1), KernelError);  // 96 rows: not whole 64-row warps
  CHECK_THROWS_AS(gemm_q8_0_skinny_variant(3, 2, 2, 128), KernelError);     // not a power of two
  CHECK_THROWS_AS(gemm_q8_0_skinny_variant(16, 8, 1, 128), KernelError);    // 128 sums per lane
  const Variant t = gemm_q8_0_tiled_variant(128, 64, 8, 4, 1);
  CHECK(t.name == "gemm_q8_0_dp4a_tiled_bn128_bt64_tn8_tt4_kb1_sk1_t256");
  CHECK(gemm_q8_0_tiled_variant(32, 32, 4, 4, 2, 4).threads() == 256);
  CHECK(parse_variant(t.name) == t);
  const Variant s = gemm_q8_0_skinny_variant(8, 2, 2, 128);
  CHECK(s.name == "gemm_q8_0_dp4a_skinny_c8_r2_u2_t128");
  CHECK(parse_variant(s.name) == s);
}

TEST_CASE("every GEMM variant of the 9B/27B shapes compiles for sm_75 and sm_90 without spills; sm_70 PTX clean",
          "[cuda][gemm]") {
  const std::vector<Variant> variants = all_gemm_variants();
  REQUIRE(variants.size() >= 4);
  std::vector<test::CompileJob> jobs;
  for (const Variant& v : variants)
    for (int sm : {70, 75, 90}) jobs.push_back({v, sm});
  test::ScratchDir dir("gemm-compile");
  KernelCompiler compiler(dir.path);
  std::vector<std::string> errors;
  const std::vector<CompiledKernel> out = test::compile_all(compiler, jobs, errors);
  for (const auto& e : errors) FAIL_CHECK(e);

  for (size_t i = 0; i < jobs.size(); ++i) {
    const CompiledKernel& k = out[i];
    if (k.cubin.empty()) continue;  // reported above
    test::check_compiled_kernel(k, jobs[i].sm);
    INFO(k.variant.name << " for sm_" << jobs[i].sm);
    CHECK(k.ptx.find("dp4a.s32.s32") != std::string::npos);
  }
}
