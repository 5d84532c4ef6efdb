// CI without a GPU for the quantized key/value cache kernels (templates/kv_write.cu, attn_decode_dp4a (the int8
// query over q8/t4/t3 keys), attn_decode/attn_prefill with q8/t4/t3 caches, attn_merge_rot): every variant a CUDA
// plan names for the KV-format pass's candidate pairs (k8v8, k8v4, k8v3, k4v4, k4v3, k3v3) at the tiny fixture's,
// 9B's and 27B's dims (2/1, 16/4, 24/4 heads of 256), plus pairs only --kv gives that put each format in the other
// role (k16v3, k3v16, k16v8, k8v16, k3v8) at 9B dims, plus the fp32-query decode over quantized keys that --precise
// plans name (9B, one token, k8v4 and k3v3), compiles with NVRTC with no spills, the declared block
// size and no stack frame, for sm_90 and for the CMP's sm_70 feature set (NVRTC 11.8 where installed: its PTX must
// hold nothing newer than sm_70). Also the host side: names spell both formats, the KV-format pass's renaming
// (with_kv_formats) and the prefill's shared memory per value format, the int8 key levels the kernels hold against
// kernels::kv_key_levels_i8, and the argument checks of AttentionKernels and launch_kv_write.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>

#include "kernels/attention.h"
#include "runtime/cuda/attention.h"
#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/templates.h"
#include "tests/cuda/compiled_checks.h"
#include "tests/cuda/cuda_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::kernels;

namespace {

KvPair pair(const char* s) { return *parse_kv_pair(s); }

void add_plan_variants(std::map<std::string, Variant>& all, const AttentionDims& d, KvPair kv) {
  for (const Variant& v : attention_variants(d, 262144, 132, kv)) all.emplace(v.name, v);
  const Variant w = kv_write_variant(kv);
  all.emplace(w.name, w);
}

}  // namespace

TEST_CASE("quantized-cache KV write and attention variants compile for sm_70 and sm_90 without spills",
          "[cuda][attention][kv]") {
  std::map<std::string, Variant> all;
  for (const char* p : {"k8v8", "k8v4", "k8v3", "k4v4", "k4v3", "k3v3"})
    for (const AttentionDims& d : std::vector<AttentionDims>{{2, 1, 256}, {16, 4, 256}, {24, 4, 256}})
      add_plan_variants(all, d, pair(p));
  for (const char* p : {"k16v3", "k3v16", "k16v8", "k8v16", "k3v8"}) add_plan_variants(all, {16, 4, 256}, pair(p));
  for (const char* p : {"k8v4", "k3v3"}) {  // (q8 and t3 keys, t4 and t3 values: each code path once)
    const Variant v = attn_decode_for(4, 1, pair(p), 0, false);
    all.emplace(v.name, v);
  }
  // Per pair: decode n1 for g2, g4, g6, n4 (g2), n2 (g4), prefill for g2, g4, g6 (8), the KV write; 9B only for
  // the --kv pairs (decode n1, n2, prefill: 3 + the write); the two merges; the fp32-query decodes.
  REQUIRE(all.size() == 6 * 9 + 5 * 4 + 2 + 2);
  std::vector<test::CompileJob> jobs;
  for (const auto& [name, v] : all)
    for (int sm : {70, 90}) jobs.push_back({v, sm});

  const std::vector<CompiledKernel> out = test::compile_and_check("kv-compile", jobs);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const CompiledKernel& k = out[i];
    if (k.cubin.empty()) continue;  // reported by compile_and_check
    INFO(k.variant.name << " for feature sm_" << jobs[i].sm);
    if (jobs[i].sm == 70) CHECK(k.arch.target_sm <= 75);
    CHECK(parse_ptxas_report(k.log).stack_frame_bytes == 0);
  }
}

TEST_CASE("quantized-cache variant names spell both formats; the KV-format pass's renaming", "[cuda][attention][kv]") {
  const AttentionDims d9{16, 4, 256};
  std::vector<std::string> n;
  for (const Variant& v : attention_variants(d9, 4096, 132, pair("k8v3"))) {
    CHECK(parse_variant(v.name) == v);
    n.push_back(v.name);
  }
  CHECK(n == std::vector<std::string>{"attn_decode_dp4a_d256_g4_n1_k8_v3_b0_t256",
                                      "attn_decode_dp4a_d256_g4_n2_k8_v3_b0_t256", "attn_prefill_d256_g4_h0_k8_v3_t128",
                                      "attn_merge_rot_d256_b0_t128"});
  // The fp32 query (--precise) keeps attn_decode; f16 keys always do.
  CHECK(attention_variants(d9, 4096, 132, pair("k8v3"), false).front().name == "attn_decode_d256_g4_n1_k8_v3_b0_t128");
  CHECK(attention_variants(d9, 4096, 132, pair("k16v3")).front().name == "attn_decode_d256_g4_n1_k16_v3_b0_t128");
  CHECK_THROWS_AS(attn_decode_dp4a_variant(4, 1, pair("k16v3")), KernelError);
  CHECK(attention_int8_query(pair("k3v16")));
  CHECK_FALSE(attention_int8_query(pair("k16v8")));
  CHECK(attention_variants(d9, 4096, 132, pair("k4v8")).back().name == "attn_merge_d256_b0_t256");
  CHECK(kv_write_variant(pair("k16v16")).name == "kv_write_f16_t256");
  CHECK(kv_write_variant(pair("k8v3")).name == "kv_write_k8_v3_b0_t128");
  CHECK_THROWS_AS(kv_write_variant(pair("k32v32")), KernelError);
  CHECK_THROWS_AS(attn_prefill_variant(4, 1, pair("k16v8")), KernelError);  // HFMA2 P.V reads fp16 values only
  CHECK_NOTHROW(attn_prefill_variant(4, 1, pair("k8v16")));

  // Renaming keeps everything but the formats, and maps between the two merges and the two writes.
  const Variant d1 = attn_decode_variant(4, 2, pair("k16v16"));
  CHECK(with_kv_formats(d1, pair("k3v3")).name == "attn_decode_dp4a_d256_g4_n2_k3_v3_b0_t256");
  CHECK(with_kv_formats(d1, pair("k3v3"), false).name == "attn_decode_d256_g4_n2_k3_v3_b0_t128");
  CHECK(with_kv_formats(with_kv_formats(d1, pair("k8v4")), pair("k16v16")) == d1);
  CHECK(with_kv_formats(attn_merge_variant(), pair("k8v4")) == attn_merge_rot_variant());
  CHECK(with_kv_formats(attn_merge_rot_variant(), pair("k4v8")) == attn_merge_variant());
  CHECK(with_kv_formats(kv_write_variant(pair("k8v3")), pair("k16v16")).name == "kv_write_f16_t256");
  CHECK(with_kv_formats(attn_prefill_variant(6, 0, pair("k8v8")), pair("k4v3")).name ==
        "attn_prefill_d256_g6_h0_k4_v3_t128");
  const Variant other = make_variant("argmax_f32", {{"t", 1024}});
  CHECK(with_kv_formats(other, pair("k3v3")) == other);

  // Every format fits the 64 KiB sm_75 gives a block (the fp32 V tile holds half the keys at a time).
  CHECK(attention_prefill_smem(attn_prefill_variant(4, 0, pair("k3v16"))) == kAttentionPrefillSmem);
  CHECK(attention_prefill_smem(attn_prefill_variant(4, 0, pair("k16v3"))) == kAttentionPrefillSmem);
  CHECK(kAttentionPrefillSmem == 65536);
  // A format outside 16/8/4/3 is not a cache format even where the parameter range allows it.
  CHECK_THROWS_AS(attention_prefill_smem(make_variant(
                      "attn_prefill", {{"d", 256}, {"g", 4}, {"h", 0}, {"k", 16}, {"v", 5}, {"t", 128}})),
                  KernelError);
}

// The int8 levels and scales in templates/qrig_kv.cuh are kernels::kv_key_levels_i8 / kv_key_level_scale (the CPU
// reference's): read from the embedded header text, as NVRTC compiles it.
TEST_CASE("the kernels' int8 key levels are the CPU reference's", "[cuda][attention][kv]") {
  const TemplateFile* h = find_template("qrig_kv.cuh");
  REQUIRE(h);
  const std::string src = h->source;
  auto macro = [&](const std::string& name) {
    const size_t at = src.find("#define " + name + " ");
    REQUIRE(at != std::string::npos);
    const size_t b = at + 9 + name.size();
    return src.substr(b, src.find('\n', b) - b);
  };
  for (KvFormat f : {KvFormat::t3, KvFormat::t4}) {
    const std::string tag = f == KvFormat::t3 ? "T3" : "T4";
    std::string want;
    for (int8_t v : kv_key_levels_i8(f)) want += (want.empty() ? "" : ", ") + std::to_string(v);
    CHECK(macro("QRIG_KV_KEY_I8_" + tag) == want);
    const std::string sc = macro("QRIG_KV_KEY_SCALE_" + tag);
    REQUIRE(sc.back() == 'f');
    CHECK(std::stof(sc.substr(0, sc.size() - 1)) == kv_key_level_scale(f));
    // The levels approximate the codebook: within half a step of the scale.
    const auto& cb = kv_codebook(f);
    for (size_t c = 0; c < cb.size(); ++c)
      CHECK(std::fabs(kv_key_levels_i8(f)[c] * kv_key_level_scale(f) - cb[c]) <= 0.5 * kv_key_level_scale(f));
  }
  CHECK(kv_key_levels_i8(KvFormat::q8).empty());
}

TEST_CASE("AttentionKernels and launch_kv_write check formats and arguments before any launch",
          "[cuda][attention][kv]") {
  const AttentionDims d{16, 4, 256};
  const KernelLoader fake = [&](const Variant& v) { return LoadedKernel{v, Kernel{}}; };
  const AttentionChoice c = choose_attention(d, 8192, 512, 132, default_tuning(90), pair("k8v3"));
  std::vector<ir::LaunchRange> ranges;
  for (const auto& r : c.ranges) {
    ir::LaunchRange l{r.first, r.last, {}};
    std::vector<std::string> names;
    for (const auto& v : r.parts[0]) names.push_back(v.name);
    l.parts.push_back(names);
    ranges.push_back(l);
  }
  CHECK_NOTHROW(AttentionKernels(fake, d, 8192, c.ctas, ranges, pair("k8v3"), 3));
  CHECK(AttentionKernels(fake, d, 8192, c.ctas, ranges, pair("k8v3"), 3).int8_query_tokens() == 2);
  {  // the fp32 query's kernels: no int8 calls; the int8 query after an fp32 range is refused
    const AttentionChoice f = choose_attention(d, 8192, 512, 132, default_tuning(90), pair("k8v3"), false);
    std::vector<ir::LaunchRange> fr;
    for (const auto& r : f.ranges) fr.push_back({r.first, r.last, {{r.parts[0][0].name, r.parts[0][1].name}}});
    CHECK(AttentionKernels(fake, d, 8192, f.ctas, fr, pair("k8v3"), 3).int8_query_tokens() == 0);
    std::swap(fr[0].parts, ranges[0].parts);
    CHECK_THROWS_AS(AttentionKernels(fake, d, 8192, c.ctas, ranges, pair("k8v3"), 3), KernelError);
    std::swap(fr[0].parts, ranges[0].parts);
  }
  // The plan's kernels must be those of the caches' formats.
  CHECK_THROWS_AS(AttentionKernels(fake, d, 8192, c.ctas, ranges, pair("k8v4"), 3), KernelError);
  CHECK_THROWS_AS(AttentionKernels(fake, d, 8192, c.ctas, ranges, pair("k16v16"), 3), KernelError);
  CHECK_THROWS_AS(AttentionKernels(fake, d, 8192, c.ctas, ranges, pair("k8v3"), -1), KernelError);

  alignas(256) static float buf[1024];
  alignas(256) static unsigned char cache[4096];
  StreamHandle s = nullptr;
  const LoadedKernel w{kv_write_variant(pair("k8v3")), Kernel{}};
  const LoadedKernel wf{kv_write_variant(pair("k16v16")), Kernel{}};
  CHECK_THROWS_AS(launch_kv_write(w, buf, buf, cache, cache, 0, 1, 1024, 3, pair("k8v4"), s), KernelError);
  CHECK_THROWS_AS(launch_kv_write(wf, buf, buf, cache, cache, 0, 1, 1024, 3, pair("k8v3"), s), KernelError);
  CHECK_THROWS_AS(launch_kv_write(w, buf, buf, cache, cache, 0, 1, 1000, 3, pair("k8v3"), s), KernelError);  // width
  CHECK_THROWS_AS(launch_kv_write(w, buf + 1, buf, cache, cache, 0, 1, 1024, 3, pair("k8v3"), s), KernelError);
  CHECK_THROWS_AS(launch_kv_write(w, buf, buf, cache + 4, cache, 0, 1, 1024, 3, pair("k8v3"), s), KernelError);
  CHECK_THROWS_AS(launch_kv_write(w, buf, buf, cache, cache, -1, 1, 1024, 3, pair("k8v3"), s), KernelError);
  CHECK_THROWS_AS(launch_kv_write(w, buf, buf, cache, cache, 0, 0, 1024, 3, pair("k8v3"), s), KernelError);
}
