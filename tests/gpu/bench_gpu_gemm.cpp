// Micro-benchmark of the Q8_0 x int8 GEMM at 9B shapes (hidden: run with `qrig_tests_gpu "[bench]"`):
// PlanMatmul::run, i.e. the kernel the executor launches, for T = 1 .. 4096 activation rows, with one and two
// activation planes ($QRIG_BENCH_PLANES, default "1,2"); int8 TOPS counted per plane-1 product
// (2 * T * n * k / time: a two-plane run does twice the dp4a for the same TOPS figure) and % of the dp4a peak (H200: 132 SMs x 64 dp4a/clk x 8 ops x 1.98 GHz = 133 TOPS;
// $QRIG_PEAK_TOPS overrides). Time per launch with CUDA events over back-to-back launches cycling through
// enough copies of the weights (>= 1 GiB) that the L2 cannot serve them (small T is DRAM-bound, like a real
// step that reads every matrix once). The table goes to stdout and, when set, is appended to
// $QRIG_BENCH_GEMM_OUT (markdown).
// The hidden "[gemm_sweep]" case times every tiling of both templates at those shapes: the data the tiling
// choice in gemm.cpp is calibrated on ($QRIG_SWEEP_MAX_T limits the row counts, $QRIG_SWEEP_PLANES the planes,
// default "1,2"; two-plane tilings that do not fit the shared memory are left out).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <thread>

#include "runtime/cuda/gemm.h"
#include "tests/gpu/gpu_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::cuda::gputest;

namespace {

double peak_tops() {
  if (const char* p = std::getenv("QRIG_PEAK_TOPS")) return std::atof(p);
  return 133.0;
}

// "1,2" -> {1, 2} from the environment variable `name` (default both).
std::vector<int64_t> planes_from_env(const char* name) {
  std::vector<int64_t> out;
  if (const char* p = std::getenv(name))
    for (const char* c = p; *c; ++c)
      if (*c == '1' || *c == '2') out.push_back(*c - '0');
  if (out.empty()) out = {1, 2};
  return out;
}

struct Shape {
  int64_t k, n;
  const char* what;
};
const std::vector<Shape> kShapes = {{4096, 12288, "ffn_gate/ffn_up"},
                                    {12288, 4096, "ffn_down"},
                                    {4096, 8192, "attn_qkv (GDN)"},
                                    {4096, 4096, "attn_gate/ssm_out"}};
const std::vector<int64_t> kTs = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
// The sweep adds the T where the choice between kernels changes.
const std::vector<int64_t> kSweepTs = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 4096};

// Weights of one shape in enough copies to defeat the L2, and T_max quantized random activation rows (two
// planes: xq/xd are also the one-plane activation).
struct Bench {
  Shape s;
  int64_t max_t;
  std::vector<DeviceBuffer<int8_t>> qs;
  std::vector<DeviceBuffer<uint16_t>> sc;
  DeviceBuffer<int8_t> xq, xq2;
  DeviceBuffer<float> xd, y;

  Bench(const Shape& s_, int64_t max_t_) : s(s_), max_t(max_t_) {
    Gpu& g = Gpu::get();
    const Q8Test w(s.n, s.k, 77);
    const size_t wbytes = q8_qs_bytes(s.n, s.k) + q8_scale_bytes(s.n, s.k);
    const int copies = (int)std::max<size_t>(2, ((size_t)1 << 30) / wbytes + 1);
    for (int c = 0; c < copies; ++c) {
      qs.emplace_back(0, w.qs.size(), "bench weights");
      sc.emplace_back(0, w.scales.size(), "bench scales");
      copy_on_device(qs.back().data(), w.qs.data(), w.qs.bytes(), g.stream.get(), "weights copy");
      copy_on_device(sc.back().data(), w.scales.data(), w.scales.bytes(), g.stream.get(), "scales copy");
    }
    const size_t nx = (size_t)(max_t * s.k);
    DeviceBuffer<float> x(0, nx, "x");
    x.upload(randn(nx, 5));
    xq = DeviceBuffer<int8_t>(0, nx, "xq");
    xq2 = DeviceBuffer<int8_t>(0, nx, "xq2");
    xd = DeviceBuffer<float>(0, nx / 32, "xd");
    y = DeviceBuffer<float>(0, (size_t)(max_t * s.n), "y");
    launch_quant_act_q8(g.load(quant_act_q8_variant(2)), x.data(), xq.data(), xd.data(), xq2.data(), (int64_t)nx,
                        g.stream.get());
    g.stream.sync("bench setup");
  }
  Q8Matrix w(int i) const { return {qs[(size_t)i % qs.size()].data(), sc[(size_t)i % sc.size()].data(), s.n, s.k}; }

  // Microseconds per launch of launch(weights, stream), ~25 ms of launches after a warm-up.
  template <class Launch>
  double time_us(Launch&& launch) {
    Gpu& g = Gpu::get();
    Event e0(0), e1(0);
    auto batch = [&](int iters) {
      e0.record(g.stream.get());
      for (int i = 0; i < iters; ++i) launch(w(i), g.stream.get());
      e1.record(g.stream.get());
      e1.sync();
      return Event::elapsed_ms(e0, e1) * 1e3 / iters;
    };
    batch(2);
    const double est = batch(3);
    const int iters = (int)std::clamp(25000.0 / std::max(est, 1.0), 5.0, 1000.0);
    return batch(std::max(iters, (int)qs.size()));
  }
  double tops(int64_t T, double us) const { return 2.0 * (double)T * s.n * s.k / (us * 1e-6) / 1e12; }
};

// Compiles variants on all cores first (NVRTC is thread-safe), so the timing loop only loads them.
void precompile(const std::vector<Variant>& vs) {
  Gpu& g = Gpu::get();
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < vs.size();) g.compiler.get(vs[i], g.info.sm);
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < std::max(2u, std::thread::hardware_concurrency()); ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

void emit(const std::string& out) {
  std::printf("%s\n", out.c_str());
  if (const char* path = std::getenv("QRIG_BENCH_GEMM_OUT"))
    if (FILE* f = std::fopen(path, "a")) {
      std::fputs(out.c_str(), f);
      std::fputs("\n", f);
      std::fclose(f);
    }
}

std::string header(const char* title) {
  const Gpu& g = Gpu::get();
  return fmt::format("## {} ({}, sm_{}, {} SMs)\n\nreference peak {:.1f} int8 TOPS (dp4a)\n\n", title, g.info.name,
                     g.info.sm, g.info.sms, peak_tops());
}

}  // namespace

TEST_CASE("Q8_0 GEMM throughput at 9B shapes (PlanMatmul::run)", "[.bench]") {
  Gpu& g = Gpu::get();
  const int64_t max_t = kTs.back();
  const std::vector<int64_t> planes_list = planes_from_env("QRIG_BENCH_PLANES");
  std::vector<Variant> all;
  for (const int64_t planes : planes_list)
    for (const Shape& s : kShapes)
      for (const Variant& v : matmul_q8_0_variants(s.k, s.n, max_t, g.info.sms, planes)) all.push_back(v);
  precompile(all);
  std::string out = header("Q8_0 x int8 GEMM, PlanMatmul::run") +
                    "| shape | planes | T | kernel | us | TOPS | % of peak | tokens/s |\n"
                    "|---|---|---|---|---|---|---|---|\n";
  for (const Shape& s : kShapes) {
    Bench b(s, max_t);
    for (const int64_t planes : planes_list) {
      const PlanMatmul mm([&](const Variant& v) { return g.load(v); }, s.k, s.n, max_t, g.info.sms, planes);
      for (const int64_t T : kTs) {
        const double us = b.time_us([&](const Q8Matrix& w, StreamHandle st) {
          mm.run(w, b.xq.data(), b.xd.data(), b.xq2.data(), T, b.y.data(), st);
        });
        const double tops = b.tops(T, us);
        out += fmt::format("| {}->{} ({}) | {} | {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.0f} |\n", s.k, s.n, s.what,
                           planes, T, mm.variant_for(T).name, us, tops, 100.0 * tops / peak_tops(), T / (us * 1e-6));
      }
    }
  }
  emit(out);
  CHECK(!out.empty());
}

TEST_CASE("Q8_0 GEMM tiling sweep at 9B shapes", "[.gemm_sweep]") {
  Gpu& g = Gpu::get();
  const int64_t max_t = kTs.back();
  const std::vector<int64_t> planes_list = planes_from_env("QRIG_SWEEP_PLANES");
  std::map<int64_t, std::vector<Variant>> tiled, skinny;  // by planes
  std::vector<Variant> all;
  for (const int64_t planes : planes_list) {
    for (const auto& [bn, bt, tn, tt, kb, sk] : std::vector<std::array<int64_t, 6>>{
             {128, 128, 8, 8, 2, 1}, {128, 128, 8, 8, 1, 1}, {128, 64, 8, 4, 2, 1}, {64, 64, 4, 4, 2, 1},
             {128, 32, 4, 4, 2, 1}, {64, 32, 4, 4, 2, 1}, {64, 32, 4, 4, 2, 2}, {32, 32, 4, 4, 2, 4},
             {32, 32, 4, 4, 1, 4}, {32, 32, 4, 4, 2, 2}, {64, 64, 4, 4, 1, 2}})
      if (gemm_q8_0_tiled_smem_bytes(planes, bn, bt, kb, sk) <= kTiledSmemLimit)
        tiled[planes].push_back(gemm_q8_0_tiled_variant(planes, bn, bt, tn, tt, kb, sk));
    for (const auto& [c, r, u, t] : std::vector<std::array<int64_t, 4>>{
             {2, 2, 2, 256}, {2, 4, 2, 128}, {2, 2, 4, 128}, {4, 2, 4, 128}, {4, 4, 1, 128}, {4, 4, 1, 64},
             {4, 8, 1, 64}, {4, 4, 2, 64}, {4, 2, 2, 64}, {8, 2, 2, 128}, {8, 4, 1, 64}, {8, 4, 1, 128},
             {8, 8, 1, 64}, {16, 4, 1, 64}, {16, 2, 1, 64}, {16, 4, 1, 128}})
      skinny[planes].push_back(gemm_q8_0_skinny_variant(planes, c, r, u, t));
    all.insert(all.end(), tiled[planes].begin(), tiled[planes].end());
    all.insert(all.end(), skinny[planes].begin(), skinny[planes].end());
    for (const Shape& s : kShapes) all.push_back(gemv_q8_0_variant(s.k, planes));
  }
  precompile(all);
  std::string out = header("Q8_0 x int8 GEMM tiling sweep") + "| shape | T | kernel | us | TOPS | % of peak |\n|---|---|---|---|---|---|\n";
  std::map<std::pair<std::string, int64_t>, std::pair<double, std::string>> best;
  for (const Shape& s : kShapes) {
    Bench b(s, max_t);
    for (const int64_t planes : planes_list) {
      const std::string shape = fmt::format("{}->{} p{}", s.k, s.n, planes);
      auto row = [&](int64_t T, const std::string& name, double us) {
        const double tops = b.tops(T, us);
        out += fmt::format("| {} | {} | {} | {:.1f} | {:.1f} | {:.1f} |\n", shape, T, name, us, tops,
                           100.0 * tops / peak_tops());
        auto& bst = best[{shape, T}];
        if (bst.second.empty() || us < bst.first) bst = {us, name};
      };
      const LoadedKernel gemv = g.load(gemv_q8_0_variant(s.k, planes));
      row(1, gemv.variant.name, b.time_us([&](const Q8Matrix& w, StreamHandle st) {
        launch_gemv_q8_0(gemv, w, b.xq.data(), b.xd.data(), b.xq2.data(), b.y.data(), st);
      }));
      for (const int64_t T : kSweepTs) {
        if (const char* m = std::getenv("QRIG_SWEEP_MAX_T"); m && T > std::atoll(m)) continue;
        for (const Variant& v : skinny[planes])
          if (T <= v.param("c") && 2 * T > v.param("c")) {
            const LoadedKernel k = g.load(v);
            row(T, v.name, b.time_us([&](const Q8Matrix& w, StreamHandle st) {
              launch_gemm_q8_0_skinny(k, w, b.xq.data(), b.xd.data(), b.xq2.data(), T, b.y.data(), st);
            }));
          }
        if (T >= 8)
          for (const Variant& v : tiled[planes]) {
            const LoadedKernel k = g.load(v);
            row(T, v.name, b.time_us([&](const Q8Matrix& w, StreamHandle st) {
              launch_gemm_q8_0_tiled(k, w, b.xq.data(), b.xd.data(), b.xq2.data(), T, b.y.data(), st);
            }));
          }
      }
    }
  }
  out += "\n### Fastest per shape and T\n\n| shape | T | kernel | us | TOPS |\n|---|---|---|---|---|\n";
  for (const auto& [key, v] : best) {
    const auto& s = *std::find_if(kShapes.begin(), kShapes.end(), [&](const Shape& x) {
      return key.first.rfind(fmt::format("{}->{} ", x.k, x.n), 0) == 0;
    });
    out += fmt::format("| {} | {} | {} | {:.1f} | {:.1f} |\n", key.first, key.second, v.second, v.first,
                       2.0 * key.second * s.n * s.k / (v.first * 1e-6) / 1e12);
  }
  emit(out);
  CHECK(!best.empty());
}
