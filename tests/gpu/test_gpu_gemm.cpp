// The Q8_0 x int8 GEMM (gemm.h: PlanMatmul and both templates, every tiling, one and two activation planes)
// against cpu::matmul on the GPU, on fresh random inputs, outputs poisoned with NaN first. Error = max|gpu -
// cpu| / max|cpu| over the compared outputs (cpu::test::rel_err). Thresholds:
//   4e-6  vs cpu::matmul on the same Q8_0 weights and the SAME quantized activation (host-quantized,
//         dequantized for the reference: d * q, or d * (q + q2/254) with two planes): both compute the same
//         products, so only the fp32 summation order (and, with two planes, the rounding of s1 + s2/254 per
//         block against that of each dequantized value) differs (measured <= 9.2e-7, H200, 2026-12-02)
//   1e-2  vs cpu::matmul on the float activation, one int8 plane: the quantization (a step of amax/127 per
//         32 values) leaves ~0.5% relative noise (measured <= 6.2e-3)
//   6e-5  the same with two planes (the residual on the step amax/127/254, measured <= 2.5e-5); PlanMatmul checks of
//         at least 256 outputs also require the two-plane error to be below 1/20 of the one-plane error on
//         the same inputs (fewer outputs: the one-plane maximum may be small by chance)
// At the 9B shapes the reference covers a strided subset of the weight rows (all tokens): a full CPU matmul of
// 512 x 4096 x 12288 is too slow for a test. Every output is checked to have been written (no NaN left).
// Exact properties, per number of planes: tiled tilings with one K slice (or the same slicing) add each
// output's terms in the same order, so those tilings agree bit for bit and a token's row does not depend on T
// (among such runs); skinny tilings agree bit for bit with each other; repeated runs are identical
// (deterministic); the GPU-quantized activation gives the same bits as the host-quantized one (quant_act_q8
// is bit-exact, both planes). One-plane kernels must not read the second plane: it holds garbage for them.
// Deliberately broken tiled and skinny kernels must miss the 4e-6 (the last case, tests/gpu/broken_kernels.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <map>
#include <memory>

#include "runtime/cuda/gemm.h"
#include "tests/gpu/gpu_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::cuda::gputest;

namespace {

KernelLoader gpu_loader() {
  return [](const Variant& v) { return Gpu::get().load(v); };
}

constexpr double kSameErr = 4e-6;  // vs the same quantized activation (measured <= 9.2e-7, H200, 2026-12-02)
// vs the float activation (measured <= 2.5e-5 with two planes, 6.2e-3 with one)
double float_err_max(int64_t planes) { return planes == 2 ? 6e-5 : 1e-2; }

// T random activation rows, quantized on the host with `planes` planes, on the device; the dequantized copy
// for the reference. With one plane xq2 is filled with garbage (0x7F) that the kernels must not read.
struct Activation {
  int64_t T, k, planes;
  std::vector<float> x, xhat;
  DeviceBuffer<int8_t> xq, xq2;
  DeviceBuffer<float> xd;
  Activation(int64_t T_, int64_t k_, uint64_t seed, int64_t planes_) : T(T_), k(k_), planes(planes_) {
    x = randn((size_t)(T * k), seed, 0.1f, 1.0f);
    std::vector<int8_t> hq(x.size()), hq2(x.size());
    std::vector<float> hd(x.size() / 32);
    int8_t* q2 = planes == 2 ? hq2.data() : nullptr;
    quantize_activation_q8(x.data(), T * k, hq.data(), hd.data(), q2);
    xhat = dequantize_activation_q8(hq.data(), hd.data(), T * k, q2);
    xq = DeviceBuffer<int8_t>(0, hq.size(), "xq");
    xq2 = DeviceBuffer<int8_t>(0, hq.size(), "xq2");
    xd = DeviceBuffer<float>(0, hd.size(), "xd");
    xq.upload(hq);
    xd.upload(hd);
    if (planes == 2)
      xq2.upload(hq2);
    else
      xq2.fill_bytes(0x7F);
  }
};

// Weight rows 0, stride, 2*stride, ... and the last one.
std::vector<int64_t> rows_of(int64_t n, int64_t stride) {
  std::vector<int64_t> r;
  for (int64_t o = 0; o < n; o += stride) r.push_back(o);
  if (r.back() != n - 1) r.push_back(n - 1);
  return r;
}

// cpu::matmul of the chosen weight rows (gathered GGUF rows) for all T tokens of x [T][w.cols]: ref[t][j] for
// row rows[j].
std::vector<float> reference(const Q8Test& w, const std::vector<int64_t>& rows, const std::vector<float>& x,
                             int64_t T) {
  const size_t row_bytes = (size_t)(w.cols / 32) * 34;
  std::vector<uint8_t> sub(rows.size() * row_bytes);
  for (size_t j = 0; j < rows.size(); ++j)
    std::memcpy(sub.data() + j * row_bytes, w.gguf.data() + (size_t)rows[j] * row_bytes, row_bytes);
  std::vector<float> ref((size_t)T * rows.size());
  cpu::matmul({gguf::TensorType::Q8_0, sub.data(), w.cols, (int64_t)rows.size()}, x.data(), T, ref.data());
  return ref;
}

// Both references of an activation: on its dequantized form and on the float values.
struct References {
  std::vector<float> same, flt;
  References(const Q8Test& w, const std::vector<int64_t>& rows, const Activation& a)
      : same(reference(w, rows, a.xhat, a.T)), flt(reference(w, rows, a.x, a.T)) {}
};

// y [T][n] picked at the reference's rows.
std::vector<float> pick(const std::vector<float>& y, int64_t n, const std::vector<int64_t>& rows, int64_t T) {
  std::vector<float> out((size_t)T * rows.size());
  for (int64_t t = 0; t < T; ++t)
    for (size_t j = 0; j < rows.size(); ++j) out[(size_t)t * rows.size() + j] = y[(size_t)(t * n + rows[j])];
  return out;
}

// Tiled variants with equal keys (and equal planes) add each output's terms in the same order (the
// template's header).
int64_t summation_order(const Variant& v) {
  return v.param("sk") == 1 ? 1 : 100 * v.param("kb") + v.param("sk");
}

int64_t count_nan(const std::vector<float>& y) {
  return std::count_if(y.begin(), y.end(), [](float v) { return std::isnan(v); });
}

// y = the launch's output, after poisoning it with NaN.
template <class Launch>
std::vector<float> run_poisoned(int64_t T, int64_t n, const std::string& what, Launch&& launch) {
  Gpu& g = Gpu::get();
  auto y = poisoned_device((size_t)(T * n), "gemm output");
  launch(y.data(), g.stream.get());
  g.stream.sync(what);
  return y.download();
}

// y's errors against both references, reported and checked; returns the error vs the float activation.
double check_errors(const std::string& kernel, const std::string& shape, int64_t planes, const std::vector<float>& y,
                    const References& ref, bool print = true) {
  const double e = rel_err(y, ref.same), f = rel_err(y, ref.flt);
  if (print) {
    report(kernel, shape, "vs same quantized activation", e, kSameErr);
    report(kernel, shape, "vs f32 activation", f, float_err_max(planes));
  }
  CHECK(e <= kSameErr);
  CHECK(f <= float_err_max(planes));
  return f;
}

// PlanMatmul for each T against the references on every `stride`-th row; returns nothing, CHECKs and reports.
// With two planes each T also runs the one-plane PlanMatmul `mm1` (when given) on the same inputs, whose error
// vs the float activation must be 20x the two-plane one at least (over 256 outputs or more).
void check_matmul(const Q8Test& w, const PlanMatmul& mm, const std::vector<int64_t>& Ts, uint64_t seed, int64_t stride,
                  const PlanMatmul* mm1 = nullptr) {
  const std::vector<int64_t> rows = rows_of(w.rows, stride);
  const int64_t planes = mm.planes();
  for (const int64_t T : Ts) {
    const Activation a(T, w.cols, seed + (uint64_t)T, planes);
    const References ref(w, rows, a);
    const std::string kernel = mm.variant_for(T).name;
    const std::string shape = fmt::format("{}->{} T={}", w.cols, w.rows, T) +
                              (stride > 1 ? fmt::format(" ({} rows)", rows.size()) : "");
    INFO(shape << " " << kernel);
    const auto y = run_poisoned(T, w.rows, kernel, [&](float* out, StreamHandle s) {
      mm.run(w.device(), a.xq.data(), a.xd.data(), a.xq2.data(), T, out, s);
    });
    CHECK(count_nan(y) == 0);
    const double f = check_errors(kernel, shape, planes, pick(y, w.rows, rows, T), ref);
    if (mm1 && planes == 2 && T * (int64_t)rows.size() >= 256) {
      const auto y1 = run_poisoned(T, w.rows, mm1->variant_for(T).name, [&](float* out, StreamHandle s) {
        mm1->run(w.device(), a.xq.data(), a.xd.data(), nullptr, T, out, s);
      });
      const double f1 = rel_err(pick(y1, w.rows, rows, T), ref.flt);
      INFO("one plane: " << f1 << ", two planes: " << f);
      CHECK(f * 20 <= f1);
    }
  }
}

}  // namespace

TEST_CASE("PlanMatmul matches cpu::matmul for every T kind at edge sizes, one and two planes", "[gpu][short]") {
  Gpu& g = Gpu::get();
  const std::vector<int64_t> Ts = {1, 2, 3, 7, 16, 33, 64, 128, 257, 512};
  for (const auto& [k, n] : std::vector<std::pair<int64_t, int64_t>>{{256, 4}, {256, 48}, {256, 96}, {256, 1033}, {96, 33}}) {
    const Q8Test w(n, k, 100 + (uint64_t)n);
    const PlanMatmul mm1(gpu_loader(), k, n, 512, g.info.sms, 1);
    const PlanMatmul mm2(gpu_loader(), k, n, 512, g.info.sms, 2);
    check_matmul(w, mm1, Ts, 1000 + (uint64_t)n, 1);
    check_matmul(w, mm2, Ts, 1000 + (uint64_t)n, 1, &mm1);
  }
}

TEST_CASE("every tiling of both GEMM templates matches cpu::matmul, one and two planes; tilings agree bit for bit",
          "[gpu][short]") {
  Gpu& g = Gpu::get();
  const int64_t k = 512;
  for (const int64_t n : {1033, 1036}) {  // scalar and 16-byte stores, partial row tiles
    const Q8Test w(n, k, 200 + (uint64_t)n);
    const std::vector<int64_t> all = rows_of(n, 1);
    for (const int64_t planes : {1, 2}) {
      // Tiled: T = 100 leaves partial token tiles for every tile height.
      {
        const int64_t T = 100;
        const Activation a(T, k, 300 + (uint64_t)n, planes);
        const References ref(w, all, a);
        // Every tiling with one K slice agrees bit for bit; sliced ones add in another order, set by (kb, sk).
        std::map<int64_t, std::vector<float>> first_of_order;
        for (const auto& [bn, bt, tn, tt, sk] : std::vector<std::array<int64_t, 5>>{
                 {128, 128, 8, 8, 1}, {128, 64, 8, 4, 1}, {64, 64, 4, 4, 1}, {128, 32, 4, 4, 1}, {64, 32, 4, 4, 1},
                 {32, 16, 4, 4, 1}, {64, 32, 4, 4, 2}, {32, 32, 4, 4, 4}, {32, 32, 4, 4, 2}, {32, 16, 4, 4, 4}})
          for (const int64_t kb : {1, 2}) {
            if (gemm_q8_0_tiled_smem_bytes(planes, bn, bt, kb, sk) > kTiledSmemLimit) {
              // Two planes: 128 x 128 and 32 x 32 with 4 slices do not fit with kb = 2; refused by name.
              CHECK(planes == 2);
              CHECK_THROWS_AS(gemm_q8_0_tiled_variant(planes, bn, bt, tn, tt, kb, sk), KernelError);
              continue;
            }
            const LoadedKernel kern = g.load(gemm_q8_0_tiled_variant(planes, bn, bt, tn, tt, kb, sk));
            INFO(kern.variant.name << " n = " << n);
            const auto y = run_poisoned(T, n, kern.variant.name, [&](float* out, StreamHandle s) {
              launch_gemm_q8_0_tiled(kern, w.device(), a.xq.data(), a.xd.data(), a.xq2.data(), T, out, s);
            });
            check_errors(kern.variant.name, fmt::format("{}->{} T={}", k, n, T), planes, y, ref);
            auto& first = first_of_order[summation_order(kern.variant)];
            if (first.empty()) first = y;
            CHECK(cpu::test::bit_equal(y, first));
          }
      }
      // Skinny: every T up to 16 on the smallest c that holds it, and on c = 16.
      for (int64_t T = 1; T <= 16; ++T) {
        const Activation a(T, k, 400 + (uint64_t)(n + T), planes);
        const References ref(w, all, a);
        int64_t c = 1;
        while (c < T) c *= 2;
        std::vector<float> first;
        for (const auto& [cols, r, u, t] : std::vector<std::array<int64_t, 4>>{
                 {c, 1, 1, 32}, {c, 2, 2, 128}, {c, 8 / std::min<int64_t>(c, 8), 3, 256}, {16, 2, 1, 64}, {16, 1, 2, 128}}) {
          const LoadedKernel kern = g.load(gemm_q8_0_skinny_variant(planes, cols, r, u, t));
          INFO(kern.variant.name << " n = " << n << " T = " << T);
          const auto y = run_poisoned(T, n, kern.variant.name, [&](float* out, StreamHandle s) {
            launch_gemm_q8_0_skinny(kern, w.device(), a.xq.data(), a.xd.data(), a.xq2.data(), T, out, s);
          });
          check_errors(kern.variant.name, fmt::format("{}->{} T={}", k, n, T), planes, y, ref, T == 16 || T == 3);
          if (first.empty()) first = y;
          CHECK(cpu::test::bit_equal(y, first));
        }
      }
    }
  }
}

TEST_CASE("the GEMM launchers refuse bad shapes and arguments", "[gpu][short]") {
  Gpu& g = Gpu::get();
  const Q8Test w(64, 64, 5);
  const Activation a(4, 64, 6, 2);
  auto y = poisoned_device(4 * 64, "y");
  const LoadedKernel tiled = g.load(gemm_q8_0_tiled_variant(1, 64, 32, 4, 4, 2));
  const LoadedKernel sliced = g.load(gemm_q8_0_tiled_variant(1, 32, 32, 4, 4, 1, 4));
  const LoadedKernel skinny = g.load(gemm_q8_0_skinny_variant(1, 2, 2, 2, 128));
  const LoadedKernel tiled2 = g.load(gemm_q8_0_tiled_variant(2, 64, 32, 4, 4, 2));
  const LoadedKernel skinny2 = g.load(gemm_q8_0_skinny_variant(2, 2, 2, 2, 128));
  StreamHandle s = g.stream.get();
  const int8_t* q = a.xq.data();
  const int8_t* q2 = a.xq2.data();
  const float* d = a.xd.data();
  CHECK_THROWS_AS(launch_gemm_q8_0_skinny(skinny, w.device(), q, d, nullptr, 3, y.data(), s), KernelError);
  CHECK_THROWS_AS(launch_gemm_q8_0_tiled(skinny, w.device(), q, d, nullptr, 2, y.data(), s), KernelError);
  CHECK_THROWS_AS(launch_gemm_q8_0_tiled(tiled, w.device(), q, d, nullptr, 0, y.data(), s), KernelError);
  CHECK_THROWS_AS(launch_gemm_q8_0_tiled(tiled, w.device(), q + 1, d, nullptr, 2, y.data(), s), KernelError);
  CHECK_THROWS_AS(launch_gemm_q8_0_tiled(tiled, w.device(), q, d, nullptr, 2, y.data() + 1, s), KernelError);
  Q8Matrix odd = w.device();
  odd.cols = 32;  // K/32 = 1 is not a multiple of kb = 2
  CHECK_THROWS_AS(launch_gemm_q8_0_tiled(tiled, odd, q, d, nullptr, 2, y.data(), s), KernelError);
  CHECK_THROWS_AS(launch_gemm_q8_0_tiled(sliced, w.device(), q, d, nullptr, 2, y.data(), s), KernelError);
  // Two planes need the second one, as aligned as the first; one plane ignores it (null is fine).
  CHECK_THROWS_AS(launch_gemm_q8_0_tiled(tiled2, w.device(), q, d, nullptr, 2, y.data(), s), KernelError);
  CHECK_THROWS_AS(launch_gemm_q8_0_tiled(tiled2, w.device(), q, d, q2 + 1, 2, y.data(), s), KernelError);
  CHECK_THROWS_AS(launch_gemm_q8_0_skinny(skinny2, w.device(), q, d, nullptr, 2, y.data(), s), KernelError);
  CHECK_THROWS_AS(launch_gemm_q8_0_skinny(skinny2, w.device(), q, d, q2 + 8, 2, y.data(), s), KernelError);
  CHECK_NOTHROW(launch_gemm_q8_0_tiled(tiled, w.device(), q, d, nullptr, 2, y.data(), s));
  CHECK_NOTHROW(launch_gemm_q8_0_skinny(skinny, w.device(), q, d, nullptr, 2, y.data(), s));
  const PlanMatmul mm(gpu_loader(), 64, 64, 4, g.info.sms, 1);
  CHECK_THROWS_AS(mm.run(w.device(), q, d, nullptr, 5, y.data(), s), KernelError);
  CHECK_THROWS_AS(mm.run(w.device(), q, d, nullptr, 0, y.data(), s), KernelError);
  Q8Matrix wrong = w.device();
  wrong.rows = 32;
  CHECK_THROWS_AS(mm.run(wrong, q, d, nullptr, 2, y.data(), s), KernelError);
  const PlanMatmul mm2(gpu_loader(), 64, 64, 4, g.info.sms, 2);
  for (int64_t T = 1; T <= 4; ++T) CHECK_THROWS_AS(mm2.run(w.device(), q, d, nullptr, T, y.data(), s), KernelError);
  CHECK_THROWS_AS(PlanMatmul(gpu_loader(), 64, 64, 4, g.info.sms, 3), KernelError);
  g.stream.sync("refused launches");
}

TEST_CASE("PlanMatmul matches cpu::matmul at 9B and 27B shapes, one and two planes; deterministic, T-invariant", "[gpu]") {
  Gpu& g = Gpu::get();
  {
    const Q8Test w(12288, 4096, 11);  // ffn_gate / ffn_up
    const PlanMatmul mm1(gpu_loader(), 4096, 12288, 512, g.info.sms, 1);
    const PlanMatmul mm2(gpu_loader(), 4096, 12288, 512, g.info.sms, 2);
    check_matmul(w, mm1, {2, 8, 64, 512}, 21, 97);
    check_matmul(w, mm2, {2, 8, 64, 512}, 21, 97, &mm1);

    // Deterministic, and a token's outputs do not depend on T (both T run tiled kernels with the same number
    // of K slices); the GPU-quantized activation gives the same bits as the host-quantized one.
    for (const PlanMatmul* mm : {&mm1, &mm2}) {
      const int64_t planes = mm->planes();
      INFO(planes << " plane(s)");
      const Activation a(512, 4096, 31, planes);
      auto run = [&](int64_t T, const int8_t* xq, const float* xd, const int8_t* xq2) {
        return run_poisoned(T, 12288, mm->variant_for(T).name,
                            [&](float* out, StreamHandle s) { mm->run(w.device(), xq, xd, xq2, T, out, s); });
      };
      const auto y512 = run(512, a.xq.data(), a.xd.data(), a.xq2.data());
      CHECK(cpu::test::bit_equal(run(512, a.xq.data(), a.xd.data(), a.xq2.data()), y512));
      REQUIRE(mm->variant_for(512).kernel == "gemm_q8_0_dp4a_tiled");
      int64_t T2 = 0;
      for (const int64_t t : {64, 96, 128, 192, 256, 384})
        if (!T2 && mm->variant_for(t).kernel == "gemm_q8_0_dp4a_tiled" &&
            summation_order(mm->variant_for(t)) == summation_order(mm->variant_for(512)) &&
            !(mm->variant_for(t) == mm->variant_for(512)))
          T2 = t;
      REQUIRE(T2 > 0);
      INFO("T = 512 " << mm->variant_for(512).name << ", T = " << T2 << " " << mm->variant_for(T2).name);
      const auto y2 = run(T2, a.xq.data(), a.xd.data(), a.xq2.data());
      CHECK(cpu::test::bit_equal(y2, std::vector<float>(y512.begin(), y512.begin() + T2 * 12288)));
      DeviceBuffer<float> x(0, a.x.size(), "x");
      x.upload(a.x);
      DeviceBuffer<int8_t> xq(0, a.x.size(), "xq (gpu)"), xq2(0, a.x.size(), "xq2 (gpu)");
      DeviceBuffer<float> xd(0, a.x.size() / 32, "xd (gpu)");
      xq2.fill_bytes(0x7F);
      launch_quant_act_q8(g.load(quant_act_q8_variant(planes)), x.data(), xq.data(), xd.data(), xq2.data(),
                          (int64_t)a.x.size(), g.stream.get());
      CHECK(cpu::test::bit_equal(run(512, xq.data(), xd.data(), xq2.data()), y512));
    }
  }
  for (const int64_t planes : {1, 2}) {
    {
      const Q8Test w(4096, 12288, 12);  // ffn_down
      const PlanMatmul mm(gpu_loader(), 12288, 4096, 512, g.info.sms, planes);
      check_matmul(w, mm, {3, 512}, 22, 61);
    }
    {
      const Q8Test w(8192, 4096, 13);  // attn_qkv (GDN), attn_q
      const PlanMatmul mm(gpu_loader(), 4096, 8192, 1024, g.info.sms, planes);
      check_matmul(w, mm, {300, 1024}, 23, 83);
    }
    {
      const Q8Test w(17408, 5120, 14);  // 27B ffn_gate / ffn_up
      const PlanMatmul mm(gpu_loader(), 5120, 17408, 128, g.info.sms, planes);
      check_matmul(w, mm, {5, 100}, 24, 131);
    }
    {
      const Q8Test w(5120, 17408, 15);  // 27B ffn_down
      const PlanMatmul mm(gpu_loader(), 17408, 5120, 64, g.info.sms, planes);
      check_matmul(w, mm, {33}, 25, 53);
    }
    {
      const Q8Test w(248320, 4096, 16);  // lm_head (output.weight): the largest grid
      const PlanMatmul mm(gpu_loader(), 4096, 248320, 64, g.info.sms, planes);
      check_matmul(w, mm, {5, 40}, 26, 1999);
    }
  }
}

// The thresholds catch real bugs: each GEMM bug of tests/gpu/broken_kernels.h (off-by-one tile and loop indices, a
// wrong second-plane step) patched into its template and compiled by NVRTC must miss kSameErr against the same
// quantized activation, the real test's comparison; the unpatched templates through the same path stay within it,
// one and two planes. K = 1280 leaves the skinny kernel a partial 512-byte chunk (16 of its 80 vectors), so its
// tail runs; T = 100 leaves the tiled kernel a partial token tile; the skinny kernel runs T = 5 (c = 8) and 16.
TEST_CASE("deliberately broken GEMM kernels (tiled and skinny) fail the GEMM threshold", "[gpu][broken]") {
  const int64_t k = 1280, n = 1036;
  const Q8Test w(n, k, 500);
  const std::vector<int64_t> all = rows_of(n, 1);
  std::map<std::pair<int64_t, int64_t>, std::pair<std::unique_ptr<Activation>, std::unique_ptr<References>>> inputs;
  auto input = [&](int64_t T, int64_t planes) -> std::pair<const Activation*, const References*> {
    auto& in = inputs[{T, planes}];
    if (!in.first) {
      in.first = std::make_unique<Activation>(T, k, 600 + (uint64_t)(T * 3 + planes), planes);
      in.second = std::make_unique<References>(w, all, *in.first);
    }
    return {in.first.get(), in.second.get()};
  };
  int64_t caught = 0, bugs_run = 0;
  for (const std::string kernel : {"gemm_q8_0_dp4a_tiled", "gemm_q8_0_dp4a_skinny"}) {
    const bool tiled = kernel == "gemm_q8_0_dp4a_tiled";
    std::vector<broken::Bug> bugs = {no_bug(kernel), no_bug(kernel)};
    bugs[1].planes = 2;
    for (const broken::Bug& b : broken::bugs_of(kernel)) bugs.push_back(b);
    for (const broken::Bug& b : bugs) {
      const int64_t planes = b.planes == 2 ? 2 : 1;
      INFO(kernel << ", bug: " << (b.from.empty() ? "none" : b.what) << ", " << planes << " plane(s)");
      double e = 0;
      std::string shape = fmt::format("{}->{} p{} T=", k, n, planes);
      for (const int64_t T : tiled ? std::vector<int64_t>{100} : std::vector<int64_t>{5, 16}) {
        const auto [a, ref] = input(T, planes);
        const Variant v = tiled ? gemm_q8_0_tiled_variant(planes, 64, 32, 4, 4, 2, 1)
                                : gemm_q8_0_skinny_variant(planes, T <= 8 ? 8 : 16, 2, T <= 8 ? 2 : 1, T <= 8 ? 128 : 64);
        const LoadedKernel kern = load_patched(v, b);
        const auto y = run_poisoned(T, n, v.name, [&](float* out, StreamHandle s) {
          if (tiled)
            launch_gemm_q8_0_tiled(kern, w.device(), a->xq.data(), a->xd.data(), a->xq2.data(), T, out, s);
          else
            launch_gemm_q8_0_skinny(kern, w.device(), a->xq.data(), a->xd.data(), a->xq2.data(), T, out, s);
        });
        e = std::max(e, rel_err(y, ref->same));
        shape += (shape.back() == '=' ? "" : ",") + std::to_string(T);
      }
      report_bug(b, shape, "vs same quantized activation", e, kSameErr);
      if (b.from.empty()) {
        CHECK(e <= kSameErr);
      } else {
        CHECK(e > kSameErr);
        caught += e > kSameErr;
        ++bugs_run;
      }
    }
  }
  CHECK(bugs_run == 6);
  CHECK(caught == bugs_run);
}
