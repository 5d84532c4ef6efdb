// Kernel variant names (every parameter spelled out, one canonical name per variant, bad names refused with
// a reason), the registry's templates all embedded, and the variants that the preset rigs' plans request.
#include <catch2/catch.hpp>

#include <algorithm>

#include "kernels/matmul.h"
#include "kernels/pointwise.h"
#include "runtime/cuda/plan_kernels.h"
#include "runtime/cuda/templates.h"
#include "runtime/cuda/variant.h"
#include "tests/cuda/cuda_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::kernels;

namespace {

bool has_variant(const std::vector<Variant>& pk, const std::string& name) {
  return std::any_of(pk.begin(), pk.end(), [&](const Variant& v) { return v.name == name; });
}

}  // namespace

TEST_CASE("variant names spell out every parameter and parse back", "[cuda]") {
  const Variant g = gemv_q8_0_variant(4096, 2, 2, 4, 256);
  CHECK(g.name == "gemv_q8_0_dp4a_k4096_p2_r2_u4_t256");
  CHECK(g.kernel == "gemv_q8_0_dp4a");
  CHECK(g.file == "gemv_q8_0_dp4a.cu");
  CHECK(g.defines() ==
        std::vector<std::string>{"-DQRIG_K=4096", "-DQRIG_PLANES=2", "-DQRIG_ROWS=2", "-DQRIG_UNROLL=4", "-DQRIG_THREADS=256"});
  CHECK(g.threads() == 256);
  CHECK(rmsnorm_f32_variant(4096).name == "rmsnorm_f32_d4096_q0_t256");
  CHECK(rmsnorm_f32_variant(256, 2).name == "rmsnorm_f32_d256_q2_t64");
  CHECK(embed_q8_0_variant(4096).name == "embed_q8_0_d4096_t256");
  CHECK(embed_q8_0_variant(256).name == "embed_q8_0_d256_t32");
  CHECK(quant_act_q8_variant(1).name == "quant_act_q8_p1_t256");
  CHECK(quant_act_q8_variant(2).name == "quant_act_q8_p2_t256");
  CHECK_THROWS_AS(quant_act_q8_variant(3), KernelError);
  for (const Variant& v : {g, rmsnorm_f32_variant(5120), embed_q8_0_variant(5120), quant_act_q8_variant(2)}) {
    const Variant p = parse_variant(v.name);
    CHECK(p.name == v.name);
    CHECK(p.params == v.params);
    CHECK(p.kernel == v.kernel);
  }
}

TEST_CASE("bad variant names and parameters are refused with the reason", "[cuda]") {
  auto msg = [](const std::string& name) {
    try {
      parse_variant(name);
    } catch (const KernelError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  CHECK_THAT(msg("gemv_q8_0_dp4a_k4096_p1_r2_u4"), Catch::Contains("'t'") && Catch::Contains("missing"));
  CHECK_THAT(msg("gemv_q8_0_dp4a_k4095_p1_r2_u4_t256"), Catch::Contains("multiple of 32"));
  CHECK_THAT(msg("gemv_q8_0_dp4a_r2_k4096_p1_u4_t256"), Catch::Contains("not canonical"));
  CHECK_THAT(msg("gemv_q8_0_dp4a_k04096_p1_r2_u4_t256"), Catch::Contains("not canonical"));
  CHECK_THAT(msg("gemv_q8_0_dp4a_k4096_p1_r2_u4_t256_x1"), Catch::Contains("no parameter 'x'"));
  CHECK_THAT(msg("gemv_q8_0_dp4a_k4096_p1_r2_u4_t100"), Catch::Contains("t = 100"));
  CHECK_THAT(msg("gemv_q8_0_dp4a_k4096_p1_r9_u4_t256"), Catch::Contains("r = 9"));
  CHECK_THAT(msg("gemv_q8_0_dp4a_kbig_p1_r2_u4_t256"), Catch::Contains("not a parameter"));
  CHECK_THAT(msg("softmax_f32_d64_t32"), Catch::Contains("no template name"));
  CHECK_THAT(msg("rmsnorm_f32"), Catch::Contains("no template name"));
  CHECK_THROWS_AS(make_variant("nope", {}), KernelError);
  CHECK_THROWS_WITH(make_variant("rmsnorm_f32", {{"d", 64}, {"q", 0}, {"t", 32}, {"d", 128}}), Catch::Contains("more than once"));
}

TEST_CASE("every registered template is embedded, with launch bounds on every kernel", "[cuda]") {
  REQUIRE(!embedded_templates().empty());
  REQUIRE(find_template("qrig_common.cuh") != nullptr);
  for (const auto& t : template_registry()) {
    INFO(t.kernel);
    const TemplateFile* f = find_template(t.file);
    REQUIRE(f != nullptr);
    const std::string src = f->source;
    // __launch_bounds__(QRIG_THREADS) or __launch_bounds__(QRIG_THREADS, min blocks per SM)
    const bool plain = src.find(std::string("extern \"C\" __global__ void __launch_bounds__(QRIG_THREADS)\n") + t.kernel +
                                "(") != std::string::npos;
    const bool with_min = src.find("extern \"C\" __global__ void __launch_bounds__(QRIG_THREADS, ") != std::string::npos &&
                          src.find(std::string(")\n") + t.kernel + "(") != std::string::npos;
    CHECK((plain || with_min));
    CHECK(t.params.back().key == std::string("t"));
    // Every parameter macro is used by the template.
    for (const auto& p : t.params) CHECK(src.find(p.macro) != std::string::npos);
  }
  // Every __global__ in any template is declared with __launch_bounds__.
  const std::string bounded = "__global__ void __launch_bounds__(";
  for (const auto& f : embedded_templates()) {
    const std::string src = f.source;
    for (size_t at = src.find("__global__"); at != std::string::npos; at = src.find("__global__", at + 1)) {
      INFO(f.name);
      CHECK(src.compare(at, bounded.size(), bounded) == 0);
    }
  }
}

TEST_CASE("the variants requested by the preset rigs' plans", "[cuda][fixtures]") {
  for (const std::string rig : {"h200", "cmp-100-210-x4"}) {
    INFO(rig);
    const ir::Plan& p9 = test::preset_plan("9b", rig);
    CHECK(p9.backend == "cuda");
    const std::vector<Variant> k9 = plan_kernels(p9);
    // 9B: D = 4096, FFN 12288; attn_output (16 x 256) and ssm_out (32 x 128) also have 4096 inputs.
    CHECK(has_variant(k9, "embed_q8_0_d4096_t256"));
    // Norms feeding matmuls quantize their output (q1 for prefill, q2 for decode: two activation planes up
    // to plan.precise_rows rows); decode GEMVs take two planes.
    CHECK(p9.precise_rows == 4);
    for (const char* n : {"rmsnorm_f32_d4096_q0_t256", "rmsnorm_f32_d4096_q1_t256", "rmsnorm_f32_d4096_q2_t256",
                          "quant_act_q8_p1_t256", "quant_act_q8_p2_t256", "gemv_q8_0_dp4a_k4096_p2_r1_u2_t256",
                          "gemv_q8_0_dp4a_k12288_p2_r1_u2_t256"})
      CHECK(has_variant(k9, n));
    for (const char* n : {"add_f32_t256", "conv1d_silu_f32_k4_b0_t128", "head_rmsnorm_f32_d256_t128",
                          "gated_rmsnorm_f32_d128_t128", "rope_neox_f32_d256_r64_t128", "kv_write_f16_t256",
                          "argmax_f32_t1024"})
      CHECK(has_variant(k9, n));
    // The residual adds fused with the next quantized norm, the FFN activation with its quantization (issue 25):
    // every swiglu is fused.
    for (const char* n : {"add_rmsnorm_q8_d4096_p1_t256", "add_rmsnorm_q8_d4096_p2_t256", "swiglu_q8_p1_t256",
                          "swiglu_q8_p2_t256"})
      CHECK(has_variant(k9, n));
    CHECK(!has_variant(k9, "swiglu_f32_t256"));
    CHECK(!has_variant(k9, "gemv_q8_0_dp4a_k4096_p1_r1_u2_t256"));  // single rows always take two planes
    CHECK(std::is_sorted(k9.begin(), k9.end()));

    const std::vector<Variant> k27 = plan_kernels(test::preset_plan("27b", rig));
    // 27B: D = 5120, FFN 17408, attention 24 x 256 = 6144 and GDN values 48 x 128 = 6144.
    for (const char* n : {"embed_q8_0_d5120_t256", "rmsnorm_f32_d5120_q2_t256", "gemv_q8_0_dp4a_k5120_p2_r1_u2_t256",
                          "gemv_q8_0_dp4a_k6144_p2_r1_u2_t256", "gemv_q8_0_dp4a_k17408_p2_r1_u2_t256",
                          "quant_act_q8_p1_t256"})
      CHECK(has_variant(k27, n));

    const std::vector<Variant> kt = plan_kernels(test::preset_plan("tiny", rig));
    for (const char* n : {"embed_q8_0_d256_t32", "rmsnorm_f32_d256_q1_t64", "gemv_q8_0_dp4a_k256_p2_r1_u2_t256",
                          "gemv_q8_0_dp4a_k512_p2_r1_u2_t256"})
      CHECK(has_variant(kt, n));
  }
  CHECK(test::preset_plan("9b", "cmp-100-210-x4").arch_target == "sm_70");
  CHECK(test::preset_plan("9b", "h200").arch_target == "sm_90");
}

TEST_CASE("plan_kernels refuses plans that are not CUDA dp4a plans", "[cuda][fixtures]") {
  ir::Plan p = test::preset_plan("tiny", "h200");
  p.kernel_family = "hmma";
  CHECK_THROWS_WITH(plan_kernels(p), Catch::Contains("hmma"));
  p.backend = "cpu";
  CHECK_THROWS_WITH(plan_kernels(p), Catch::Contains("not cuda"));
}
