// Micro-benchmark of the Gated DeltaNet kernels (hidden: run with `qrig_tests_gpu "[bench]"`): GdnKernels::run,
// the call the executor makes per GDN layer, at 9B dims (Hk 16, Hv 32, head dims 128; 24 GDN layers) and 27B
// (Hv 48; 48 layers). Recurrent path for T = 1 (decode) .. 128, cycling through enough state copies
// (>= 128 MiB) that the L2 cannot serve them, as in a decode step where each layer's state is read once;
// GB/s = state bytes read + written over time. Chunked path (gdn_chunk_prep + gdn_chunk_scan) for
// T = 16 .. 4096; where it overtakes the recurrent path is the plan's gdn_recurrent_below. Time per call with
// CUDA events over back-to-back calls (no CUDA graph: small T includes the launch cost). At 9B it also sweeps
// tilings (recurrent columns per warp and block size; scan column tile and block size), handing GdnKernels
// other variants of the same dims through its loader; the first row of each group is the default.
// The markdown table goes to stdout and, when set, to $QRIG_BENCH_GDN_OUT.
#include <catch2/catch.hpp>

#include "runtime/cuda/gdn.h"
#include "tests/gpu/gpu_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::cuda::gputest;

namespace {

struct Tiling {
  int64_t a, t;  // recurrent: cw, t; scan: ct, t
};

// A loader that swaps in a recurrent or scan tiling (a = 0: the default).
KernelLoader loader_with(const GdnDims& d, int64_t chunk, Tiling rec, Tiling scan) {
  return [=](const Variant& v) {
    Gpu& g = Gpu::get();
    if (v.kernel == "gdn_recurrent" && rec.a)
      return g.load(make_variant("gdn_recurrent", {{"dk", d.dk}, {"dv", d.dv}, {"cw", rec.a}, {"b", 0}, {"t", rec.t}}));
    if (v.kernel == "gdn_chunk_scan" && scan.a)
      return g.load(make_variant("gdn_chunk_scan",
                                 {{"dk", d.dk}, {"dv", d.dv}, {"c", chunk}, {"ct", scan.a}, {"t", scan.t}}));
    return g.load(v);
  };
}

struct Row {
  std::string dims, path;
  int64_t T;
  std::string variant;
  double us, gbps;
};

}  // namespace

TEST_CASE("gdn time per call at 9B and 27B dims", "[.bench][gdn]") {
  Gpu& g = Gpu::get();
  const int64_t chunk = 64, max_t = 4096;
  std::vector<Row> rows;
  struct Model {
    const char* name;
    GdnDims d;
    bool sweep;
  };
  for (const Model& m : {Model{"9B", {16, 32, 128, 128}, true}, Model{"27B", {16, 48, 128, 128}, false}}) {
    const GdnDims& d = m.d;
    const int64_t conv = 2 * d.Hk * d.dk + d.Hv * d.dv;
    std::vector<float> mixed = randn((size_t)(max_t * conv), 11);
    for (float& x : mixed) x = x / (1.0f + std::exp(-x));
    std::vector<float> ssm_a = randn((size_t)d.Hv, 14, 0.0f, 0.5f);
    for (float& a : ssm_a) a = -std::exp(a);
    DeviceBuffer<float> dmixed(0, mixed.size(), "mixed"), dalpha(0, (size_t)(max_t * d.Hv), "alpha"),
        dbeta(0, (size_t)(max_t * d.Hv), "beta"), dssm_a(0, (size_t)d.Hv, "ssm_a"), ddt(0, (size_t)d.Hv, "dt_bias"),
        out(0, (size_t)(max_t * d.Hv * d.dv), "out");
    dmixed.upload(mixed);
    dalpha.upload(randn((size_t)(max_t * d.Hv), 12));
    dbeta.upload(randn((size_t)(max_t * d.Hv), 13));
    dssm_a.upload(ssm_a);
    ddt.upload(randn((size_t)d.Hv, 15, 0.0f, 0.5f));
    const size_t state_floats = (size_t)(d.Hv * d.dk * d.dv);
    const int copies = (int)std::max<size_t>(2, ((size_t)128 << 20) / (state_floats * 4) + 1);
    std::vector<DeviceBuffer<float>> states;
    const std::vector<float> s0 = randn(state_floats, 16, 0.0f, 0.3f);
    for (int c = 0; c < copies; ++c) {
      states.emplace_back(0, state_floats, "state copy");
      states.back().upload(s0);
    }

    auto time_calls = [&](const GdnKernels& k, int64_t T, bool recurrent, void* ws) {
      const int iters = recurrent ? std::max(copies, 400) : (T >= 1024 ? 20 : 100);
      auto call = [&](int i) {
        k.run(dmixed.data(), dalpha.data(), dbeta.data(), dssm_a.data(), ddt.data(), T,
              states[(size_t)(i % copies)].data(), out.data(), ws, g.stream.get());
      };
      for (int i = 0; i < std::min(copies, 8); ++i) call(i);
      Event e0(0), e1(0);
      e0.record(g.stream.get());
      for (int i = 0; i < iters; ++i) call(i);
      e1.record(g.stream.get());
      e1.sync();
      return Event::elapsed_ms(e0, e1) * 1e3 / iters;
    };

    std::vector<Tiling> rec_tilings = {{0, 0}}, scan_tilings = {{0, 0}};
    if (m.sweep) {
      rec_tilings.insert(rec_tilings.end(), {{8, 64}, {8, 256}, {4, 128}, {16, 128}});
      scan_tilings.insert(scan_tilings.end(), {{16, 128}, {8, 128}, {8, 64}});
    }
    for (const Tiling& rt : rec_tilings) {
      // Every length on the recurrent kernel (a recurrent_below above them all).
      const GdnKernels k = gdn_kernels(loader_with(d, chunk, rt, {0, 0}), d, chunk, max_t, max_t + 1);
      const std::string name = rt.a ? fmt::format("gdn_recurrent cw{} t{}", rt.a, rt.t)
                                    : gdn_variants(d, chunk)[0].name + " (default)";
      const std::vector<int64_t> lengths =
          rt.a ? std::vector<int64_t>{1, 16} : std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128};
      for (int64_t T : lengths) {
        const double us = time_calls(k, T, true, nullptr);
        rows.push_back({m.name, "recurrent", T, name, us, 2.0 * state_floats * 4 / (us * 1e-6) / 1e9});
      }
    }
    for (const Tiling& st : scan_tilings) {
      // Every length on the chunked pair (recurrent_below 1).
      const GdnKernels k = gdn_kernels(loader_with(d, chunk, {0, 0}, st), d, chunk, max_t, 1);
      DeviceBuffer<char> ws(0, (size_t)gdn_workspace_bytes(d, chunk, max_t), "gdn workspace");
      const std::string name = st.a ? fmt::format("prep + gdn_chunk_scan ct{} t{}", st.a, st.t)
                                    : gdn_variants(d, chunk)[1].name + " + " + gdn_variants(d, chunk)[2].name + " (default)";
      const std::vector<int64_t> lengths =
          st.a ? std::vector<int64_t>{64, 512, 4096} : std::vector<int64_t>{16, 32, 64, 128, 512, 4096};
      for (int64_t T : lengths) {
        const double us = time_calls(k, T, false, ws.data());
        rows.push_back({m.name, "chunked", T, name, us, 0.0});
      }
    }
    g.stream.sync(std::string("gdn bench ") + m.name);
  }

  std::string out = fmt::format(
      "## Gated DeltaNet time per layer call ({}, sm_{}, {} SMs)\n\nRecurrent: state cycled over >= 128 MiB of "
      "copies; GB/s = state read + written per call. Chunked: prep + scan, chunk 64.\n\n"
      "| dims | path | T | kernels | us per call | us per token | state GB/s |\n|---|---|---|---|---|---|---|\n",
      g.info.name, g.info.sm, g.info.sms);
  for (const Row& r : rows)
    out += fmt::format("| {} | {} | {} | {} | {:.2f} | {:.3f} | {} |\n", r.dims, r.path, r.T, r.variant, r.us,
                       r.us / (double)r.T, r.gbps > 0 ? fmt::format("{:.0f}", r.gbps) : std::string("-"));
  std::printf("%s\n", out.c_str());
  if (const char* path = std::getenv("QRIG_BENCH_GDN_OUT"))
    if (FILE* f = std::fopen(path, "w")) {
      std::fputs(out.c_str(), f);
      std::fclose(f);
    }
  CHECK(!rows.empty());
}
