// Micro-benchmark of AttentionKernels::run, the call the executor makes per attention layer (hidden: run with
// `qrig_tests_gpu "[bench]"`), at 9B dims (Hq 16, Hkv 4, hd 256; 8 attention layers) and 27B (Hq 24):
//   decode, T = 1 at pos0 = 512, 4096, 32768: memory bound. GB/s = K + V bytes the call must read
//     ((pos0 + 1) x Hkv x hd x 2 x 2) over time, against the H200's ~4.3 TB/s ($QRIG_PEAK_GBPS overrides);
//     calls cycle through enough cache copies (>= 1 GiB) that the 50 MB L2 cannot serve them.
//   prefill, T = 512 at pos0 = 0 and 32768 - 512: compute bound. TFLOP/s = 4 x hd x Hq x (keys each query
//     attends, causal) over time; both P.V families (h0 fp32, the default; h1 HFMA2) through the loader.
// Time per call with CUDA events over back-to-back calls after a warm-up. The markdown table goes to stdout
// and, when set, to $QRIG_BENCH_ATTN_OUT.
#include <catch2/catch.hpp>

#include "runtime/cuda/attention.h"
#include "tests/gpu/gpu_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::cuda::gputest;

namespace {

double peak_gbps() {
  if (const char* p = std::getenv("QRIG_PEAK_GBPS")) return std::atof(p);
  return 4300.0;
}

KernelLoader loader(int64_t half) {
  return [half](const Variant& v) {
    Gpu& g = Gpu::get();
    if (v.kernel != "attn_prefill") return g.load(v);
    return g.load(make_variant("attn_prefill", {{"d", v.param("d")}, {"g", v.param("g")}, {"h", half}, {"k", v.param("k")}, {"v", v.param("v")}, {"t", v.threads()}}));
  };
}

struct Row {
  std::string dims, what, kernel;
  double us, rate;
  const char* unit;
};

// One timed configuration: T tokens at pos0 with `copies` caches of `ctx` rows laid out one after another.
Row bench_one(const char* dims_name, const AttentionDims& d, int64_t T, int64_t pos0, int64_t half) {
  Gpu& g = Gpu::get();
  const int64_t ctx = pos0 + T, row = d.Hkv * d.hd, qrow = d.Hq * d.hd;
  const size_t cache_elems = (size_t)(ctx * row);
  const bool decode = T <= std::max<int64_t>(1, 8 / (d.Hq / d.Hkv));
  const int copies = decode ? (int)std::max<size_t>(1, ((size_t)1 << 30) / (4 * cache_elems) + 1) : 1;
  // One random cache, replicated on the device (the values do not change the work).
  std::vector<uint16_t> h((size_t)std::min<size_t>(cache_elems, (size_t)1 << 24));
  const std::vector<float> r = randn(h.size(), 11);
  for (size_t i = 0; i < h.size(); ++i) h[i] = gguf::float_to_fp16(r[i]);
  DeviceBuffer<uint16_t> kc(0, cache_elems * copies, "kcache copies"), vc(0, cache_elems * copies, "vcache copies");
  kc.upload(h);
  vc.upload(h);
  for (size_t done = h.size(); done < cache_elems * copies; done += std::min(done, cache_elems * copies - done)) {
    const size_t n = std::min(done, cache_elems * copies - done);
    copy_on_device(kc.data() + done, kc.data(), n * 2, g.stream.get(), "cache fill");
    copy_on_device(vc.data() + done, vc.data(), n * 2, g.stream.get(), "cache fill");
  }
  DeviceBuffer<float> q(0, (size_t)(T * qrow), "q"), qg(0, (size_t)(T * 2 * qrow), "q|gate"), out(0, (size_t)(T * qrow), "out");
  q.upload(randn(q.size(), 12));
  qg.upload(randn(qg.size(), 13));
  const AttentionKernels ak = attention_kernels(loader(half), d, ctx, g.info.sms, std::max<int64_t>(T, 4096));
  const int64_t ws_bytes = attention_workspace_bytes(d, attention_choice(d, ctx, g.info.sms).ctas, ctx, T);
  DeviceBuffer<char> ws(0, (size_t)std::max<int64_t>(256, ws_bytes), "workspace");
  auto call = [&](int i) {
    const size_t off = (size_t)(i % copies) * cache_elems;
    ak.run(q.data(), kc.data() + off, vc.data() + off, T, pos0, 0.0625f, qg.data() + d.hd, 2 * qrow, 2 * d.hd,
           out.data(), ws.data(), g.stream.get());
  };
  for (int i = 0; i < std::max(copies, 3); ++i) call(i);  // warm-up
  const int iters = decode ? std::max(copies, 200) : 10;
  Event e0(0), e1(0);
  e0.record(g.stream.get());
  for (int i = 0; i < iters; ++i) call(i);
  e1.record(g.stream.get());
  e1.sync();
  const double us = Event::elapsed_ms(e0, e1) * 1e3 / iters;
  Row res;
  res.dims = dims_name;
  res.what = fmt::format("{} T={} pos0={}", decode ? "decode" : "prefill", T, pos0);
  res.kernel = decode ? "attn_decode (+ attn_merge)" : fmt::format("attn_prefill h{} (+ attn_merge)", half);
  res.us = us;
  if (decode) {
    res.rate = (double)ctx * row * 2 * 2 / (us * 1e-6) / 1e9;
    res.unit = "GB/s";
  } else {
    const double keys = (double)T * pos0 + (double)T * (T + 1) / 2;  // sum over t of pos0 + t + 1
    res.rate = 4.0 * d.hd * d.Hq * keys / (us * 1e-6) / 1e12;
    res.unit = "TFLOP/s";
  }
  return res;
}

}  // namespace

TEST_CASE("attention decode bandwidth and prefill FLOP rate at 9B and 27B dims", "[.bench]") {
  Gpu& g = Gpu::get();
  const AttentionDims d9{16, 4, 256}, d27{24, 4, 256};
  std::vector<Row> rows;
  for (int64_t pos0 : {512, 4096, 32768}) rows.push_back(bench_one("9B", d9, 1, pos0, 1));
  rows.push_back(bench_one("9B", d9, 2, 32768, 1));  // two tokens (speculative decoding)
  rows.push_back(bench_one("27B", d27, 1, 32768, 1));
  for (int64_t half : {0, 1})
    for (int64_t pos0 : {0, 32768 - 512}) rows.push_back(bench_one("9B", d9, 512, pos0, half));
  rows.push_back(bench_one("27B", d27, 512, 32768 - 512, 0));
  rows.push_back(bench_one("9B", d9, 64, 32768 - 64, 0));  // a short chunk at depth (split over keys)
  g.stream.sync("attention bench");

  std::string out = fmt::format(
      "## Attention ({}, sm_{}, {} SMs)\n\nDecode: GB/s of K+V the call reads (reference peak {:.0f} GB/s). Prefill: "
      "TFLOP/s counting 4 x hd x Hq x (causal keys per query), summed over queries.\n\n"
      "| dims | call | kernels | us | rate | unit | ms per 8 layers |\n|---|---|---|---|---|---|---|\n",
      g.info.name, g.info.sm, g.info.sms, peak_gbps());
  for (const Row& r : rows)
    out += fmt::format("| {} | {} | {} | {:.1f} | {:.1f} | {} | {:.3f} |\n", r.dims, r.what, r.kernel, r.us, r.rate,
                       r.unit, 8 * r.us / 1e3);
  std::printf("%s\n", out.c_str());
  if (const char* path = std::getenv("QRIG_BENCH_ATTN_OUT"))
    if (FILE* f = std::fopen(path, "w")) {
      std::fputs(out.c_str(), f);
      std::fclose(f);
    }
  CHECK(rows.size() == 11);
}
