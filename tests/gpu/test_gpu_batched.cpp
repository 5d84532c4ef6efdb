// The batched decode kernels (issue 25; the b1 variants of conv1d_silu_f32, gdn_recurrent, kv_write, attn_decode
// and its merges) against the one-sequence launches they replace, which are themselves tested against the CPU
// reference ops (test_gpu_gdn, test_gpu_pointwise, test_gpu_kv, test_gpu_attention). Two checks, both exact:
//  - kernels: a decode step of B = 1, 3, 16 sequences (one token each) in slots out of order (of 19), each at its
//    own position (0 .. 4094 of a 4096-key cache: no split, the first split boundary at 32 keys, many splits, and
//    past 32 x the split target where the split widens and the count drops), at 9B dims with fp16 caches and the
//    k8v8, k8v3, k3v3 pairs and at 27B dims (fp16, k8v3): conv, GDN, the KV write and attention once per sequence
//    with each sequence's own buffers, then once over all of them from the slot tables and the per-step slot and
//    position arrays, on copies of the same states and caches. Outputs (poisoned first) and every slot's
//    recurrent states and caches must be bit-identical: same code per CTA, same split per sequence, same order of
//    accumulation.
//  - end to end: the tiny fixture with 16 slots decoding together through the CUDA executor, its plan as compiled
//    (the batched kernels for 2..16 sequences, decode steps as CUDA graphs captured and patched) against the same
//    plan with the decode_kernel attributes removed (every sequence on its own, eagerly): bit-identical logits at
//    every step, with the batch changing size, order and slots (a graph per number of sequences, patched per token and slot set); and against each sequence decoded alone (one sequence per
//    step: other matmul kernels, so within 5e-4, test_gpu_model's bound for batched vs alone).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>

#include "compiler/compile.h"
#include "ir/kernel_attr.h"
#include "runtime/cuda/attention.h"
#include "runtime/cuda/executor.h"
#include "runtime/cuda/gdn.h"
#include "runtime/cuda/pointwise.h"
#include "tests/fixtures.h"
#include "tests/gpu/gpu_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::cuda::gputest;
using kernels::KvPair;

namespace {

constexpr int64_t kContext = 4096, kSlots = 19, kTaps = 4, kLayer = 5;

struct Dims {
  const char* name;
  GdnDims gdn;
  AttentionDims att;
};

KvPair pair(const char* s) { return *kernels::parse_kv_pair(s); }

// One slot's state: the conv window [taps-1][C] at 0, the GDN state [Hv][dk][dv] at gdn_offset; its K and V caches.
struct SlotSet {
  std::vector<DeviceBuffer<float>> rec;
  std::vector<DeviceBuffer<uint8_t>> kc, vc;
};

template <class T>
std::vector<uint8_t> bytes_of(const DeviceBuffer<T>& b) {
  std::vector<T> v = b.download();
  std::vector<uint8_t> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}
template <class T>
int64_t differing(const DeviceBuffer<T>& a, const DeviceBuffer<T>& b) {
  const auto x = bytes_of(a), y = bytes_of(b);
  if (x.size() != y.size()) return (int64_t)std::max(x.size(), y.size());
  int64_t n = 0;
  for (size_t i = 0; i < x.size(); ++i) n += x[i] != y[i];
  return n;
}

void copy(DeviceBuffer<float>& dst, const DeviceBuffer<float>& src, StreamHandle s) {
  copy_on_device(dst.data(), src.data(), src.bytes(), s, "copy of a test state");
}
void copy(DeviceBuffer<uint8_t>& dst, const DeviceBuffer<uint8_t>& src, StreamHandle s) {
  copy_on_device(dst.data(), src.data(), src.bytes(), s, "copy of a test cache");
}

// The bytes of one decode step of n_past.size() sequences that differ between the per-sequence and the batched
// launches (outputs, states, caches), by op.
struct Diff {
  int64_t conv = 0, gdn = 0, kv = 0, att = 0, states = 0;
  int64_t unwritten = 0;  // batched outputs still holding the NaN poison (or not finite)
  int64_t total() const { return conv + gdn + kv + att + states + unwritten; }
};

Diff run_case(const Dims& dm, KvPair kv, const std::vector<int64_t>& n_past, uint64_t seed) {
  Gpu& g = Gpu::get();
  const StreamHandle s = g.stream.get();
  const KernelLoader load = [](const Variant& v) { return Gpu::get().load(v); };
  const int64_t B = (int64_t)n_past.size();
  const GdnDims& gd = dm.gdn;
  const AttentionDims& ad = dm.att;
  const int64_t C = 2 * gd.Hk * gd.dk + gd.Hv * gd.dv;  // conv channels = the GDN's mixed row
  const int64_t conv_floats = (kTaps - 1) * C, gdn_offset = (conv_floats + 63) / 64 * 64;
  const int64_t rec_floats = gdn_offset + gd.Hv * gd.dk * gd.dv;
  const int64_t W = ad.Hkv * ad.hd, Dq = ad.Hq * ad.hd;
  const int64_t k_row = kernels::kv_row_bytes(kv.k, W, false), v_row = kernels::kv_row_bytes(kv.v, W, false);

  // Two identical sets of slots: one for the per-sequence launches, one for the batched ones.
  SlotSet sets[2];
  const std::vector<float> ksrc = randn((size_t)(kContext * W), seed + 1), vsrc = randn((size_t)(kContext * W), seed + 2);
  const DeviceBuffer<float> dk = dev(ksrc, "cache source k"), dvv = dev(vsrc, "cache source v");
  const LoadedKernel w0 = g.load(kernels::kv_write_variant(kv));
  for (int64_t i = 0; i < kSlots; ++i) {
    const std::vector<float> r = randn((size_t)rec_floats, seed * 100 + (uint64_t)i, 0.0f, 0.5f);
    for (SlotSet& set : sets) {
      set.rec.push_back(dev(r, "slot states"));
      set.kc.emplace_back(0, (size_t)(kContext * k_row), "slot k cache");
      set.vc.emplace_back(0, (size_t)(kContext * v_row), "slot v cache");
      set.kc.back().fill_bytes(0xFF);
      set.vc.back().fill_bytes(0xFF);
    }
  }
  // The sequences' slots, out of order; each slot's cache rows 0..n_past-1 written (then copied to the other set).
  std::vector<int32_t> slot_of((size_t)B), pos_of((size_t)B);
  for (int64_t z = 0; z < B; ++z) {
    slot_of[(size_t)z] = (int32_t)((z * 7 + 3) % kSlots);
    pos_of[(size_t)z] = (int32_t)n_past[(size_t)z];
    REQUIRE(n_past[(size_t)z] < kContext);
    const int32_t sl = slot_of[(size_t)z];
    if (n_past[(size_t)z] > 0)
      launch_kv_write(w0, dk.data(), dvv.data(), sets[0].kc[(size_t)sl].data(), sets[0].vc[(size_t)sl].data(), 0,
                      n_past[(size_t)z], W, kLayer, kv, s);
    copy(sets[1].kc[(size_t)sl], sets[0].kc[(size_t)sl], s);
    copy(sets[1].vc[(size_t)sl], sets[0].vc[(size_t)sl], s);
  }

  // The step's inputs: one row per sequence.
  const auto x = dev(randn((size_t)(B * C), seed + 3), "conv x");
  const auto wconv = dev(randn((size_t)(C * kTaps), seed + 4, 0.0f, 0.5f), "conv w");
  const auto mixed = dev(randn((size_t)(B * C), seed + 5), "gdn mixed");
  const auto alpha = dev(randn((size_t)(B * gd.Hv), seed + 6), "gdn alpha");
  const auto beta = dev(randn((size_t)(B * gd.Hv), seed + 7), "gdn beta");
  const auto ssm_a = dev(randn((size_t)gd.Hv, seed + 8, -1.0f, 0.3f), "gdn ssm_a");
  const auto dt_bias = dev(randn((size_t)gd.Hv, seed + 9), "gdn dt_bias");
  const auto kin = dev(randn((size_t)(B * W), seed + 10), "k rows");
  const auto vin = dev(randn((size_t)(B * W), seed + 11), "v rows");
  const auto q = dev(randn((size_t)(B * Dq), seed + 12), "q");
  const int64_t grow = 2 * Dq, ghead = 2 * ad.hd, goff = ad.hd;  // q | gate interleaved per head, as the model
  const auto gate = dev(randn((size_t)(B * grow), seed + 13), "gate");
  const float scale = 1.0f / 16.0f;

  // The plan's choice for this cache format (the one-sequence kernels read the same caches).
  const AttentionChoice choice =
      kernels::choose_attention(ad, kContext, std::min<int64_t>(4096, kContext), g.info.sms, kernels::default_tuning(90), kv);
  const AttentionKernels att0(load, ad, kContext, choice.ctas, launch_ranges(choice.ranges), kv, kLayer);
  const auto dec = kernels::choose_attention_decode(ad, 16, kv);
  const BatchedDecodeAttention att1(load, ad, kContext, choice.ctas, dec.at(1).parts[0][0].name,
                                    dec.at(1).parts[0][1].name, kv, kLayer);
  const GdnKernels gdn0 = gdn_kernels(load, gd, 64);
  const LoadedKernel conv0 = g.load(kernels::conv1d_silu_f32_variant(kTaps)),
                     conv1 = g.load(kernels::conv1d_silu_f32_variant(kTaps, 1));
  const LoadedKernel gdn1 = g.load(kernels::gdn_recurrent_variant(gd, 1));
  const LoadedKernel w1 = g.load(kernels::kv_write_batched_variant(kv));

  // Outputs and workspaces, poisoned (NaN).
  DeviceBuffer<float> conv_out[2], gdn_out[2], att_out[2], ws[2];
  const int64_t ws_floats[2] = {
      kernels::attention_workspace_bytes(ad, choice.ctas, kContext, 1) / 4 + 64,
      kernels::attention_workspace_bytes(ad, choice.ctas, kContext, 1, std::max<int64_t>(B, 2)) / 4 + 64};
  for (int k = 0; k < 2; ++k) {
    conv_out[k] = poisoned_device((size_t)(B * C), "conv out");
    gdn_out[k] = poisoned_device((size_t)(B * gd.Hv * gd.dv), "gdn out");
    att_out[k] = poisoned_device((size_t)(B * Dq), "attention out");
    ws[k] = poisoned_device((size_t)ws_floats[k], "attention workspace");
  }

  // Per sequence: each op once per sequence on its own buffers (kv_write before attention, as the model runs them).
  SlotSet& a = sets[0];
  for (int64_t z = 0; z < B; ++z) {
    const size_t sl = (size_t)slot_of[(size_t)z];
    float* rec = a.rec[sl].data();
    launch_conv1d_silu_f32(conv0, x.data() + z * C, 1, C, wconv.data(), rec, conv_out[0].data() + z * C, s);
    gdn0.run(mixed.data() + z * C, alpha.data() + z * gd.Hv, beta.data() + z * gd.Hv, ssm_a.data(), dt_bias.data(), 1,
             rec + gdn_offset, gdn_out[0].data() + z * gd.Hv * gd.dv, nullptr, s);
    launch_kv_write(w0, kin.data() + z * W, vin.data() + z * W, a.kc[sl].data(), a.vc[sl].data(), n_past[(size_t)z], 1,
                    W, kLayer, kv, s);
    att0.run(q.data() + z * Dq, a.kc[sl].data(), a.vc[sl].data(), 1, n_past[(size_t)z], scale,
             gate.data() + z * grow + goff, grow, ghead, att_out[0].data() + z * Dq, ws[0].data(), s);
  }

  // Batched: the slot tables and the step's arrays, then one launch per op (attention: decode + merge).
  SlotSet& b = sets[1];
  std::vector<uint64_t> rec_t(kSlots), kc_t(kSlots), vc_t(kSlots);
  for (int64_t i = 0; i < kSlots; ++i) {
    rec_t[(size_t)i] = reinterpret_cast<uint64_t>(b.rec[(size_t)i].data());
    kc_t[(size_t)i] = reinterpret_cast<uint64_t>(b.kc[(size_t)i].data());
    vc_t[(size_t)i] = reinterpret_cast<uint64_t>(b.vc[(size_t)i].data());
  }
  DeviceBuffer<uint64_t> rec_d(0, kSlots, "rec table"), kc_d(0, kSlots, "k table"), vc_d(0, kSlots, "v table");
  rec_d.upload(rec_t);
  kc_d.upload(kc_t);
  vc_d.upload(vc_t);
  DeviceBuffer<int32_t> slot_d(0, (size_t)B, "seq slots"), pos_d(0, (size_t)B, "seq positions");
  slot_d.upload(slot_of);
  pos_d.upload(pos_of);
  auto* rec_tab = reinterpret_cast<float* const*>(rec_d.data());
  auto* kc_tab = reinterpret_cast<void* const*>(kc_d.data());
  auto* vc_tab = reinterpret_cast<void* const*>(vc_d.data());
  launch_conv1d_silu_batched(conv1, x.data(), B, C, wconv.data(), rec_tab, slot_d.data(), 0, conv_out[1].data(), s);
  launch_gdn_recurrent_batched(gdn1, gd, mixed.data(), alpha.data(), beta.data(), ssm_a.data(), dt_bias.data(), B,
                               rec_tab, slot_d.data(), gdn_offset, gdn_out[1].data(), s);
  launch_kv_write_batched(w1, kin.data(), vin.data(), kc_tab, vc_tab, slot_d.data(), pos_d.data(), B, W, kLayer, kv, s);
  att1.run(q.data(), kc_tab, vc_tab, slot_d.data(), pos_d.data(), n_past, scale, gate.data() + goff, grow, ghead,
           att_out[1].data(), ws[1].data(), s);
  g.stream.sync("batched decode step");

  Diff d;
  d.conv = differing(conv_out[0], conv_out[1]);
  d.gdn = differing(gdn_out[0], gdn_out[1]);
  d.att = differing(att_out[0], att_out[1]);
  for (int64_t i = 0; i < kSlots; ++i) {
    d.states += differing(a.rec[(size_t)i], b.rec[(size_t)i]);
    d.kv += differing(a.kc[(size_t)i], b.kc[(size_t)i]) + differing(a.vc[(size_t)i], b.vc[(size_t)i]);
  }
  // The outputs are all written (no NaN poison left): a kernel that skipped a sequence would pass a bitwise
  // comparison with a per-sequence kernel that skipped it too.
  for (const auto* o : {&conv_out[1], &gdn_out[1], &att_out[1]}) {
    const auto v = o->download();
    d.unwritten += std::count_if(v.begin(), v.end(), [](float f) { return !std::isfinite(f); });
  }
  return d;
}

}  // namespace

TEST_CASE("a decode step's sequences in one batched launch per op give the bits of one launch per sequence",
          "[gpu][batched]") {
  const Dims d9{"9B", {16, 32, 128, 128}, {16, 4, 256}}, d27{"27B", {16, 48, 128, 128}, {24, 4, 256}};
  const std::vector<std::vector<int64_t>> steps = {
      {700},
      {5, 2200, 40},
      {0, 1, 31, 32, 33, 64, 100, 257, 1000, 2111, 2112, 2113, 2500, 3001, 4000, 4094}};
  struct Case {
    const Dims* d;
    const char* kv;
  };
  const std::vector<Case> cases = {{&d9, "k16v16"}, {&d9, "k8v8"}, {&d9, "k8v3"}, {&d9, "k3v3"},
                                   {&d27, "k16v16"}, {&d27, "k8v3"}};
  uint64_t seed = 1;
  for (const Case& c : cases)
    for (const auto& n_past : steps) {
      const std::string shape = fmt::format("{} {} B={}", c.d->name, c.kv, n_past.size());
      INFO(shape);
      const Diff d = run_case(*c.d, pair(c.kv), n_past, seed++);
      report("batched decode (conv, gdn, kv_write, attention)", shape, "bytes differing from per-sequence launches",
             (double)d.total(), -1);
      CHECK(d.conv == 0);
      CHECK(d.gdn == 0);
      CHECK(d.kv == 0);
      CHECK(d.att == 0);
      CHECK(d.states == 0);
      CHECK(d.unwritten == 0);
    }
}

namespace {

ir::Plan tiny_plan(int64_t slots) {
  Gpu& g = Gpu::get();
  const gguf::File f = gguf::File::open(fixtures::shared_dir() + "/fixtures/tiny.gguf");
  compiler::CompileOptions co;
  co.context_length = 2048;
  co.max_sequences = slots;
  co.ptx_jit = g.ptx;
  co.max_batch_tokens = 512;
  // Two activation planes up to `slots` rows: a step of 16 one-token sequences then quantizes its matmul inputs
  // as one sequence alone does (by default only steps of <= 4 rows take two planes), so "alone" differs from the
  // batched step by the matmul kernels' fp32 rounding only.
  co.precise_rows = slots;
  return compiler::compile(f, this_gpu_rig(), co);
}

}  // namespace

TEST_CASE("16 slots decoding together through the batched kernels equal them decoded one launch per sequence",
          "[gpu][batched]") {
  const int64_t S = 16;
  const ir::Plan plan = tiny_plan(S);
  ir::Plan per_seq = plan;
  int batched_ops = 0;
  for (auto& op : per_seq.graph.ops)
    if (op.has("decode_kernel")) {
      ++batched_ops;
      REQUIRE(ir::parse_launch_ranges(op.s("decode_kernel")).back().last == S);
      op.erase("decode_kernel");
    }
  REQUIRE(batched_ops > 0);
  runtime::CudaOptions eager;
  eager.graphs = false;
  runtime::CudaExecutor bx(plan, runtime::open_plan_model(plan));              // batched, as CUDA graphs
  runtime::CudaExecutor sx(per_seq, runtime::open_plan_model(per_seq), eager);  // one launch per sequence
  runtime::CudaExecutor ax(plan, runtime::open_plan_model(plan));              // each sequence alone
  const int64_t V = bx.vocab_rows();
  const int32_t vocab = (int32_t)std::min<int64_t>(V, plan.vocab_real > 0 ? plan.vocab_real : V);
  FastRng rng(25);
  auto token = [&] { return (int32_t)(rng.next() % (uint64_t)vocab); };

  // Prompts of different lengths (positions 3 .. 300: no split, one, many), each slot prefilled alone.
  std::vector<std::vector<int32_t>> hist((size_t)S);
  for (int64_t sl = 0; sl < S; ++sl) {
    const int64_t n = 3 + (sl * 97) % 298;
    for (int64_t i = 0; i < n; ++i) hist[(size_t)sl].push_back(token());
    for (runtime::CudaExecutor* ex : {&bx, &sx, &ax}) {
      ex->reset((int)sl);
      ex->step({runtime::StepInput{(int)sl, hist[(size_t)sl], false}}, {{}}, false, false);
    }
  }
  // Decode steps: all 16 slots, then subsets of 4, 3, 9 and another 4 sequences, each in two orders; the same
  // tokens everywhere. A batched step's graph is keyed by its number of sequences only (slot_free_step): the
  // reversed orders and the second subset of 4 replay a graph captured for other slots.
  int64_t mismatches = 0, steps = 0;
  double worst_alone = 0;
  for (int t = 0; t < 60; ++t) {
    std::vector<int> slots;
    const int phase = t / 12;
    for (int sl = 0; sl < S; ++sl)  // 16; 4 (0, 1, 8, 9); 3 (1, 6, 11); 9 (0..8); 4 (2, 3, 10, 11)
      if (phase == 0 || (phase == 1 && sl % 8 < 2) || (phase == 2 && sl % 5 == 1) || (phase == 3 && sl < 9) ||
          (phase == 4 && sl % 8 >= 2 && sl % 8 < 4))
        slots.push_back(sl);
    if (t % 2) std::reverse(slots.begin(), slots.end());
    std::vector<runtime::StepInput> batch;
    std::vector<std::vector<int32_t>> rows;
    for (int sl : slots) {
      const int32_t tk = token();
      hist[(size_t)sl].push_back(tk);
      batch.push_back({sl, {tk}, true});
      rows.push_back({0});
    }
    const auto ob = bx.step(batch, rows, true, true);
    const auto os = sx.step(batch, rows, true, true);
    mismatches += !cpu::test::bit_equal(ob.logits, os.logits) || ob.argmax != os.argmax;
    ++steps;
    for (size_t k = 0; k < batch.size(); ++k) {
      const auto oa = ax.step({batch[k]}, {{0}}, true, false);
      const std::vector<float> got(ob.logits.begin() + (int64_t)k * V, ob.logits.begin() + (int64_t)(k + 1) * V);
      worst_alone = std::max(worst_alone, rel_err(got, oa.logits));
    }
  }
  for (int sl = 0; sl < S; ++sl) CHECK(bx.position(sl) == (int64_t)hist[(size_t)sl].size());
  const runtime::GraphStats gs = bx.graph_stats();
  report("batched decode (tiny, 16 slots)", fmt::format("{} steps of 3..16 sequences", steps),
         "steps whose logits differ from one launch per sequence", (double)mismatches, -1);
  report("batched decode (tiny, 16 slots)", "vs each sequence alone", "logits max rel err", worst_alone, 5e-4);
  report_row(fmt::format("| batched decode (tiny, 16 slots) | {} steps | graphs captured / replayed | {} / {} | | |",
                         steps, gs.captured, gs.replayed));
  CHECK(mismatches == 0);
  CHECK(worst_alone <= 5e-4);
  CHECK(gs.disabled_because.empty());
  CHECK(gs.replayed > gs.captured);  // the patch path ran: graphs of batched kernels replayed with new positions
  // Keyed by slots, the 10 slot orders would each have been captured at least once.
  CHECK(gs.captured < 10);
}
