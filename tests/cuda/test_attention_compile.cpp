// CI without a GPU for the attention kernels (runtime/cuda/attention.h): every variant attention_variants()
// gives for the tiny fixture, 9B and 27B dims (QWEN35.md / fixtures README: 2/1, 16/4 and 24/4 query/KV
// heads of 256), plus the fp32-P.V prefill a loader may substitute (9B), compiles with NVRTC with no register
// spills and the declared block size, for sm_90 and for the CMP's sm_70 feature set, whose PTX must hold
// nothing newer than sm_70. Under NVRTC 13 the sm_70 feature set is compiled to sm_75 code, so that job is
// also the sm_75 check (the attention templates do not read QRIG_SM); 20 NVRTC runs in all. Also the host
// side: variant names, refused dims, the workspace bound, and run()'s argument checks (they throw before
// anything reaches a GPU).
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include <fmt/format.h>

#include "runtime/cuda/attention.h"
#include "tests/cuda/kernel_sets.h"
#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/ptx_scan.h"
#include "tests/cuda/compiled_checks.h"
#include "tests/cuda/cuda_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::kernels;

namespace {

const std::vector<AttentionDims> kDims = {{2, 1, 256}, {16, 4, 256}, {24, 4, 256}};

}  // namespace

TEST_CASE("attention variants compile for sm_75 and sm_90 without spills; the sm_70 feature set is sm_70-only",
          "[cuda][attention]") {
  std::map<std::string, Variant> all;
  for (const AttentionDims& d : kDims)
    for (const Variant& v : attention_variants(d, 262144, 132)) {
      all.emplace(v.name, v);
      if (v.kernel == "attn_prefill" && d.Hq == 16)  // the other P.V family, which run() accepts too
        for (int64_t h : {0, 1}) {
          auto p = v.params;
          for (auto& [k, x] : p)
            if (k == "h") x = h;
          const Variant o = make_variant(v.kernel, p);
          all.emplace(o.name, o);
        }
    }
  // tiny: decode n1, n4; 9B: decode n1, n2; 27B: decode n1; prefill h0 for g2, g4, g6 (+ h1 for g4); merge.
  REQUIRE(all.size() == 10);
  std::vector<test::CompileJob> jobs;
  for (const auto& [name, v] : all)
    for (int sm : {70, 90}) jobs.push_back({v, sm});

  const std::vector<CompiledKernel> out = test::compile_and_check("attention-compile", jobs);

  for (size_t i = 0; i < jobs.size(); ++i) {
    const CompiledKernel& k = out[i];
    if (k.cubin.empty()) continue;  // reported by compile_and_check
    INFO(k.variant.name << " for feature sm_" << jobs[i].sm);
    if (jobs[i].sm == 70) CHECK(k.arch.target_sm <= 75);
    CHECK(parse_ptxas_report(k.log).stack_frame_bytes == 0);
  }
}

TEST_CASE("attention variant names spell every parameter; dims the kernels cannot take are refused",
          "[cuda][attention]") {
  auto names = [](const AttentionDims& d) {
    std::vector<std::string> n;
    for (const Variant& v : attention_variants(d, 4096, 132)) {
      CHECK(parse_variant(v.name) == v);
      n.push_back(v.name);
    }
    return n;
  };
  CHECK(names({16, 4, 256}) == std::vector<std::string>{"attn_decode_d256_g4_n1_k16_v16_b0_t128", "attn_decode_d256_g4_n2_k16_v16_b0_t128",
                                                         "attn_prefill_d256_g4_h0_k16_v16_t128", "attn_merge_d256_b0_t256"});
  CHECK(names({2, 1, 256}) == std::vector<std::string>{"attn_decode_d256_g2_n1_k16_v16_b0_t128", "attn_decode_d256_g2_n4_k16_v16_b0_t128",
                                                        "attn_prefill_d256_g2_h0_k16_v16_t128", "attn_merge_d256_b0_t256"});
  CHECK(names({24, 4, 256}) == std::vector<std::string>{"attn_decode_d256_g6_n1_k16_v16_b0_t128", "attn_prefill_d256_g6_h0_k16_v16_t128",
                                                         "attn_merge_d256_b0_t256"});
  CHECK_THROWS_AS(attention_variants({16, 4, 128}, 4096, 132), KernelError);  // head dim
  CHECK_THROWS_AS(attention_variants({16, 5, 256}, 4096, 132), KernelError);  // not a multiple
  CHECK_THROWS_AS(attention_variants({18, 2, 256}, 4096, 132), KernelError);  // 9 heads per KV head
  CHECK_THROWS_AS(attention_variants({0, 4, 256}, 4096, 132), KernelError);
  CHECK_THROWS_AS(attention_variants({16, 4, 256}, 0, 132), KernelError);
  CHECK_THROWS_AS(attention_variants({16, 4, 256}, 4096, 0), KernelError);
}

TEST_CASE("attention workspace bound and run() argument checks (no GPU: they throw before any launch)",
          "[cuda][attention]") {
  std::vector<std::string> asked;
  const KernelLoader fake = [&](const Variant& v) {
    asked.push_back(v.name);
    return LoadedKernel{v, Kernel{}};
  };
  const AttentionDims d{16, 4, 256};
  const AttentionKernels k = test::attention_kernels(fake, d, 65536, 132);
  CHECK(asked.size() == 6);  // three ranges (decode 1, decode 2, prefill), each its kernel and the merge
  const AttentionCtas ctas = test::attention_choice(d, 65536, 132).ctas;
  auto ws = [&](int64_t max_t) { return attention_workspace_bytes(d, ctas, 65536, max_t); };
  // Decode: 2 x 132 SMs or more CTAs over 4 KV heads -> >= 66 splits of (T = 1) x 16 heads x 256 floats.
  CHECK(ws(1) >= 66 * 16 * 256 * 4);
  CHECK(ws(2) >= ws(1));
  // A bound over every T up to max_t: never smaller for a larger max_t, and finite for long prompts.
  CHECK(ws(512) >= ws(64));
  CHECK(ws(4096) < ((int64_t)1 << 31));
  CHECK_THROWS_AS(ws(0), KernelError);

  alignas(256) static float buf[64];
  alignas(256) static uint16_t cache[64];
  float* p = buf;
  const uint16_t* c = cache;
  StreamHandle s = nullptr;
  auto run = [&](const float* q, const uint16_t* kc, int64_t T, int64_t pos0, const float* gate, float* out,
                 void* ws) { k.run(q, kc, kc, T, pos0, 0.0625f, gate, 2 * 16 * 256, 2 * 256, out, ws, s); };
  CHECK_NOTHROW(run(p, c, 0, 0, p + 16, p + 32, nullptr));      // no tokens: nothing to do
  CHECK_THROWS_AS(run(p, c, -1, 0, p, p + 32, nullptr), KernelError);
  CHECK_THROWS_AS(run(p, c, 1, -1, p, p + 32, nullptr), KernelError);
  CHECK_THROWS_AS(run(p, c, 2, 65535, p, p + 32, nullptr), KernelError);  // past the context
  CHECK_THROWS_AS(run(nullptr, c, 1, 0, p, p + 32, nullptr), KernelError);
  CHECK_THROWS_AS(run(p + 1, c, 1, 0, p, p + 32, nullptr), KernelError);  // q misaligned
  CHECK_THROWS_AS(run(p, c + 1, 1, 0, p, p + 32, nullptr), KernelError);  // cache misaligned
  CHECK_THROWS_AS(run(p, c, 1, 0, p, p + 33, nullptr), KernelError);      // out misaligned
  CHECK_THROWS_AS(run(p, c, 1, 0, p, p, nullptr), KernelError);           // out aliases q
  CHECK_THROWS_AS(run(p, c, 1, 0, nullptr, p + 32, nullptr), KernelError);
  CHECK_THROWS_AS(run(p, c, 1, 40000, p, p + 32, nullptr), KernelError);  // split partials need the workspace
  CHECK_THROWS_AS(run(p, c, 1, 40000, p, p + 32, p + 4), KernelError);    // not 256-byte aligned
  CHECK_THROWS_AS(k.run(p, c, c, 1, 0, std::nanf(""), p, 0, 0, p + 32, nullptr, s), KernelError);

  // A loader handing back another template or other dims is caught at construction.
  const KernelLoader wrong = [&](const Variant& v) {
    if (v.kernel == "attn_prefill")
      return LoadedKernel{make_variant("attn_prefill", {{"d", 256}, {"g", 2}, {"h", 1}, {"k", 16}, {"v", 16}, {"t", 128}}), Kernel{}};
    return LoadedKernel{v, Kernel{}};
  };
  CHECK_THROWS_AS(test::attention_kernels(wrong, d, 4096, 132), KernelError);
  // ... but the fp32 P.V prefill of the right dims is accepted (rigs whose HFMA2 is slow).
  const KernelLoader fp32 = [&](const Variant& v) {
    if (v.kernel == "attn_prefill")
      return LoadedKernel{make_variant("attn_prefill", {{"d", 256}, {"g", 4}, {"h", 0}, {"k", 16}, {"v", 16}, {"t", 128}}), Kernel{}};
    return LoadedKernel{v, Kernel{}};
  };
  CHECK_NOTHROW(test::attention_kernels(fp32, d, 4096, 132));
}
