// CI without a GPU, for the matmul and embedding kernels of the GGUF block types other than Q8_0
// (templates/gemm_wq_dp4a_skinny.cu, embed_wq.cu, qrig_wtypes.cuh): every variant choose_matmul_wq can request
// (every type, 1..16 tokens, one and two planes) and every type's embedding compiles with NVRTC for sm_75 and
// sm_90 without spills, declares its block size, and for the sm_70 feature set (the CMP plans) holds nothing
// newer than sm_70; the matmuls use dp4a. Also the choice logic: T = 1 is the GEMV (c1), T <= 16 the next power
// of two, longer steps 16-row tiles; shapes that are not whole blocks and types without a decode are refused.
#include <catch2/catch.hpp>

#include <set>

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

TEST_CASE("matmul_wq: GEMV for one row, the next power of two up to 16, 16-row tiles beyond; bad shapes refused",
          "[cuda][gemm][wq]") {
  for (const int64_t w : kTypes) {
    INFO("type " << w);
    CHECK(wq_dp4a_type(w));
    const auto ranges = choose_matmul_wq(w, 4096, 12288, 1, 512, 2);
    REQUIRE(ranges.size() == 5);
    for (int64_t T = 1; T <= 512; ++T) {
      const KernelRange* hit = nullptr;
      for (const auto& r : ranges)
        if (T >= r.first && T <= r.last) hit = &r;
      REQUIRE(hit);
      const Variant& v = hit->parts.at(0).at(0);
      CHECK(v.kernel == "gemm_wq_dp4a_skinny");
      CHECK(v.param("w") == w);
      CHECK(v.param("p") == 2);
      CHECK(v.param("c") == (T == 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : T <= 8 ? 8 : 16));
    }
    const auto upper = choose_matmul_wq(w, 4096, 64, 5, 12, 1);  // one-plane rows above the precise ones
    REQUIRE(upper.size() == 2);
    CHECK(upper[0].first == 5);
    CHECK(upper[0].last == 8);
    CHECK(upper[1].first == 9);
    CHECK(upper[1].last == 12);
    CHECK_THROWS_AS(choose_matmul_wq(w, wq_block_values(w) + 16, 64, 1, 4, 1), KernelError);
    CHECK(parse_variant(ranges[0].parts[0][0].name) == ranges[0].parts[0][0]);
  }
  CHECK(choose_matmul_wq(12, 4096, 64, 1, 1, 1)[0].parts[0][0].name == "gemm_wq_dp4a_skinny_w12_p1_c1_r2_t128");
  CHECK(wq_type_of_format("q4_k") == 12);
  CHECK(wq_type_of_format("iq4_xs") == 23);
  CHECK(wq_type_of_format("q8_0") == -1);
  CHECK(wq_type_of_format("iq2_xxs") == -1);
  CHECK_THROWS_AS(choose_matmul_wq(8, 4096, 64, 1, 4, 1), KernelError);   // Q8_0 has its own kernels
  CHECK_THROWS_AS(choose_matmul_wq(16, 4096, 64, 1, 4, 1), KernelError);  // IQ2_XXS: no decode
  CHECK_THROWS_AS(gemm_wq_skinny_variant(12, 1, 3, 1), KernelError);
  CHECK_THROWS_AS(gemm_wq_skinny_variant(12, 1, 16, 4), KernelError);     // 64 sums per lane
  CHECK_THROWS_AS(embed_wq_variant(12, 4096 + 32), KernelError);         // not whole 256-value blocks
  CHECK_NOTHROW(embed_wq_variant(2, 4096 + 32));
}

TEST_CASE("every matmul and embedding variant of the block types compiles for sm_75 and sm_90 without spills; "
          "sm_70 PTX clean", "[cuda][gemm][wq]") {
  std::vector<test::CompileJob> jobs;
  std::set<std::string> seen;
  for (const int64_t w : kTypes) {
    std::vector<Variant> vs = {embed_wq_variant(w, 4096)};
    for (const int64_t planes : {1, 2})
      for (const auto& r : choose_matmul_wq(w, 4096, 4096, 1, 64, planes)) vs.push_back(r.parts[0][0]);
    for (const Variant& v : vs)
      if (seen.insert(v.name).second)
        for (int sm : {70, 75, 90}) jobs.push_back({v, sm});
  }
  REQUIRE(jobs.size() == kTypes.size() * 11 * 3);
  const std::vector<CompiledKernel> out = test::compile_and_check("wq-compile", jobs);
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (out[i].cubin.empty() || out[i].variant.kernel != "gemm_wq_dp4a_skinny") continue;
    INFO(out[i].variant.name << " for sm_" << jobs[i].sm);
    CHECK(out[i].ptx.find("dp4a.s32.s32") != std::string::npos);
  }
}
