// Micro-benchmark of the decode GEMV at 9B shapes (hidden: run with `qrig_tests_gpu "[bench]"`): time per
// launch with CUDA events over many back-to-back launches, cycling through enough copies of the weights
// (>= 2 GiB in all) that the 50 MiB L2 cannot serve them, as in a real decode step where every matrix is
// read once. Bandwidth = bytes the kernel must read (int8 weights, fp16 scales, activation) + write, over
// time; compared with a device-to-device copy measured in the same run and with the H200's ~4.3 TB/s
// ($QRIG_PEAK_GBPS overrides). Sweeps the tilings (rows per warp r, chunks in flight u, block size t).
// The table goes to stdout and, when set, to $QRIG_BENCH_OUT (markdown).
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>

#include "tests/gpu/gpu_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::cuda::gputest;

namespace {

struct Row {
  std::string shape, what;
  double us, gbps;
};

double peak_gbps() {
  if (const char* p = std::getenv("QRIG_PEAK_GBPS")) return std::atof(p);
  return 4300.0;
}

// Device-to-device copy bandwidth (bytes read + written), the figure BASELINES.md calls ~4.3 TB/s.
double measure_copy_gbps() {
  Gpu& g = Gpu::get();
  const size_t bytes = (size_t)1 << 30;
  DeviceBuffer<char> a(0, bytes, "copy source"), b(0, bytes, "copy destination");
  a.fill_bytes(1);
  Event e0(0), e1(0);
  copy_on_device(b.data(), a.data(), bytes, g.stream.get(), "warm-up copy");
  e0.record(g.stream.get());
  const int reps = 10;
  for (int i = 0; i < reps; ++i) copy_on_device(b.data(), a.data(), bytes, g.stream.get(), "timed copy");
  e1.record(g.stream.get());
  e1.sync();
  return 2.0 * bytes * reps / (Event::elapsed_ms(e0, e1) * 1e-3) / 1e9;
}

}  // namespace

TEST_CASE("decode GEMV bandwidth at 9B shapes", "[.bench]") {
  Gpu& g = Gpu::get();
  std::vector<Row> rows;
  const double copy = measure_copy_gbps();
  struct Shape {
    int64_t k, n;
    const char* what;
  };
  const std::vector<Shape> shapes = {{4096, 12288, "ffn_gate/ffn_up"},
                                     {12288, 4096, "ffn_down"},
                                     {4096, 4096, "attn_output/ssm_out"},
                                     {4096, 8192, "attn_qkv (GDN)"},
                                     {4096, 248320, "lm_head"}};
  for (const Shape& s : shapes) {
    // One random matrix, uploaded to enough buffers to defeat the L2.
    const Q8Test w(s.n, s.k, 77);
    const size_t wbytes = q8_qs_bytes(s.n, s.k) + q8_scale_bytes(s.n, s.k);
    const int copies = (int)std::max<size_t>(2, ((size_t)2 << 30) / wbytes + 1);
    std::vector<DeviceBuffer<int8_t>> qs;
    std::vector<DeviceBuffer<uint16_t>> sc;
    for (int c = 0; c < copies; ++c) {
      qs.emplace_back(0, w.qs.size(), "bench weights");
      sc.emplace_back(0, w.scales.size(), "bench scales");
      copy_on_device(qs.back().data(), w.qs.data(), w.qs.bytes(), g.stream.get(), "weights copy");
      copy_on_device(sc.back().data(), w.scales.data(), w.scales.bytes(), g.stream.get(), "scales copy");
    }
    DeviceBuffer<float> x(0, (size_t)s.k, "x"), xd(0, (size_t)s.k / 32, "xd"), y(0, (size_t)s.n, "y");
    DeviceBuffer<int8_t> xq(0, (size_t)s.k, "xq"), xq2(0, (size_t)s.k, "xq2");
    x.upload(randn((size_t)s.k, 5));
    for (const int64_t planes : {1, 2}) {
      const LoadedKernel quant = g.load(quant_act_q8_variant(planes));
      launch_quant_act_q8(quant, x.data(), xq.data(), xd.data(), xq2.data(), s.k, g.stream.get());
      g.stream.sync("bench setup");
      const double bytes = (double)wbytes + (double)(s.k * planes) + s.k / 8.0 + 4.0 * s.n;
      const std::string shape = fmt::format("{}->{} ({}) p{}", s.k, s.n, s.what, planes);
      const int iters = std::max(copies, 200);
      Event e0(0), e1(0);
      // The activation quantization that precedes every GEMV.
      e0.record(g.stream.get());
      for (int i = 0; i < iters; ++i)
        launch_quant_act_q8(quant, x.data(), xq.data(), xd.data(), xq2.data(), s.k, g.stream.get());
      e1.record(g.stream.get());
      e1.sync();
      const double qus = Event::elapsed_ms(e0, e1) * 1e3 / iters;
      rows.push_back({shape, quant.variant.name, qus, (s.k * 4.0 + s.k * (planes + 0.125)) / (qus * 1e-6) / 1e9});
      for (int64_t r : {1, 2, 4})
        for (int64_t u : {2, 4, 8})
          for (int64_t t : {128, 256}) {
            const LoadedKernel k = g.load(gemv_q8_0_variant(s.k, planes, r, u, t));
            auto run = [&](int i) {
              const int c = i % copies;
              launch_gemv_q8_0(k, {qs[(size_t)c].data(), sc[(size_t)c].data(), s.n, s.k}, xq.data(), xd.data(),
                               xq2.data(), y.data(), g.stream.get());
            };
            for (int i = 0; i < copies; ++i) run(i);  // warm-up (and a full pass over the copies)
            e0.record(g.stream.get());
            for (int i = 0; i < iters; ++i) run(i);
            e1.record(g.stream.get());
            e1.sync();
            const double us = Event::elapsed_ms(e0, e1) * 1e3 / iters;
            rows.push_back({shape, k.variant.name, us, bytes / (us * 1e-6) / 1e9});
          }
      g.stream.sync("bench " + shape);
    }
  }

  const double peak = peak_gbps();
  std::string out = fmt::format(
      "## Decode GEMV bandwidth ({}, sm_{}, {} SMs)\n\ndevice-to-device copy measured now: {:.0f} GB/s; reference peak "
      "{:.0f} GB/s\n\n| shape | kernel | us | GB/s | % of {:.0f} | % of copy |\n|---|---|---|---|---|---|\n",
      g.info.name, g.info.sm, g.info.sms, copy, peak, peak);
  std::map<std::string, const Row*> best;
  for (const Row& r : rows) {
    out += fmt::format("| {} | {} | {:.2f} | {:.0f} | {:.1f} | {:.1f} |\n", r.shape, r.what, r.us, r.gbps,
                       100.0 * r.gbps / peak, 100.0 * r.gbps / copy);
    if (r.what.rfind("gemv", 0) == 0 && (!best[r.shape] || r.gbps > best[r.shape]->gbps)) best[r.shape] = &r;
  }
  out += "\n### Best GEMV tiling per shape\n\n| shape | kernel | us | GB/s | % of peak |\n|---|---|---|---|---|\n";
  for (const auto& [shape, r] : best)
    out += fmt::format("| {} | {} | {:.2f} | {:.0f} | {:.1f} |\n", shape, r->what, r->us, r->gbps, 100.0 * r->gbps / peak);
  std::printf("%s\n", out.c_str());
  if (const char* path = std::getenv("QRIG_BENCH_OUT"))
    if (FILE* f = std::fopen(path, "w")) {
      std::fputs(out.c_str(), f);
      std::fclose(f);
    }
  CHECK(!best.empty());
}
