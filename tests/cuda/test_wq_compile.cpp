// CI without a GPU, for the matmul and embedding kernels of the GGUF block types other than Q8_0
// (templates/gemm_wq_dp4a_skinny.cu, gemm_wq_dp4a_tiled.cu, gemv_wq_dp4a.cu, embed_wq.cu, qrig_wtypes.cuh): every variant
// choose_matmul_wq can request (every type, 1..4096 tokens, one and two planes, the default tuning), and
// every type's embedding compiles with
// NVRTC for sm_70 (NVRTC 11.8 where installed: the CMP plans' feature set, nothing newer than sm_70 in it),
// sm_75 and sm_90 without spills and declares its block size; the matmuls use dp4a; the single-row launch over a
// stack of block-type weights (a type's one-row kernel, split outputs) for every type. Also the choice logic: T =
// 1 is the GEMV with the type's tuning entry, T <= 16 the skinny kernel of the next power of two, longer steps
// the tiled GEMM when k is a multiple of 128, else 16-row tiles; shapes that are not whole blocks and types
// without a decode are refused.
#include <catch2/catch.hpp>

#include <set>

#include <fmt/format.h>

#include "kernels/matmul.h"
#include "kernels/pointwise.h"
#include "tests/cuda/compiled_checks.h"
#include "tests/cuda/cuda_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::kernels;

namespace {

const std::vector<int64_t> kTypes = {2, 3, 6, 7, 10, 11, 12, 13, 14, 20, 23};  // Q4_0 .. Q6_K, IQ4_NL, IQ4_XS

}  // namespace

TEST_CASE("matmul_wq: GEMV for one row, the next power of two up to 16, the tiled GEMM beyond; bad shapes refused",
          "[cuda][gemm][wq]") {
  const MatmulTuning& tun = default_tuning(90).matmul;
  for (const int64_t w : kTypes) {
    INFO("type " << w);
    CHECK(wq_dp4a_type(w));
    const auto ranges = choose_matmul_wq(w, 4096, 12288, 1, 512, 2, 132, tun);
    REQUIRE(ranges.size() >= 6);
    for (int64_t T = 1; T <= 512; ++T) {
      const KernelRange* hit = nullptr;
      for (const auto& r : ranges)
        if (T >= r.first && T <= r.last) hit = &r;
      REQUIRE(hit);
      const Variant& v = hit->parts.at(0).at(0);
      CHECK(v.param("w") == w);
      CHECK(v.param("p") == 2);
      if (T == 1) {
        const int64_t split = tun.wq_gemv_for(w).split;
        CHECK(v.kernel == (split == 0 ? "gemm_wq_dp4a_skinny" : split < 0 ? "gemv_wq_k4_dp4a" : "gemv_wq_dp4a"));
      } else if (T <= 16) {
        CHECK(v.kernel == "gemm_wq_dp4a_skinny");
        CHECK(v.param("c") == (T <= 2 ? 2 : T <= 4 ? 4 : T <= 8 ? 8 : 16));
      } else {
        CHECK(v.kernel == "gemm_wq_dp4a_tiled");
      }
    }
    // The GEMV takes the type's tuning entry; the skinny kernels 2 rows per warp up to 4 tokens, 1 beyond.
    const Variant& gemv = ranges[0].parts[0][0];
    const WqGemvTiling& gt = tun.wq_gemv_for(w);
    CHECK(gemv.param("r") == gt.rows);
    CHECK(gemv.param("t") == gt.threads);
    if (gt.split == 0) {
      CHECK(gemv.param("c") == 1);
    } else if (gt.split < 0) {
      CHECK(gemv.kernel == "gemv_wq_k4_dp4a");
    } else {
      CHECK(gemv.param("s") == gt.split);
      CHECK(gemv.param("u") == gt.unroll);
    }
    CHECK(ranges[1].parts[0][0].param("r") == 2);
    const auto upper = choose_matmul_wq(w, 4096, 64, 5, 12, 1);  // one-plane rows above the precise ones
    REQUIRE(upper.size() == 2);
    CHECK(upper[0].first == 5);
    CHECK(upper[0].last == 8);
    CHECK(upper[1].first == 9);
    CHECK(upper[1].last == 12);
    CHECK_THROWS_AS(choose_matmul_wq(w, wq_block_values(w) + 16, 64, 1, 4, 1), KernelError);
    CHECK(parse_variant(ranges[0].parts[0][0].name) == ranges[0].parts[0][0]);
    CHECK(parse_variant(ranges.back().parts[0][0].name) == ranges.back().parts[0][0]);
  }
  // A 32-value type whose rows are not a multiple of 128 values: 16-row tiles of the skinny kernel beyond 16.
  const auto odd = choose_matmul_wq(2, 4096 + 32, 64, 17, 100, 1);
  REQUIRE(odd.size() == 1);
  CHECK(odd[0].parts[0][0].kernel == "gemm_wq_dp4a_skinny");
  CHECK(odd[0].parts[0][0].param("c") == 16);
  // The tuning data decide, not the code: a GEMV entry, the skinny limit.
  MatmulTuning t2 = tun;
  t2.wq_gemv = {{12, 2, 8, 1, 256}};
  CHECK(choose_matmul_wq(12, 4096, 64, 1, 1, 1, 132, t2)[0].parts[0][0].name == "gemv_wq_dp4a_w12_p1_r2_s8_u1_t256");
  CHECK(choose_matmul_wq(3, 4096, 64, 1, 1, 1)[0].parts[0][0].name == "gemv_wq_dp4a_w3_p1_r2_s2_u1_t128");
  // Split -1: Q4_K / Q5_K's sub-block-pair GEMV, also over a stack; a tuning entry naming it for another type is
  // refused, as are shapes it cannot take.
  t2.wq_gemv = {{12, 2, -1, 1, 128}, {13, 4, -1, 1, 256}, {14, 2, -1, 1, 128}};
  CHECK(choose_matmul_wq(12, 4096, 64, 1, 1, 1, 132, t2)[0].parts[0][0].name == "gemv_wq_k4_dp4a_w12_p1_r2_t128");
  CHECK(choose_matmul_wq(13, 4096, 64, 1, 1, 2, 132, t2)[0].parts[0][0].name == "gemv_wq_k4_dp4a_w13_p2_r4_t256");
  CHECK(choose_matmul_stack_wq(12, 4096, 4096 + 1024, 2, 1, 132, t2).parts.at(0).at(0).kernel == "gemv_wq_k4_dp4a");
  CHECK_THROWS_AS(choose_matmul_wq(14, 4096, 64, 1, 1, 1, 132, t2), KernelError);
  CHECK_THROWS_AS(gemv_wq_k4_variant(14, 1, 2, 128), KernelError);
  CHECK_THROWS_AS(gemv_wq_k4_variant(12, 1, 5, 128), KernelError);
  CHECK_THROWS_AS(gemv_wq_k4_variant(12, 1, 2, 100), KernelError);
  CHECK(is_wq_gemv("gemv_wq_k4_dp4a"));
  CHECK(is_wq_gemv("gemv_wq_dp4a"));
  CHECK(!is_wq_gemv("gemm_wq_dp4a_skinny"));
  CHECK(choose_matmul_wq(14, 4096, 64, 1, 1, 1)[0].parts[0][0].name == "gemm_wq_dp4a_skinny_w14_p1_c1_r2_t128");
  t2.wq_skinny_max_rows = 8;
  CHECK(choose_matmul_wq(12, 4096, 64, 12, 12, 1, 132, t2)[0].parts[0][0].kernel == "gemm_wq_dp4a_tiled");
  CHECK(choose_matmul_wq(12, 4096, 64, 12, 12, 1)[0].parts[0][0].name == "gemm_wq_dp4a_skinny_w12_p1_c16_r1_t128");
  CHECK(gemm_wq_skinny_variant(12, 2, 1, 2).name == "gemm_wq_dp4a_skinny_w12_p2_c1_r2_t128");
  CHECK_THROWS_AS(gemv_wq_variant(12, 2, 1, 3, 1, 96), KernelError);   // 3 warps per row
  CHECK_THROWS_AS(gemv_wq_variant(12, 2, 1, 4, 1, 64), KernelError);   // not whole groups of 4 warps
  CHECK_THROWS_AS(gemv_wq_variant(12, 2, 1, 1, 5, 128), KernelError);  // 5 units in flight
  CHECK(wq_type_of_format("q4_k") == 12);
  CHECK(wq_type_of_format("iq4_xs") == 23);
  CHECK(wq_type_of_format("q8_0") == -1);
  CHECK(wq_type_of_format("iq2_xxs") == -1);
  CHECK_THROWS_AS(choose_matmul_wq(8, 4096, 64, 1, 4, 1), KernelError);   // Q8_0 has its own kernels
  CHECK_THROWS_AS(choose_matmul_wq(16, 4096, 64, 1, 4, 1), KernelError);  // IQ2_XXS: no decode
  CHECK_THROWS_AS(gemm_wq_skinny_variant(12, 1, 3, 1), KernelError);
  CHECK_THROWS_AS(gemm_wq_skinny_variant(12, 1, 16, 4), KernelError);  // 64 sums per lane
  CHECK_THROWS_AS(gemm_wq_tiled_variant(12, 1, 96, 64, 8, 4), KernelError);   // not whole warp tiles
  CHECK_THROWS_AS(gemm_wq_tiled_variant(12, 2, 128, 128, 8, 8), KernelError);  // > 48 KiB of shared memory
  CHECK_THROWS_AS(gemm_wq_tiled_variant(8, 1, 128, 64, 8, 4), KernelError);   // Q8_0
  CHECK_THROWS_AS(embed_wq_variant(12, 4096 + 32), KernelError);         // not whole 256-value blocks
  CHECK_NOTHROW(embed_wq_variant(2, 4096 + 32));
}

TEST_CASE("every matmul and embedding variant of the block types compiles for sm_70, sm_75 (one plane) and sm_90 "
          "without spills; sm_70 PTX clean", "[cuda][gemm][wq]") {
  std::vector<test::CompileJob> jobs;
  std::set<std::string> seen;
  std::vector<Variant> stacked;
  auto add = [&](const Variant& v, std::vector<int> sms) {
    if (seen.insert(v.name).second)
      for (int sm : sms) jobs.push_back({v, sm});
  };
  for (const int64_t w : kTypes) {
    // What plans can ask for (every row count, both planes, the default tuning; every tiling of the tiled GEMM,
    // whichever the model picks at these shapes): every architecture.
    // (two planes: only --precise-rows / --precise give block-type matmuls a second plane, quantize_matmul_inputs)
    // The two-plane variants (only with --precise-rows / --precise) for sm_70, the CMP target, and sm_90: the same
    // template text as one plane with the second plane's code compiled in, so sm_75 adds little there and a
    // CI job held to 25 minutes on 2 cores does not spend the time (session 12: 1718 s on the CI machine).
    add(embed_wq_variant(w, 4096), {70, 75, 90});
    for (const int64_t planes : {1, 2}) {
      const std::vector<int> archs = planes == 1 ? std::vector<int>{70, 75, 90} : std::vector<int>{70, 90};
      for (const auto& r : choose_matmul_wq(w, 4096, 4096, 1, 4096, planes)) add(r.parts[0][0], archs);
      // The single-row launch over a stack (matmul_stack: the split-output GEMV of the stacked shape).
      stacked.push_back(choose_matmul_stack_wq(w, 4096, 4096 + 1024 + 1024, 3, planes).parts.at(0).at(0));
      add(stacked.back(), archs);
      for (const GemmTiling& t : default_tuning(90).matmul.wq_tiled[planes - 1])
        add(gemm_wq_tiled_variant(w, planes, t.bn, t.bt, t.tn, t.tt), archs);
    }
  }
  // Q4_K / Q5_K's sub-block-pair GEMV (in the sweep, not yet in the tuning table): r2 at both plane counts for
  // sm_70 and sm_90, one plane also for sm_75, and the other sweep tilings' one plane for sm_90; its stacked
  // single-row launch is the same variant (checked below with the others).
  for (const int64_t w : {12, 13}) {
    add(gemv_wq_k4_variant(w, 1, 2, 128), {70, 75, 90});
    add(gemv_wq_k4_variant(w, 2, 2, 128), {70, 90});
    for (const Variant& v : gemv_wq_sweep(w, 1))
      if (v.kernel == "gemv_wq_k4_dp4a") add(v, {90});
    stacked.push_back(gemv_wq_k4_variant(w, 1, 2, 128));
  }
  // (The GEMV bandwidth sweep's other candidates, gemv_wq_sweep, are compiled where they run: the GPU benchmark.
  // Here they would add ~140 compiles to a CI job held to 25 minutes on 2 cores.)
  INFO(jobs.size() << " compiles");
  const std::vector<CompiledKernel> out = test::compile_and_check("wq-compile", jobs);
  size_t tiled = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (out[i].cubin.empty() || out[i].variant.kernel == "embed_wq") continue;
    INFO(out[i].variant.name << " for sm_" << jobs[i].sm);
    CHECK(out[i].ptx.find("dp4a.s32.s32") != std::string::npos);
    // No local memory (a run-time index into a register array, e.g. the loaded scale words, puts the array on the
    // stack without a spill being reported: that made the Q4_K GEMV 2x slower).
    CHECK(parse_ptxas_report(out[i].log).stack_frame_bytes == 0);
    tiled += out[i].variant.kernel == "gemm_wq_dp4a_tiled";
  }
  CHECK(tiled >= kTypes.size() * 2 * 3);
  // Every stack's one-row kernel compiled for its architectures, with the split outputs (y0..y3, b1..b3: 14
  // parameters for the GEMV, 15 for the skinny kernel) in its PTX entry.
  for (const Variant& v : stacked) {
    INFO(v.name);
    int compiled = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (out[i].variant != v) continue;
      CHECK(!out[i].cubin.empty());
      const std::string last = fmt::format("{}_param_{}", v.kernel, is_wq_gemv(v.kernel) ? 13 : 14);
      CHECK(out[i].ptx.find(last) != std::string::npos);
      compiled += !out[i].cubin.empty();
    }
    CHECK(compiled == (v.param("p") == 1 ? 3 : 2));  // sm_70, (sm_75,) sm_90
  }
}
