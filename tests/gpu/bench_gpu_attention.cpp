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

namespace {

// Decode (T = 1 at pos0) over caches of the pair kv: GB/s = the K and V row bytes the call must read
// ((pos0 + 1) x kv_row_bytes of each) over time; rows are 4096 rows quantized by the CPU reference, repeated; calls
// cycle through copies (>= 1 GiB) as above. int8: the plans' int8 query over quantized keys (attn_decode_dp4a);
// false: the fp32 query (attn_decode, --precise plans).
Row bench_kv_decode(const char* dims_name, const AttentionDims& d, int64_t pos0, kernels::KvPair kv, bool int8 = true) {
  Gpu& g = Gpu::get();
  const int64_t ctx = pos0 + 1, width = d.Hkv * d.hd, qrow = d.Hq * d.hd;
  const int64_t kr = kernels::kv_row_bytes(kv.k, width, false), vr = kernels::kv_row_bytes(kv.v, width, false);
  const size_t kbytes = (size_t)(ctx * kr), vbytes = (size_t)(ctx * vr);
  const int copies = (int)std::max<size_t>(1, ((size_t)1 << 30) / (kbytes + vbytes) + 1);
  auto fill = [&](kernels::KvFormat f, int64_t rb, size_t bytes, uint64_t seed) {
    const int64_t rows = std::min<int64_t>(4096, ctx);
    std::vector<uint8_t> h((size_t)(rows * rb));
    const std::vector<float> x = randn((size_t)(rows * width), seed);
    for (int64_t p = 0; p < rows; ++p) {
      if (f == kernels::KvFormat::f16) {
        for (int64_t i = 0; i < width; ++i) {
          const uint16_t v = gguf::float_to_fp16(x[(size_t)(p * width + i)]);
          std::memcpy(h.data() + p * rb + 2 * i, &v, 2);
        }
      } else {
        cpu::kv_quantize_row(f, x.data() + p * width, width, 3, h.data() + p * rb);
      }
    }
    DeviceBuffer<uint8_t> b(0, bytes * copies, "cache copies");
    b.upload(h);
    for (size_t done = h.size(); done < bytes * copies; done += std::min(done, bytes * copies - done))
      copy_on_device(b.data() + done, b.data(), std::min(done, bytes * copies - done), g.stream.get(), "cache fill");
    return b;
  };
  DeviceBuffer<uint8_t> kc = fill(kv.k, kr, kbytes, 21), vc = fill(kv.v, vr, vbytes, 22);
  DeviceBuffer<float> q(0, (size_t)qrow, "q"), qg(0, (size_t)(2 * qrow), "q|gate"), out(0, (size_t)qrow, "out");
  q.upload(randn(q.size(), 12));
  qg.upload(randn(qg.size(), 13));
  const kernels::AttentionChoice c =
      kernels::choose_attention(d, ctx, 1, g.info.sms, kernels::default_tuning(90), kv, int8);
  const AttentionKernels ak([&g](const Variant& v) { return g.load(v); }, d, ctx, c.ctas, launch_ranges(c.ranges), kv, 3);
  DeviceBuffer<char> ws(0, (size_t)std::max<int64_t>(256, attention_workspace_bytes(d, c.ctas, ctx, 1)), "workspace");
  auto call = [&](int i) {
    ak.run(q.data(), kc.data() + (size_t)(i % copies) * kbytes, vc.data() + (size_t)(i % copies) * vbytes, 1, pos0,
           0.0625f, qg.data() + d.hd, 2 * qrow, 2 * d.hd, out.data(), ws.data(), g.stream.get());
  };
  for (int i = 0; i < std::max(copies, 3); ++i) call(i);
  const int iters = std::max(copies, 100);
  Event e0(0), e1(0);
  e0.record(g.stream.get());
  for (int i = 0; i < iters; ++i) call(i);
  e1.record(g.stream.get());
  e1.sync();
  Row res;
  res.dims = dims_name;
  res.what = fmt::format("decode {} pos0={}", kernels::kv_pair_name(kv), pos0);
  res.kernel = c.ranges[0].parts[0][0].name;
  res.us = Event::elapsed_ms(e0, e1) * 1e3 / iters;
  res.rate = (double)(kbytes + vbytes) / (res.us * 1e-6) / 1e9;
  res.unit = "GB/s";
  return res;
}

}  // namespace

// Issue 23's targets: decode at 32K with k8v3 >= 0.9x k16v16 (here the attention call alone; qrig bench gives the
// model's), and at 256K the kernels read the quantized cache at >= 70% of the copy bandwidth ($QRIG_PEAK_GBPS).
// The plans' kernels (attn_decode_dp4a over quantized keys), then three pairs at 256K with the fp32-query
// attn_decode for comparison (issue 19 measured it at 15-29% there).
TEST_CASE("attention decode bandwidth over quantized caches to 256K keys (9B, 27B)", "[.bench][kv]") {
  Gpu& g = Gpu::get();
  const AttentionDims d9{16, 4, 256}, d27{24, 4, 256};
  std::vector<Row> rows;
  for (const char* p : {"k16v16", "k8v8", "k8v4", "k8v3", "k4v4", "k3v3"})
    for (int64_t pos0 : {32767, 131071, 262143}) rows.push_back(bench_kv_decode("9B", d9, pos0, *kernels::parse_kv_pair(p)));
  for (const char* p : {"k16v16", "k8v3"}) rows.push_back(bench_kv_decode("27B", d27, 131071, *kernels::parse_kv_pair(p)));
  for (const char* p : {"k8v8", "k8v3", "k3v3"})
    rows.push_back(bench_kv_decode("9B", d9, 262143, *kernels::parse_kv_pair(p), false));
  g.stream.sync("kv attention bench");
  std::string out = fmt::format(
      "## Attention decode over quantized caches ({}, sm_{}, {} SMs)\n\nGB/s of the K and V rows read (as stored) "
      "against the reference peak {:.0f} GB/s.\n\n| dims | call | kernel | us | GB/s | of peak |\n|---|---|---|---|---|---|\n",
      g.info.name, g.info.sm, g.info.sms, peak_gbps());
  for (const Row& r : rows)
    out += fmt::format("| {} | {} | {} | {:.1f} | {:.0f} | {:.0f}% |\n", r.dims, r.what, r.kernel, r.us, r.rate,
                       100.0 * r.rate / peak_gbps());
  std::printf("%s\n", out.c_str());
  if (const char* path = std::getenv("QRIG_BENCH_KV_OUT"))
    if (FILE* f = std::fopen(path, "w")) {
      std::fputs(out.c_str(), f);
      std::fclose(f);
    }
  CHECK(rows.size() == 23);
}
