// `qrig probe` on the GPU machine. The whole probe (every device, link and pair) finishes in under a minute
// without a failed measurement; on device 0 every unit the architecture has is measured, positive and below
// twice its architectural rate (a rate above the table means the table or the operation count is wrong),
// the SM clock under load is within the driver's range, the copy and pinned-link bandwidths are plausible
// (device copy 50..12000 GB/s; host links 0.05..1000 GB/s: a PCIe 1.0 x1 riser to an NVLink-C2C host), and
// on a data-centre card known healthy (A100/H100/H200) no unit is throttled. The [short] case runs every
// benchmark kernel for one iteration (under compute-sanitizer) and compares the FP32 and DP4A results bit
// for bit with the same chains computed on the CPU, and checks every block wrote its clock stamps.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>

#include "runtime/cuda/probe.h"
#include "tests/gpu/gpu_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::cuda::gputest;

namespace {

bool healthy_datacenter_card(const std::string& name) {
  for (const char* n : {"A100", "H100", "H200"})
    if (name.find(n) != std::string::npos) return true;
  return false;
}

// dp4a.s32.s32 d, a, b, c: c + the sum of the four signed byte products, wrapping.
int32_t dp4a_ref(int32_t a, int32_t b, int32_t c) {
  uint32_t acc = (uint32_t)c;
  for (int i = 0; i < 4; ++i) acc += (uint32_t)((int32_t)(int8_t)(a >> (8 * i)) * (int32_t)(int8_t)(b >> (8 * i)));
  return (int32_t)acc;
}

}  // namespace

TEST_CASE("qrig probe: every measurement plausible, under a minute", "[gpu]") {
  Gpu::get();  // a clear error when there is no device
  const auto t0 = std::chrono::steady_clock::now();
  const ProbeResult p = probe_rig();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& d : p.devices)
    for (const auto& e : d.errors) FAIL_CHECK("device " << d.index << ": " << e);
  for (const auto& q : p.peers)
    for (const auto& e : q.errors) FAIL_CHECK("devices " << q.a << "," << q.b << ": " << e);
  CHECK(p.ok());
  CHECK(seconds < 60.0);
  report("probe (all devices and links)", fmt::format("{} device(s)", p.devices.size()), "seconds", seconds, 60.0);
  REQUIRE(!p.devices.empty());

  const DeviceProbe& d = p.devices[0];
  INFO(d.name << " sm_" << d.sm << ", " << d.sms << " SMs, " << d.sm_clock_mhz << " MHz");
  std::string notes;
  for (const auto& n : d.notes) notes += "\nnote: " + n;
  INFO("notes:" << notes);
  CHECK(!d.name.empty());
  CHECK(d.sm >= 70);
  CHECK(d.sms > 0);
  CHECK(d.sm_clock_mhz > 100);
  CHECK(d.mem_clock_mhz > 100);
  CHECK(d.sm_clock_load_mhz > 0.2 * d.sm_clock_mhz);
  CHECK(d.sm_clock_load_mhz < 1.15 * d.sm_clock_mhz);
  report("probe SM clock under load", d.name, "MHz / peak MHz", d.sm_clock_load_mhz / d.sm_clock_mhz, 1.15);
  const bool units_runnable = !choose_arch(d.sm).substituted();
  for (Unit u : kUnits) {
    const UnitRate& r = d.unit(u);
    INFO(unit_name(u) << " " << r.opcode << ": " << r.tops << " T/s, " << r.ops_per_clk_per_sm
                      << " ops/clk/SM, expected " << r.expected_ops_per_clk_per_sm << ", " << verdict_name(r.verdict));
    if (!unit_kernel(u, d.sm)) {
      CHECK(r.verdict == Verdict::absent);
      CHECK(!r.measured);
      continue;
    }
    if (!units_runnable) continue;  // a CUDA 13 build on an sm_70 card: noted, not measured
    CHECK(r.measured);
    CHECK(r.tops > 0);
    CHECK(r.ops_per_clk_per_sm > 0);
    if (r.expected_ops_per_clk_per_sm > 0) {
      CHECK(r.ratio > 0);
      CHECK(r.ratio < 2.0);
      report(fmt::format("probe {} ({:.1f} T/s)", unit_name(u), r.tops), d.name, "measured / architectural rate",
             r.ratio, 2.0);
    }
    if (healthy_datacenter_card(d.name)) CHECK(r.verdict == Verdict::ok);
  }
  DeviceProbe again = d;
  apply_verdicts(again);
  CHECK(again.tensor_cores_throttled == d.tensor_cores_throttled);
  if (healthy_datacenter_card(d.name)) CHECK(!d.tensor_cores_throttled);

  CHECK(d.copy_gbps > 50);
  CHECK(d.copy_gbps < 12000);
  CHECK(d.h2d_gbps > 0.05);
  CHECK(d.h2d_gbps < 1000);
  CHECK(d.d2h_gbps > 0.05);
  CHECK(d.d2h_gbps < 1000);
  report("probe device copy (read + written)", d.name, "GB/s", d.copy_gbps, 12000);
  report("probe pinned host -> device", d.name, "GB/s", d.h2d_gbps, 1000);
  report("probe pinned device -> host", d.name, "GB/s", d.d2h_gbps, 1000);
  for (const auto& q : p.peers) {
    INFO("devices " << q.a << " <-> " << q.b);
    if (q.a_to_b) CHECK(q.a_to_b_gbps > 0.05);
    if (q.b_to_a) CHECK(q.b_to_a_gbps > 0.05);
    if (!q.a_to_b) CHECK(q.a_to_b_gbps == 0);
    if (!q.b_to_a) CHECK(q.b_to_a_gbps == 0);
  }
}

TEST_CASE("probe kernels: one iteration each, results and stamps written", "[gpu][short]") {
  Gpu& g = Gpu::get();
  if (choose_arch(g.info.sm).substituted()) {
    WARN("this NVRTC cannot emit sm_" << g.info.sm << " code: the probe kernels cannot run here");
    return;
  }
  const ProbeBuild b = compile_probe_units(g.info.sm);
  Library lib(b.out.cubin, "probe_units");
  const int blocks = g.info.sms * kProbeBlocksPerSm;
  const size_t threads = (size_t)blocks * kProbeThreads;
  for (Unit u : kUnits) {
    const auto uk = unit_kernel(u, g.info.sm);
    if (!uk) continue;
    INFO(unit_name(u));
    const Kernel k = lib.kernel(uk->entry, kProbeThreads);
    DeviceBuffer<uint32_t> out(0, threads, "probe out");
    DeviceBuffer<unsigned long long> stamps(0, (size_t)blocks * 4, "probe stamps");
    out.fill_bytes(0xFF);
    stamps.fill_bytes(0);
    const float m = 0.9999f, a = 1e-4f;
    const int b_dp4a = (int)0x01FE037Fu;
    const Dim3 grid((unsigned)blocks), block(kProbeThreads);
    void* o = out.data();
    unsigned long long* t = stamps.data();
    switch (u) {
      case Unit::fp32_fma: k.launch(grid, block, 0, g.stream.get(), o, t, 1, m, a); break;
      case Unit::hfma2: k.launch(grid, block, 0, g.stream.get(), o, t, 1, 0x3BFF3BFFu, 0x14001400u); break;
      case Unit::dp4a: k.launch(grid, block, 0, g.stream.get(), o, t, 1, b_dp4a); break;
      case Unit::hmma: k.launch(grid, block, 0, g.stream.get(), o, t, 1, 0x1C001C00u, 0x1C001C00u); break;
      case Unit::imma: k.launch(grid, block, 0, g.stream.get(), o, t, 1, (int)0x01010101u, (int)0x01FF01FFu); break;
    }
    g.stream.sync("probe kernel");
    const std::vector<uint32_t> v = out.download();
    const std::vector<unsigned long long> s = stamps.download();
    int64_t bad_stamps = 0;
    for (int i = 0; i < blocks; ++i)
      bad_stamps += !(s[4 * i + 1] > s[4 * i] && s[4 * i + 3] >= s[4 * i + 2] && s[4 * i + 2] > 0);
    CHECK(bad_stamps == 0);
    if (u == Unit::fp32_fma || u == Unit::dp4a) {
      int64_t mismatches = 0;
      for (size_t i = 0; i < threads; ++i) {
        const uint32_t tid = (uint32_t)(i % kProbeThreads);
        uint32_t expect = 0;
        if (u == Unit::fp32_fma) {
          float sum = 0.0f;
          for (int c = 0; c < kProbeChains; ++c) {
            float x = (float)(tid + (uint32_t)c) * 1e-3f;
            for (int step = 0; step < kProbeUnroll; ++step) x = std::fmaf(x, m, a);
            sum += x;
          }
          std::memcpy(&expect, &sum, 4);
        } else {
          int32_t x_or = 0;
          for (int c = 0; c < kProbeChains; ++c) {
            int32_t x = (int32_t)(tid * 0x01010101u) + c;
            for (int step = 0; step < kProbeUnroll; ++step) x = dp4a_ref(x, b_dp4a, x);
            x_or ^= x;
          }
          expect = (uint32_t)x_or;
        }
        mismatches += v[i] != expect;
      }
      CHECK(mismatches == 0);
      report(fmt::format("probe kernel {} (1 iteration)", uk->entry), fmt::format("{} threads", threads),
             "results differing from the CPU", (double)mismatches, -1);
    }
  }
}
