// CI without a GPU for the batched decode kernels (issue 25: one launch per op over a decode step's sequences;
// the b1 variants of conv1d_silu_f32, gdn_recurrent, kv_write, attn_decode, attn_merge and attn_merge_rot): every
// b1 variant at the tiny fixture's, 9B's and 27B's dims, for fp16 caches and every quantized pair the KV-format pass
// offers, compiles with NVRTC for sm_70 (the CMP feature set), sm_75 and sm_90 with no spills, no stack frame and
// the declared block size (the preset plans' b1 variants also go through test_template_compile's every-arch run).
// The host side: the choice functions and the kernel pass's decode_kernel attribute (2..min(sequences, rows per
// call), none for one sequence), the KV-format pass renaming it, the memory pass's scratch for the batched
// partials and the tables in the io bytes, the executor's binding of it (and refusals), and the batched launchers'
// argument checks, which throw before anything reaches a GPU.
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "ir/kernel_attr.h"
#include "kernels/attention.h"
#include "kernels/gdn.h"
#include "kernels/pointwise.h"
#include "runtime/cuda/attention.h"
#include "runtime/cuda/executor_impl.h"
#include "runtime/cuda/gdn.h"
#include "runtime/cuda/plan_kernels.h"
#include "runtime/cuda/pointwise.h"
#include "tests/cuda/compiled_checks.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/kernel_sets.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::kernels;

namespace {

KvPair pair(const char* s) { return *parse_kv_pair(s); }
const std::vector<AttentionDims> kAttDims = {{2, 1, 256}, {16, 4, 256}, {24, 4, 256}};
const std::vector<GdnDims> kGdnDims = {{2, 4, 128, 128}, {16, 32, 128, 128}, {16, 48, 128, 128}, {1, 3, 64, 32}};
const char* const kPairs[] = {"k16v16", "k8v8", "k8v4", "k8v3", "k4v4", "k4v3", "k3v3"};

std::vector<std::string> names_of(const ir::Op& op, const char* attr) {
  std::vector<std::string> out;
  for (const auto& r : ir::parse_launch_ranges(op.s(attr)))
    for (const auto& part : r.parts)
      for (const auto& n : part) out.push_back(n);
  return out;
}

bool per_sequence_op(ir::OpKind k) {
  return k == ir::OpKind::conv1d_silu || k == ir::OpKind::gdn || k == ir::OpKind::kv_write ||
         k == ir::OpKind::attention;
}

}  // namespace

TEST_CASE("batched decode variants compile for sm_70, sm_75 and sm_90 without spills", "[cuda][batched]") {
  std::map<std::string, Variant> all;
  auto add = [&](const Variant& v) { all.emplace(v.name, v); };
  for (int64_t taps : {4}) add(conv1d_silu_f32_variant(taps, 1));
  for (const GdnDims& d : kGdnDims) add(gdn_recurrent_variant(d, 1));
  for (const char* p : kPairs) {
    add(kv_write_batched_variant(pair(p)));
    add(attn_merge_for(pair(p).v, 1));
    for (const AttentionDims& d : kAttDims) add(attn_decode_for(attention_group(d), 1, pair(p), 1, true));
  }
  // conv 1, gdn 2 (head dims 128 and the odd 64/32), per pair a write and decode for g2, g4, g6 (the plans' own:
  // attn_decode_dp4a over quantized keys), two merges.
  REQUIRE(all.size() == 1 + 2 + 7 * 4 + 2);
  for (const auto& [name, v] : all) CHECK(v.param("b") == 1);
  std::vector<test::CompileJob> jobs;
  for (const auto& [name, v] : all)
    for (int sm : {70, 75, 90}) jobs.push_back({v, sm});
  const std::vector<CompiledKernel> out = test::compile_and_check("batched-compile", jobs);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const CompiledKernel& k = out[i];
    if (k.cubin.empty()) continue;  // reported by compile_and_check
    INFO(k.variant.name << " for feature sm_" << jobs[i].sm);
    CHECK(parse_ptxas_report(k.log).stack_frame_bytes == 0);
  }
}

TEST_CASE("batched variant names and choices: b0 for one sequence, b1 from two; renamed with the cache formats",
          "[cuda][batched]") {
  const AttentionDims d9{16, 4, 256};
  CHECK(conv1d_silu_f32_variant(4).name == "conv1d_silu_f32_k4_b0_t128");
  CHECK(conv1d_silu_f32_variant(4, 1).name == "conv1d_silu_f32_k4_b1_t128");
  CHECK(gdn_recurrent_variant({16, 32, 128, 128}, 1).name == "gdn_recurrent_dk128_dv128_cw8_b1_t128");
  CHECK(kv_write_batched_variant(pair("k16v16")).name == "kv_write_k16_v16_b1_t128");  // not kv_write_f16
  CHECK(kv_write_batched_variant(pair("k8v3")).name == "kv_write_k8_v3_b1_t128");
  CHECK(attn_decode_variant(4, 1, pair("k8v3"), 1).name == "attn_decode_d256_g4_n1_k8_v3_b1_t128");
  CHECK(attn_merge_for(KvFormat::t3, 1).name == "attn_merge_rot_d256_b1_t128");
  CHECK(attn_merge_for(KvFormat::f16, 1).name == "attn_merge_d256_b1_t256");
  CHECK_THROWS_AS(attn_decode_variant(4, 2, {}, 1), KernelError);  // one token per sequence only
  // The KV-format pass's renaming keeps the batching.
  CHECK(with_kv_formats(kv_write_batched_variant(pair("k16v16")), pair("k8v3")).name == "kv_write_k8_v3_b1_t128");
  CHECK(with_kv_formats(kv_write_batched_variant(pair("k8v3")), pair("k16v16")).name == "kv_write_k16_v16_b1_t128");
  CHECK(with_kv_formats(kv_write_variant(pair("k8v3")), pair("k16v16")).name == "kv_write_f16_t256");
  CHECK(with_kv_formats(attn_decode_variant(4, 1, {}, 1), pair("k3v3")).name ==
        "attn_decode_dp4a_d256_g4_n1_k3_v3_b1_t256");
  CHECK(with_kv_formats(attn_decode_variant(4, 1, {}, 1), pair("k3v3"), false).name ==
        "attn_decode_d256_g4_n1_k3_v3_b1_t128");
  CHECK(with_kv_formats(attn_merge_for(KvFormat::f16, 1), pair("k8v4")).name == "attn_merge_rot_d256_b1_t128");

  // Choices: 1-1 the one-sequence kernels (what the kernel attribute names for one token), 2..max the b1 ones.
  const auto a = choose_attention_decode(d9, 16, pair("k8v3"));
  REQUIRE(a.size() == 2);
  CHECK((a[0].first == 1 && a[0].last == 1 && a[1].first == 2 && a[1].last == 16));
  CHECK(a[0].parts[0] == choose_attention(d9, 4096, 512, 132, default_tuning(90), pair("k8v3")).ranges[0].parts[0]);
  CHECK(a[1].parts[0][0].param("b") == 1);
  CHECK(a[1].parts[0][1].name == "attn_merge_rot_d256_b1_t128");
  CHECK(choose_attention_decode(d9, 1).size() == 1);
  CHECK(choose_kv_write_decode(pair("k16v16"), 8)[0].parts[0][0].name == "kv_write_f16_t256");
  CHECK(choose_kv_write_decode(pair("k16v16"), 8)[1].parts[0][0].name == "kv_write_k16_v16_b1_t128");
  CHECK(choose_conv1d_silu_decode(4, 3)[1].parts[0][0].name == "conv1d_silu_f32_k4_b1_t128");
  Tuning t = default_tuning(90);
  const GdnDims g9{16, 32, 128, 128};
  const auto gd = choose_gdn_decode(g9, 64, 32, t);
  REQUIRE(gd.size() == 2);
  CHECK(gd[0].parts[0][0] == gdn_recurrent_variant(g9));
  CHECK(gd[1].parts[0][0] == gdn_recurrent_variant(g9, 1));
  t.gdn_recurrent_below = 1;  // one token runs the chunked pair: no batched recurrence
  CHECK(choose_gdn_decode(g9, 64, 32, t).empty());
  CHECK_THROWS_AS(choose_gdn_decode(g9, 64, 0, default_tuning(90)), KernelError);

  // The workspace bound covers a batched launch's partials: every sequence's splits side by side.
  const AttentionCtas ctas = test::attention_choice(d9, 65536, 132).ctas;
  const int64_t target = attention_decode_split_target(d9, ctas);
  CHECK(target == (ctas.decode1 + 3) / 4);
  CHECK(attention_split(d9, ctas, 1, 65536, true).n_split <= target);
  CHECK(attention_workspace_bytes(d9, ctas, 65536, 16, 16) >= attention_partial_bytes(d9, 16, target));
  CHECK(attention_workspace_bytes(d9, ctas, 65536, 16, 16) >= attention_workspace_bytes(d9, ctas, 65536, 16));
  CHECK(attention_workspace_bytes(d9, ctas, 65536, 16, 1) == attention_workspace_bytes(d9, ctas, 65536, 16));
}

TEST_CASE("the kernel pass writes decode_kernel for 2..min(sequences, rows) sequences; the executor binds it",
          "[cuda][batched][fixtures]") {
  for (const char* model : {"tiny", "9b"}) {
    INFO(model);
    compiler::CompileOptions o;
    o.max_batch_tokens = 64;
    o.max_sequences = 16;
    o.kv = "k8v3";
    const ir::Plan p = presets::compile_preset(model, "h200", o);
    std::set<std::string> named;
    for (const auto& v : plan_kernels(p)) named.insert(v.name);
    int ops = 0;
    for (const ir::Op& op : p.graph.ops) {
      if (!per_sequence_op(op.kind)) {
        CHECK(!op.has("decode_kernel"));
        continue;
      }
      ++ops;
      REQUIRE(op.has("decode_kernel"));
      const auto r = ir::parse_launch_ranges(op.s("decode_kernel"));
      REQUIRE(r.size() == 2);
      CHECK((r[0].first == 1 && r[0].last == 1 && r[1].first == 2 && r[1].last == 16));
      CHECK(r[0].parts == ir::launch_range_for(ir::parse_launch_ranges(op.s("kernel")), 1)->parts);
      for (const auto& n : r[1].parts.at(0)) {
        CHECK(parse_variant(n).param("b") == 1);
        CHECK(named.count(n) == 1);  // precompiled (and so compiled for every arch in CI)
      }
      if (op.kind == ir::OpKind::attention) {  // renamed to the settled formats; the scratch holds 16 sequences
        CHECK(op.s("decode_kernel").find("attn_decode_dp4a_d256_") != std::string::npos);  // the int8 query
        CHECK(op.s("decode_kernel").find("_k8_v3_b1_t256+attn_merge_rot_d256_b1_t128") != std::string::npos);
        CHECK(op.i("query_int8_tokens") == attention_decode_max_tokens(attention_group(
                                               {op.i("heads"), op.i("kv_heads"), op.i("head_dim")})));
        const AttentionDims d{op.i("heads"), op.i("kv_heads"), op.i("head_dim")};
        const auto c = op.ints("split_ctas");
        const AttentionCtas ctas{c[0], c[1], c[2]};
        CHECK(op.ints("scratch").at(1) >= attention_partial_bytes(d, 16, attention_decode_split_target(d, ctas)));
      }
    }
    CHECK(ops > 0);
    const std::vector<std::string> loaded = runtime::kernels_loaded_by(p);
    CHECK(named == std::set<std::string>(loaded.begin(), loaded.end()));
    // The kernel table (qrig inspect) lists them by sequences.
    bool listed = false;
    for (const auto& k : p.kernels) listed |= k.shape.find("per sequences") != std::string::npos && k.first_rows == 2;
    CHECK(listed);
  }
  // Rows per call bound the sequences of a decode step; one sequence gets no attribute.
  compiler::CompileOptions o;
  o.max_batch_tokens = 8;
  o.max_sequences = 16;
  for (const ir::Op& op : presets::compile_preset("tiny", "h200", o).graph.ops)
    if (op.has("decode_kernel")) CHECK(ir::parse_launch_ranges(op.s("decode_kernel")).back().last == 8);
  o.max_sequences = 1;
  for (const ir::Op& op : presets::compile_preset("tiny", "h200", o).graph.ops) CHECK(!op.has("decode_kernel"));

  // The binding refuses a one-sequence kernel where the plan says batched, and other one-sequence kernels than
  // the kernel attribute's.
  o.max_sequences = 4;
  ir::Plan bad = presets::compile_preset("tiny", "h200", o);
  for (auto& op : bad.graph.ops)
    if (op.kind == ir::OpKind::conv1d_silu) {
      op.set("decode_kernel", std::string("1-1:conv1d_silu_f32_k4_b0_t128 2-4:conv1d_silu_f32_k4_b0_t128"));
      break;
    }
  CHECK_THROWS_WITH(runtime::kernels_loaded_by(bad), Catch::Contains("not a batched"));
  bad = presets::compile_preset("tiny", "h200", o);
  for (auto& op : bad.graph.ops)
    if (op.kind == ir::OpKind::gdn) {
      op.set("decode_kernel", std::string("1-1:gdn_recurrent_dk128_dv128_cw8_b1_t128 2-4:gdn_recurrent_dk128_dv128_cw8_b1_t128"));
      break;
    }
  CHECK_THROWS_WITH(runtime::kernels_loaded_by(bad), Catch::Contains("one sequence"));
  bad = presets::compile_preset("tiny", "h200", o);
  for (auto& op : bad.graph.ops)
    if (op.kind == ir::OpKind::attention) {
      const std::string one = ir::print_launch_ranges({ir::parse_launch_ranges(op.s("decode_kernel")).at(0)});
      op.set("decode_kernel", one + " 2-4:attn_decode_d256_g2_n1_k16_v16_b1_t128+attn_merge_d256_b0_t256");
      break;
    }
  CHECK_THROWS_WITH(runtime::kernels_loaded_by(bad), Catch::Contains("attn_merge_d256_b0_t256"));
  // The int8 query is the plan's: kernels and query_int8_tokens (the CPU backend's numerics) must agree.
  o.kv = "k8v3";
  bad = presets::compile_preset("tiny", "h200", o);
  CHECK_NOTHROW(runtime::kernels_loaded_by(bad));
  for (auto& op : bad.graph.ops)
    if (op.kind == ir::OpKind::attention) op.erase("query_int8_tokens");
  CHECK_THROWS_WITH(runtime::kernels_loaded_by(bad), Catch::Contains("query_int8_tokens"));
}

TEST_CASE("the batched launchers check their arguments before any launch", "[cuda][batched]") {
  alignas(256) static float buf[256];
  alignas(256) static uint64_t table[8];
  alignas(256) static int32_t ints[8];
  float* p = buf;
  float* const* rec = reinterpret_cast<float* const*>(table);
  void* const* caches = reinterpret_cast<void* const*>(table);
  StreamHandle s = nullptr;
  auto loaded = [](const Variant& v) { return LoadedKernel{v, Kernel{}}; };

  const LoadedKernel conv1 = loaded(conv1d_silu_f32_variant(4, 1)), conv0 = loaded(conv1d_silu_f32_variant(4));
  CHECK_THROWS_WITH(launch_conv1d_silu_batched(conv0, p, 2, 64, p + 64, rec, ints, 0, p + 128, s),
                    Catch::Contains("not a batched"));
  CHECK_THROWS_WITH(launch_conv1d_silu_f32(conv1, p, 1, 64, p + 64, p + 192, p + 128, s), Catch::Contains("batched"));
  CHECK_THROWS_AS(launch_conv1d_silu_batched(conv1, p, 0, 64, p + 64, rec, ints, 0, p + 128, s), KernelError);
  CHECK_THROWS_AS(launch_conv1d_silu_batched(conv1, p, 70000, 64, p + 64, rec, ints, 0, p + 128, s), KernelError);
  CHECK_THROWS_AS(launch_conv1d_silu_batched(conv1, p, 2, 64, p + 64, nullptr, ints, 0, p + 128, s), KernelError);
  CHECK_THROWS_AS(launch_conv1d_silu_batched(conv1, p, 2, 64, p + 64, rec, nullptr, 0, p + 128, s), KernelError);
  CHECK_THROWS_AS(launch_conv1d_silu_batched(conv1, p, 2, 64, p + 64, rec, ints, 0, p, s), KernelError);  // aliases
  CHECK_THROWS_AS(launch_conv1d_silu_batched(conv1, p, 2, 64, p + 64, rec, ints, -4, p + 128, s), KernelError);

  const GdnDims d{2, 4, 128, 128};
  const LoadedKernel g1 = loaded(gdn_recurrent_variant(d, 1)), g0 = loaded(gdn_recurrent_variant(d));
  auto gdn = [&](const LoadedKernel& k, const GdnDims& dd, int64_t seqs, int64_t off, const float* mixed) {
    launch_gdn_recurrent_batched(k, dd, mixed, p + 64, p + 96, p + 128, p + 160, seqs, rec, ints, off, p + 192, s);
  };
  CHECK_THROWS_WITH(gdn(g0, d, 2, 0, p), Catch::Contains("not the batched"));
  CHECK_THROWS_AS(gdn(g1, {2, 4, 64, 128}, 2, 0, p), KernelError);  // other dims
  CHECK_THROWS_AS(gdn(g1, d, 0, 0, p), KernelError);
  CHECK_THROWS_AS(gdn(g1, d, 2, 2, p), KernelError);  // state offset not a multiple of 4 floats
  CHECK_THROWS_AS(gdn(g1, d, 2, 0, p + 1), KernelError);  // mixed misaligned
  // ... and one sequence's kernel set refuses the batched variant.
  const KernelLoader batched_gdn = [&](const Variant& v) {
    return v.kernel == "gdn_recurrent" ? LoadedKernel{gdn_recurrent_variant(d, 1), Kernel{}} : LoadedKernel{v, Kernel{}};
  };
  CHECK_THROWS_AS(test::gdn_kernels(batched_gdn, d, 64), KernelError);

  const KvPair kv = pair("k8v3");
  const LoadedKernel w1 = loaded(kv_write_batched_variant(kv)), w0 = loaded(kv_write_variant(kv));
  CHECK_THROWS_WITH(launch_kv_write_batched(w0, p, p + 64, caches, caches, ints, ints, 2, 256, 0, kv, s),
                    Catch::Contains("not a batched"));
  CHECK_THROWS_WITH(launch_kv_write(w1, p, p + 64, p, p, 0, 1, 256, 0, kv, s), Catch::Contains("batched"));
  CHECK_THROWS_AS(launch_kv_write_batched(w1, p, p + 64, caches, caches, ints, ints, 2, 256, 0, pair("k8v8"), s),
                  KernelError);  // other formats
  CHECK_THROWS_AS(launch_kv_write_batched(w1, p, p + 64, caches, caches, ints, ints, 0, 256, 0, kv, s), KernelError);
  CHECK_THROWS_AS(launch_kv_write_batched(w1, p, p + 64, caches, caches, ints, ints, 2, 200, 0, kv, s), KernelError);
  CHECK_THROWS_AS(launch_kv_write_batched(w1, p, p + 64, caches, nullptr, ints, ints, 2, 256, 0, kv, s), KernelError);

  const AttentionDims ad{16, 4, 256};
  const AttentionCtas ctas = test::attention_choice(ad, 4096, 132).ctas;
  const auto choice = choose_attention_decode(ad, 4, kv);
  const BatchedDecodeAttention att(loaded, ad, 4096, ctas, choice[1].parts[0][0].name, choice[1].parts[0][1].name, kv, 3);
  CHECK_THROWS_AS(BatchedDecodeAttention(loaded, ad, 4096, ctas, choice[0].parts[0][0].name, choice[0].parts[0][1].name,
                                         kv, 3),
                  KernelError);  // one sequence's kernels
  CHECK_THROWS_AS(BatchedDecodeAttention(loaded, ad, 4096, ctas, choice[1].parts[0][0].name, choice[1].parts[0][1].name,
                                         pair("k8v8"), 3),
                  KernelError);  // other formats
  auto run = [&](std::vector<int64_t> pos, const float* q, float* out, void* ws) {
    att.run(q, caches, caches, ints, ints, pos, 0.0625f, p + 64, 2 * 16 * 256, 2 * 256, out, ws, s);
  };
  CHECK_THROWS_AS(run({}, p, p + 128, nullptr), KernelError);              // no sequences
  CHECK_THROWS_AS(run({0, 4096}, p, p + 128, nullptr), KernelError);       // past the context
  CHECK_THROWS_AS(run({0, -1}, p, p + 128, nullptr), KernelError);
  CHECK_THROWS_AS(run({0, 3}, p + 1, p + 128, nullptr), KernelError);      // q misaligned
  CHECK_THROWS_AS(run({0, 3}, p, p, nullptr), KernelError);                // out aliases q
  CHECK_THROWS_AS(run({0, 3000}, p, p + 128, nullptr), KernelError);       // split partials need the workspace
  CHECK_THROWS_AS(run({0, 3000}, p, p + 128, p + 4), KernelError);         // not 256-byte aligned
}
