// The fusions into the activation quantization (issue 25) against the unfused ops, on fresh random inputs at model
// shapes, outputs poisoned first (f32 NaN bytes; q planes 0x55, scales 0xFF):
//   add_rmsnorm_q8  (add_rmsnorm_quant) the sum vs cpu::add: exact. The quantized normed sum, dequantized, vs
//                   cpu::rmsnorm of cpu::add (fp32 reference) within the quantization's own error (rel. to max|ref|:
//                   one plane <= 0.5/127 = 3.9e-3 -> 4e-3; two planes <= 0.5/127/254 = 1.6e-5 -> 2.5e-5, both plus
//                   the norm's few ulp); and bit for bit what the unfused kernels make (add_f32, then rmsnorm_f32 q<p>,
//                   whose f32 row is itself checked against cpu::rmsnorm, 6e-7, and quantized on the host as in the
//                   rmsnorm_f32 test: mismatching values + scales must be 0).
//   swiglu_q8       (swiglu_quant) dequantized vs cpu::swiglu within the same quantization bounds (+ expf's ulp), and
//                   bit for bit the host quantization of swiglu_f32's output (zero, NaN and inf blocks included);
//                   one plane never writes the second.
// Rows: 1 (decode), 4 (a batched decode step) and 7; D = 4096 (9B), 256 (tiny), 5120 (27B). In place (sum = a) too.
#include <catch2/catch.hpp>

#include <cstring>

#include "runtime/cuda/pointwise.h"
#include "tests/gpu/gpu_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::cuda::gputest;

namespace {

struct Q8Host {
  std::vector<int8_t> q, q2;
  std::vector<float> d;
};

// Device planes poisoned as the rmsnorm_f32 test does; download().
struct Q8Device {
  DeviceBuffer<int8_t> q, q2;
  DeviceBuffer<float> d;
  explicit Q8Device(size_t n) : q(0, n, "xq"), q2(0, n, "xq2"), d(0, n / 32, "xd") {
    q.fill_bytes(0x55);
    q2.fill_bytes(0x55);
    d.fill_bytes(0xFF);
  }
  Q8Host download() const { return {q.download(), q2.download(), d.download()}; }
};

// Values and scales differing between two quantized rows (scales compared as bits, NaN = NaN); planes 1: q2 ignored.
int64_t mismatches(const Q8Host& a, const Q8Host& b, int64_t planes) {
  int64_t m = 0;
  for (size_t i = 0; i < a.q.size(); ++i) m += a.q[i] != b.q[i] || (planes == 2 && a.q2[i] != b.q2[i]);
  for (size_t k = 0; k < a.d.size(); ++k)
    m += std::isnan(a.d[k]) ? !std::isnan(b.d[k]) : std::memcmp(&a.d[k], &b.d[k], 4) != 0;
  return m;
}

Q8Host host_quantized(const std::vector<float>& y) {
  Q8Host h{std::vector<int8_t>(y.size()), std::vector<int8_t>(y.size()), std::vector<float>(y.size() / 32)};
  quantize_activation_q8(y.data(), (int64_t)y.size(), h.q.data(), h.d.data(), h.q2.data());
  return h;
}

std::vector<float> dequantized(const Q8Host& h, int64_t planes) {
  return dequantize_activation_q8(h.q.data(), h.d.data(), (int64_t)h.q.size(), planes == 2 ? h.q2.data() : nullptr);
}

double quant_threshold(int64_t planes) { return planes == 2 ? 2.5e-5 : 4e-3; }

void check_swiglu_q8(int64_t n, uint64_t seed, bool special) {
  Gpu& g = Gpu::get();
  std::vector<float> gate = randn((size_t)n, seed, 0.0f, 2.0f), up = randn((size_t)n, seed + 1);
  if (special && n >= 160) {
    for (int i = 32; i < 64; ++i) up[(size_t)i] = 0.0f;  // an all-zero block: d = 0
    gate[70] = std::nanf("");                           // NaN blocks: d = NaN, q = 0
    up[100] = INFINITY;
    gate[150] = 1e30f;  // silu(1e30) * up: finite or inf, as the host computes it
  }
  std::vector<float> ref((size_t)n);
  cpu::swiglu(gate.data(), up.data(), n, ref.data());
  auto dg = dev(gate, "gate"), du = dev(up, "up");
  // The unfused kernels: swiglu_f32's f32 output, quantized on the host (what quant_act_q8 makes of it).
  auto y = poisoned_device((size_t)n, "swiglu out");
  launch_swiglu_f32(g.load(swiglu_f32_variant()), dg.data(), du.data(), y.data(), n, g.stream.get());
  g.stream.sync("swiglu_f32");
  const std::vector<float> hy = y.download();
  const Q8Host want = host_quantized(hy);
  for (const int64_t planes : {1, 2}) {
    const std::string shape = fmt::format("n={} p{}{}", n, planes, special ? " (zero/NaN/inf blocks)" : "");
    INFO("swiglu_q8 " << shape);
    Q8Device out((size_t)n);
    launch_swiglu_q8(g.load(swiglu_q8_variant(planes)), dg.data(), du.data(), n, out.q.data(), out.d.data(),
                     out.q2.data(), g.stream.get());
    g.stream.sync("swiglu_q8");
    const Q8Host got = out.download();
    const int64_t bad = mismatches(got, want, planes);
    report("swiglu_q8", shape, "mismatches vs swiglu_f32 + quant_act_q8", (double)bad, -1);
    CHECK(bad == 0);
    if (planes == 1) {
      int64_t touched = 0;
      for (int8_t v : got.q2) touched += v != 0x55;
      CHECK(touched == 0);  // one plane never writes the second
    }
    if (!special) {  // NaN blocks make the relative error meaningless; their bits are checked above
      const double e = rel_err(dequantized(got, planes), ref);
      report("swiglu_q8", shape, "dequantized vs cpu::swiglu", e, quant_threshold(planes));
      CHECK(e <= quant_threshold(planes));
    }
  }
}

}  // namespace

TEST_CASE("add_rmsnorm_q8 equals add_f32 + rmsnorm_f32 q1/q2 bit for bit and the CPU ops within quantization",
          "[gpu][short]") {
  Gpu& g = Gpu::get();
  uint64_t seed = 500;
  for (const int64_t D : {4096, 256, 5120})
    for (const int64_t T : {1, 4, 7}) {
      const size_t n = (size_t)(T * D);
      const std::vector<float> a = randn(n, seed++, 0.1f, 1.5f), b = randn(n, seed++, -0.2f, 1.0f);
      const std::vector<float> w = randn((size_t)D, seed++, 1.0f, 0.1f);
      std::vector<float> sum_ref(n), norm_ref(n);
      cpu::add(a.data(), b.data(), (int64_t)n, sum_ref.data());
      cpu::rmsnorm(sum_ref.data(), w.data(), T, D, 1e-6f, norm_ref.data());
      auto da = dev(a, "a"), db = dev(b, "b"), dw = dev(w, "w");
      for (const int64_t planes : {1, 2}) {
        const std::string shape = fmt::format("{}x{} p{}", T, D, planes);
        INFO("add_rmsnorm_q8 " << shape);
        // The unfused kernels: add_f32, then rmsnorm_f32 q<p> of the sum (its f32 row and its planes).
        auto s1 = poisoned_device(n, "sum (unfused)"), y = poisoned_device(n, "normed (unfused)");
        Q8Device un(n);
        launch_add_f32(g.load(add_f32_variant()), da.data(), db.data(), s1.data(), (int64_t)n, g.stream.get());
        launch_rmsnorm_quant_f32(g.load(rmsnorm_f32_variant(D, planes)), s1.data(), dw.data(), y.data(), T, 1e-6f,
                                 un.q.data(), un.d.data(), un.q2.data(), g.stream.get());
        g.stream.sync("add_f32 + rmsnorm_f32");
        const std::vector<float> hy = y.download();
        const double e_norm = rel_err(hy, norm_ref);
        CHECK(e_norm <= 6e-7);
        const Q8Host unfused = un.download();
        REQUIRE(mismatches(unfused, host_quantized(hy), planes) == 0);  // the rmsnorm_f32 test's own check
        // The fused kernel.
        auto sum = poisoned_device(n, "sum");
        Q8Device out(n);
        const LoadedKernel k = g.load(add_rmsnorm_q8_variant(D, planes));
        launch_add_rmsnorm_q8(k, da.data(), db.data(), sum.data(), dw.data(), T, D, 1e-6f, out.q.data(), out.d.data(),
                              out.q2.data(), g.stream.get());
        g.stream.sync("add_rmsnorm_q8");
        const std::vector<float> hs = sum.download();
        const double e_sum = rel_err(hs, sum_ref);
        report("add_rmsnorm_q8", shape, "sum vs cpu::add", e_sum, -1);
        CHECK(e_sum == 0);
        const Q8Host got = out.download();
        const int64_t bad = mismatches(got, unfused, planes);
        report("add_rmsnorm_q8", shape, "mismatches vs add_f32 + rmsnorm_f32 q" + std::to_string(planes), (double)bad, -1);
        CHECK(bad == 0);
        if (planes == 1) {
          int64_t touched = 0;
          for (int8_t v : got.q2) touched += v != 0x55;
          CHECK(touched == 0);
        }
        const double e_q = rel_err(dequantized(got, planes), norm_ref);
        report("add_rmsnorm_q8", shape, "dequantized vs cpu::rmsnorm(cpu::add)", e_q, quant_threshold(planes));
        CHECK(e_q <= quant_threshold(planes));
        // In place (sum = a, as a plan could lay it out): the same bits.
        auto ia = dev(a, "a (in place)");
        Q8Device out2(n);
        launch_add_rmsnorm_q8(k, ia.data(), db.data(), ia.data(), dw.data(), T, D, 1e-6f, out2.q.data(),
                              out2.d.data(), out2.q2.data(), g.stream.get());
        g.stream.sync("add_rmsnorm_q8 in place");
        CHECK(cpu::test::bit_equal(ia.download(), hs));
        CHECK(mismatches(out2.download(), got, planes) == 0);
      }
    }
}

TEST_CASE("swiglu_q8 equals swiglu_f32 + quant_act_q8 bit for bit and cpu::swiglu within quantization",
          "[gpu][short]") {
  check_swiglu_q8(32, 1, false);               // one block: a warp with 8 of its lanes active
  check_swiglu_q8(96, 2, false);               // three blocks: a partial warp
  check_swiglu_q8(12288, 3, true);             // one 9B decode row, with zero, NaN and inf blocks
  check_swiglu_q8(4 * 12288, 4, false);        // a batched decode step of 4
  check_swiglu_q8(7 * 17408, 5, false);        // 27B rows
}

TEST_CASE("swiglu_q8 over more values than its capped grid covers at once (grid-stride loop)", "[gpu]") {
  check_swiglu_q8(65535LL * 256 * 4 + 4 * 96, 6, false);  // the 65535 blocks of 256 float4, then 96 float4 more
}
