// CI without a GPU, for the GEMM kernel set (gemm.h): every variant that matmul_q8_0_variants can request for
// the 9B and 27B matmul shapes (prefill chunks up to 8192 rows, on an H200's 132 SMs and a CMP 100-210's 80,
// one and two activation planes) compiles with NVRTC for sm_75 and sm_90 without register spills, declares
// its block size, uses dp4a, and for the sm_70 feature set (the CMP plans) holds no PTX instruction newer
// than sm_70; a two-plane variant holds exactly twice the dp4a of its one-plane twin (the same tiling). Also
// the choice logic itself: every T maps to one listed variant, T = 1 to the decode GEMV, small T to the
// skinny kernel, and every tiled choice fits the shared memory with its planes.
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include <fmt/format.h>

#include "kernels/matmul.h"
#include "runtime/cuda/gemm.h"
#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/ptx_scan.h"
#include "tests/cuda/compiled_checks.h"
#include "tests/cuda/cuda_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::kernels;

namespace {

// (k, n) of every Q8_0 matmul of Qwen3.5 9B and 27B (QWEN35.md): FFN, GDN qkv/gate/alpha/beta/out, attention
// q/k/v/o, lm_head.
const std::vector<std::pair<int64_t, int64_t>> kShapes = {
    {4096, 12288}, {12288, 4096}, {4096, 8192}, {4096, 4096}, {4096, 32}, {4096, 1024}, {4096, 248320},
    {5120, 17408}, {17408, 5120}, {5120, 10240}, {5120, 6144}, {6144, 5120}, {5120, 48}, {5120, 12288},
    {5120, 1024}, {5120, 248320}};
const std::vector<int64_t> kMaxT = {8, 64, 512, 8192};
const std::vector<int> kSms = {132, 80};

// Every GEMM variant (not the GEMV) the shapes may request, both planes; with each two-plane variant its
// one-plane twin (same name with p1), for the dp4a count comparison.
std::vector<Variant> all_gemm_variants() {
  std::set<std::string> seen;
  std::vector<Variant> out;
  auto add = [&](Variant v) {
    if (v.kernel != "gemv_q8_0_dp4a" && seen.insert(v.name).second) out.push_back(std::move(v));
  };
  for (const int64_t planes : {1, 2})
    for (const auto& [k, n] : kShapes)
      for (const int64_t max_t : kMaxT)
        for (const int sms : kSms)
          for (Variant& v : matmul_q8_0_variants(k, n, max_t, sms, planes)) {
            if (planes == 2 && v.kernel != "gemv_q8_0_dp4a") {
              std::vector<std::pair<std::string, int64_t>> p1 = v.params;
              p1.front().second = 1;  // "p" comes first
              add(make_variant(v.kernel, p1));
            }
            add(std::move(v));
          }
  return out;
}

int64_t count_of(const std::string& text, const std::string& what) {
  int64_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

}  // namespace

TEST_CASE("matmul_q8_0 picks one listed variant for every T: GEMV, skinny, tiled; one and two planes", "[cuda][gemm]") {
  for (const int64_t planes : {1, 2})
    for (const auto& [k, n] : kShapes)
      for (const int sms : kSms) {
        const int64_t max_t = 4096;
        const std::vector<Variant> vs = matmul_q8_0_variants(k, n, max_t, sms, planes);
        INFO(k << " -> " << n << " on " << sms << " SMs, " << planes << " plane(s)");
        CHECK(vs.front() == gemv_q8_0_variant(k, planes));
        std::set<std::string> used;
        for (int64_t T = 1; T <= max_t; ++T) {
          const Variant v = matmul_q8_0_choice(k, n, T, sms, planes);
          INFO("T = " << T << ": " << v.name);
          REQUIRE(std::find(vs.begin(), vs.end(), v) != vs.end());
          used.insert(v.name);
          CHECK(v.param("p") == planes);
          if (T == 1) {
            CHECK(v.kernel == "gemv_q8_0_dp4a");
          } else if (T <= default_tuning(90).matmul.skinny_max_rows) {
            CHECK(v.kernel == "gemm_q8_0_dp4a_skinny");
            CHECK(v.param("c") >= T);
          } else {
            CHECK(v.kernel == "gemm_q8_0_dp4a_tiled");
            CHECK(k % (32 * v.param("kb") * v.param("sk")) == 0);
            CHECK(gemm_q8_0_tiled_smem_bytes(planes, v.param("bn"), v.param("bt"), v.param("kb"), v.param("sk")) <=
                  kTiledSmemLimit);
          }
        }
        CHECK(used.size() == vs.size());  // nothing listed that no T uses
        CHECK(matmul_q8_0_variants(k, n, 1, sms, planes) == std::vector<Variant>{gemv_q8_0_variant(k, planes)});
      }
  // Large prefill chunks of the big shapes run a large tile (two planes: 128 x 32 keeps two CTAs per SM).
  for (const int64_t T : {512, 1024, 4096}) {
    const Variant v = matmul_q8_0_choice(4096, 12288, T, 132, 1);
    CHECK(v.param("bn") * v.param("bt") >= 128 * 64);
    CHECK(v.param("sk") == 1);
    const Variant v2 = matmul_q8_0_choice(4096, 12288, T, 132, 2);
    CHECK(v2.param("bn") * v2.param("bt") >= 128 * 32);
    CHECK(v2.param("sk") == 1);
  }
  CHECK_THROWS_AS(matmul_q8_0_choice(100, 64, 4, 132, 1), KernelError);
  CHECK_THROWS_AS(matmul_q8_0_choice(4096, 64, 4, 132, 0), KernelError);
  CHECK_THROWS_AS(matmul_q8_0_choice(4096, 64, 4, 132, 3), KernelError);
  CHECK_THROWS_AS(matmul_q8_0_variants(4096, 64, 0, 132, 1), KernelError);
  CHECK_THROWS_AS(gemm_q8_0_tiled_variant(1, 128, 128, 8, 8, 3), KernelError);
  CHECK_THROWS_AS(gemm_q8_0_tiled_variant(1, 96, 128, 8, 8, 1), KernelError);  // 96 rows: not whole 64-row warps
  CHECK_THROWS_AS(gemm_q8_0_tiled_variant(3, 128, 64, 8, 4, 1), KernelError);  // planes 1..2
  CHECK_THROWS_AS(gemm_q8_0_skinny_variant(1, 3, 2, 2, 128), KernelError);     // not a power of two
  CHECK_THROWS_AS(gemm_q8_0_skinny_variant(1, 16, 8, 1, 128), KernelError);    // 128 sums per lane
  CHECK_THROWS_AS(gemm_q8_0_skinny_variant(0, 16, 4, 1, 128), KernelError);
  // Shared memory: the template's own layout, and the second plane's tiles refused where they do not fit.
  CHECK(gemm_q8_0_tiled_smem_bytes(1, 128, 64, 2, 1) == 28672);  // ptxas: 28672 bytes smem
  CHECK(gemm_q8_0_tiled_smem_bytes(2, 128, 64, 2, 1) == 37376);
  CHECK(gemm_q8_0_tiled_smem_bytes(1, 32, 32, 2, 4) == 40960);
  CHECK_NOTHROW(gemm_q8_0_tiled_variant(1, 128, 128, 8, 8, 2));
  CHECK_THROWS_AS(gemm_q8_0_tiled_variant(2, 128, 128, 8, 8, 2), KernelError);
  CHECK_NOTHROW(gemm_q8_0_tiled_variant(2, 128, 128, 8, 8, 1));
  CHECK_NOTHROW(gemm_q8_0_tiled_variant(1, 32, 32, 4, 4, 2, 4));
  CHECK_THROWS_AS(gemm_q8_0_tiled_variant(2, 32, 32, 4, 4, 2, 4), KernelError);
  CHECK_NOTHROW(gemm_q8_0_tiled_variant(2, 32, 32, 4, 4, 1, 4));
  const Variant t = gemm_q8_0_tiled_variant(1, 128, 64, 8, 4, 1);
  CHECK(t.name == "gemm_q8_0_dp4a_tiled_p1_bn128_bt64_tn8_tt4_kb1_sk1_t256");
  CHECK(gemm_q8_0_tiled_variant(2, 128, 64, 8, 4, 1).name == "gemm_q8_0_dp4a_tiled_p2_bn128_bt64_tn8_tt4_kb1_sk1_t256");
  CHECK(gemm_q8_0_tiled_variant(1, 32, 32, 4, 4, 2, 4).threads() == 256);
  CHECK(parse_variant(t.name) == t);
  const Variant s = gemm_q8_0_skinny_variant(2, 8, 2, 2, 128);
  CHECK(s.name == "gemm_q8_0_dp4a_skinny_p2_c8_r2_u2_t128");
  CHECK(parse_variant(s.name) == s);
}

TEST_CASE("a matmul serving only T >= min_t lists and loads only the variants those T use", "[cuda][gemm]") {
  // One-plane matmuls run above plan.precise_rows rows: no GEMV or small skinny kernel for them.
  const int64_t k = 4096, n = 12288, max_t = 512, min_t = 5;
  const std::vector<Variant> vs = matmul_q8_0_variants(k, n, max_t, 132, 1, min_t);
  std::set<std::string> want;
  for (int64_t T = min_t; T <= max_t; ++T) want.insert(matmul_q8_0_choice(k, n, T, 132, 1).name);
  std::set<std::string> got;
  for (const Variant& v : vs) got.insert(v.name);
  CHECK(got == want);
  CHECK(got.count(gemv_q8_0_variant(k, 1).name) == 0);
  std::vector<std::string> loaded;  // the variants alone (no cubin): enough for the choice logic
  const KernelLoader load = [&](const Variant& v) {
    loaded.push_back(v.name);
    return LoadedKernel{v, {}};
  };
  std::vector<ir::LaunchRange> ranges;  // what a plan's kernel attribute says for these rows
  for (const auto& r : choose_matmul_q8_0(k, n, min_t, max_t, 132, 1, default_tuning(90).matmul))
    ranges.push_back({r.first, r.last, {{r.parts[0][0].name}}});
  const MatmulKernels mm(load, ranges);
  CHECK(std::set<std::string>(loaded.begin(), loaded.end()) == want);
  for (int64_t T : {min_t, (int64_t)16, (int64_t)17, max_t})
    CHECK(mm.kernel_for(T).variant == matmul_q8_0_choice(k, n, T, 132, 1));
  CHECK_THROWS_AS(mm.kernel_for(min_t - 1), KernelError);
  CHECK_THROWS_AS(mm.kernel_for(max_t + 1), KernelError);
  CHECK_THROWS_AS(matmul_q8_0_variants(k, n, 4, 132, 1, 5), KernelError);  // an empty range
}

TEST_CASE("every GEMM variant of the 9B/27B shapes compiles for sm_75 and sm_90 without spills; sm_70 PTX clean",
          "[cuda][gemm]") {
  const std::vector<Variant> variants = all_gemm_variants();
  REQUIRE(variants.size() >= 4);
  std::vector<test::CompileJob> jobs;
  for (const Variant& v : variants)
    for (int sm : {70, 75, 90}) jobs.push_back({v, sm});
  const std::vector<CompiledKernel> out = test::compile_and_check("gemm-compile", jobs);

  std::map<std::pair<std::string, int>, int64_t> dp4a;  // by (variant, feature sm)
  for (size_t i = 0; i < jobs.size(); ++i) {
    const CompiledKernel& k = out[i];
    if (k.cubin.empty()) continue;  // reported by compile_and_check
    INFO(k.variant.name << " for sm_" << jobs[i].sm);
    dp4a[{k.variant.name, jobs[i].sm}] = count_of(k.ptx, "dp4a.s32.s32");
    CHECK(dp4a[{k.variant.name, jobs[i].sm}] > 0);
  }
  // Two planes: twice the dp4a of the same tiling with one (every loop that holds them is unrolled).
  int64_t pairs = 0;
  for (const auto& [key, n] : dp4a) {
    const Variant v = parse_variant(key.first);
    if (v.param("p") != 2) continue;
    std::vector<std::pair<std::string, int64_t>> p1 = v.params;
    p1.front().second = 1;
    const auto twin = dp4a.find({make_variant(v.kernel, p1).name, key.second});
    INFO(key.first << " for sm_" << key.second);
    REQUIRE(twin != dp4a.end());
    CHECK(n == 2 * twin->second);
    ++pairs;
  }
  CHECK(pairs > 0);
}
