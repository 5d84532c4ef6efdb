// `qrig probe` without a GPU: the architectural rate table and the benchmark chosen per architecture, the
// verdicts on synthetic measurements (a CMP 100-210 with tensor cores at 1/16 and an H200 from the public
// figures in ../shared/BASELINES.md, single throttled units, the 0.25 boundary, unmeasured units, unknown
// architectures), the rig file `qrig probe -o` writes (parsed back by the compiler's reader), the benchmark
// source compiled by NVRTC for every tensor-core generation (only the expected mma shapes in its PTX, no
// spills, at most 64 registers so 4 blocks of 256 fit an SM), and the error without a GPU.
#include <catch2/catch.hpp>

#include <set>

#include "cli/probe_rig.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/probe.h"
#include "runtime/cuda/ptx_scan.h"

using namespace qrig;
using namespace qrig::cuda;

namespace {

// A device whose measured rates are `tops` (negative: not measured) at `mhz` on `sms` SMs.
DeviceProbe synthetic(int sm, int sms, double mhz, std::array<double, kUnitCount> tops) {
  DeviceProbe d;
  d.name = fmt::format("synthetic sm_{}", sm);
  d.sm = sm;
  d.sms = sms;
  d.sm_clock_mhz = mhz;
  d.total_bytes = 16ll << 30;
  for (Unit u : kUnits) {
    UnitRate& r = d.unit(u);
    r.unit = u;
    if (tops[(size_t)u] < 0) continue;
    r.measured = true;
    r.tops = tops[(size_t)u];
    r.ops_per_clk_per_sm = r.tops * 1e12 / (mhz * 1e6) / sms;
  }
  apply_verdicts(d);
  return d;
}

// A device measured at exactly `fraction` of its architectural rate per clock (negative: not measured).
DeviceProbe at_fraction(int sm, std::array<double, kUnitCount> fraction) {
  DeviceProbe d = synthetic(sm, 100, 1000.0, {-1, -1, -1, -1, -1});
  for (Unit u : kUnits) {
    const double f = fraction[(size_t)u];
    if (f < 0) continue;
    UnitRate& r = d.unit(u);
    r.measured = true;
    r.ops_per_clk_per_sm = f * arch_unit_rate(sm, u).value_or(1000.0);
    r.tops = r.ops_per_clk_per_sm * 100 * 1e9 / 1e12;
  }
  apply_verdicts(d);
  return d;
}

Verdict verdict(const DeviceProbe& d, Unit u) { return d.unit(u).verdict; }

}  // namespace

TEST_CASE("architectural unit rates per compute capability", "[cuda][probe]") {
  CHECK(arch_rate_table_archs() == std::vector<int>{70, 75, 80, 86, 89, 90});
  for (int sm : arch_rate_table_archs()) {
    INFO("sm_" << sm);
    for (Unit u : kUnits) {
      INFO(unit_name(u));
      const std::optional<double> r = arch_unit_rate(sm, u);
      REQUIRE(r.has_value());
      // A unit is absent from the table exactly when the architecture has no instruction to benchmark it.
      CHECK((*r == 0) == !unit_kernel(u, sm).has_value());
    }
    CHECK(*arch_unit_rate(sm, Unit::dp4a) == 512);  // 64 dp4a per clock per SM (63.5 measured on the H200)
    CHECK(*arch_unit_rate(sm, Unit::fp32_fma) == (sm >= 86 ? 256 : 128));
    if (sm >= 75) CHECK(*arch_unit_rate(sm, Unit::imma) == 2 * *arch_unit_rate(sm, Unit::hmma));  // int8 = 2x fp16
  }
  CHECK(*arch_unit_rate(70, Unit::imma) == 0);  // Volta: no int8 mma
  CHECK(*arch_unit_rate(70, Unit::hmma) == 1024);
  CHECK(*arch_unit_rate(90, Unit::hmma) == 4096);
  CHECK(*arch_unit_rate(80, Unit::hfma2) == 512);
  CHECK(*arch_unit_rate(86, Unit::hfma2) == 256);
  for (int sm : {60, 61, 72, 87, 100, 120}) {
    INFO("sm_" << sm);
    for (Unit u : kUnits) CHECK(!arch_unit_rate(sm, u).has_value());
  }

  // The benchmark per architecture: native mma shapes, operations per warp and step.
  CHECK(unit_kernel(Unit::fp32_fma, 70)->ops_per_warp_step == 64);
  CHECK(unit_kernel(Unit::hfma2, 90)->ops_per_warp_step == 128);
  CHECK(unit_kernel(Unit::dp4a, 75)->ops_per_warp_step == 256);
  CHECK(unit_kernel(Unit::hmma, 70)->opcode == "mma.sync.aligned.m8n8k4.row.col.f16.f16.f16.f16");
  CHECK(unit_kernel(Unit::hmma, 70)->ops_per_warp_step == 2048);
  CHECK(unit_kernel(Unit::hmma, 75)->opcode == "mma.sync.aligned.m16n8k8.row.col.f16.f16.f16.f16");
  CHECK(unit_kernel(Unit::hmma, 75)->ops_per_warp_step == 2048);
  CHECK(unit_kernel(Unit::hmma, 90)->opcode == "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16");
  CHECK(unit_kernel(Unit::hmma, 90)->ops_per_warp_step == 4096);
  CHECK(unit_kernel(Unit::imma, 75)->opcode == "mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32");
  CHECK(unit_kernel(Unit::imma, 75)->ops_per_warp_step == 2048);
  CHECK(unit_kernel(Unit::imma, 86)->opcode == "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32");
  CHECK(unit_kernel(Unit::imma, 86)->ops_per_warp_step == 8192);
  CHECK(!unit_kernel(Unit::imma, 70));
  CHECK(!unit_kernel(Unit::hmma, 61));
}

TEST_CASE("verdicts: a CMP 100-210 has throttled tensor cores, an H200 healthy ones", "[cuda][probe]") {
  // CMP 100-210 (public measurements, BASELINES.md): FP32 10, HFMA2 22, DP4A 48, HMMA 6 at 68 SMs x 1.38 GHz.
  const DeviceProbe cmp = synthetic(70, 68, 1380, {10, 22, 48, 6, -1});
  CHECK(verdict(cmp, Unit::fp32_fma) == Verdict::ok);
  CHECK(cmp.unit(Unit::fp32_fma).ratio == Approx(10e12 / (68 * 1.38e9) / 128).epsilon(1e-9));
  CHECK(verdict(cmp, Unit::hfma2) == Verdict::ok);
  CHECK(verdict(cmp, Unit::dp4a) == Verdict::ok);
  CHECK(cmp.unit(Unit::dp4a).ratio == Approx(1.0).epsilon(0.01));
  CHECK(verdict(cmp, Unit::hmma) == Verdict::throttled);
  CHECK(cmp.unit(Unit::hmma).ratio == Approx(1.0 / 16).epsilon(0.02));
  CHECK(cmp.unit(Unit::hmma).expected_ops_per_clk_per_sm == 1024);
  CHECK(verdict(cmp, Unit::imma) == Verdict::absent);
  CHECK(cmp.tensor_cores_throttled);

  // H200 (BASELINES.md): DP4A 133, FP32 64, HFMA2 134; mma.sync reaches about 2/3 of the wgmma peak.
  const DeviceProbe h200 = synthetic(90, 132, 1980, {64, 134, 133, 660, 1300});
  for (Unit u : kUnits) {
    INFO(unit_name(u));
    CHECK(verdict(h200, u) == Verdict::ok);
    CHECK(h200.unit(u).ratio > 0.5);
    CHECK(h200.unit(u).ratio < 1.05);
  }
  CHECK(!h200.tensor_cores_throttled);
}

TEST_CASE("verdicts: single throttled units, the boundary, unmeasured units, unknown architectures", "[cuda][probe]") {
  // IMMA alone throttled: the tensor cores are not healthy.
  const DeviceProbe imma = at_fraction(75, {1, 1, 1, 0.9, 1.0 / 16});
  CHECK(verdict(imma, Unit::hmma) == Verdict::ok);
  CHECK(verdict(imma, Unit::imma) == Verdict::throttled);
  CHECK(imma.tensor_cores_throttled);

  // Threshold: a quarter of the architectural rate is still ok.
  CHECK(verdict(at_fraction(80, {0.25, 1, 1, 1, 1}), Unit::fp32_fma) == Verdict::ok);
  CHECK(verdict(at_fraction(80, {0.2499, 1, 1, 1, 1}), Unit::fp32_fma) == Verdict::throttled);

  // FMA throttled (CMP 170HX-like), tensor cores fine: only the unit is flagged.
  const DeviceProbe fma = at_fraction(80, {1.0 / 8, 1, 1, 0.8, 0.8});
  CHECK(verdict(fma, Unit::fp32_fma) == Verdict::throttled);
  CHECK(!fma.tensor_cores_throttled);
  // DP4A throttled (CMP 30HX-like sm_75).
  CHECK(verdict(at_fraction(75, {1, 1, 1.0 / 25, 1, 1}), Unit::dp4a) == Verdict::throttled);

  // Healthy Volta: HMMA ok and no IMMA to have: healthy.
  const DeviceProbe v100 = at_fraction(70, {1, 1, 1, 0.9, -1});
  CHECK(verdict(v100, Unit::imma) == Verdict::absent);
  CHECK(!v100.tensor_cores_throttled);

  // Not measured is not healthy (the sm_70 cubins of a CUDA 13 build cannot run on the card, for example).
  const DeviceProbe unmeasured = at_fraction(80, {1, 1, 1, -1, 1});
  CHECK(verdict(unmeasured, Unit::hmma) == Verdict::not_measured);
  CHECK(unmeasured.unit(Unit::hmma).ratio == 0);
  CHECK(unmeasured.tensor_cores_throttled);
  const DeviceProbe nothing = at_fraction(70, {-1, -1, -1, -1, -1});
  for (Unit u : {Unit::fp32_fma, Unit::hfma2, Unit::dp4a, Unit::hmma}) CHECK(verdict(nothing, u) == Verdict::not_measured);
  CHECK(nothing.tensor_cores_throttled);

  // An architecture missing from the table: measured, not judged, and never declared healthy.
  const DeviceProbe future = at_fraction(120, {1, 1, 1, 1, 1});
  for (Unit u : kUnits) {
    INFO(unit_name(u));
    CHECK(verdict(future, u) == Verdict::unknown_arch);
    CHECK(future.unit(u).expected_ops_per_clk_per_sm == 0);
    CHECK(future.unit(u).ratio == 0);
  }
  CHECK(future.tensor_cores_throttled);
  // Older than sm_70: no tensor cores at all.
  const DeviceProbe pascal = at_fraction(61, {1, 1, 1, -1, -1});
  CHECK(verdict(pascal, Unit::hmma) == Verdict::absent);
  CHECK(pascal.tensor_cores_throttled);
}

TEST_CASE("the rig file qrig probe writes parses back with every measurement", "[cuda][probe]") {
  ProbeResult p;
  p.seconds = 12.5;
  p.devices.push_back(synthetic(90, 132, 1980, {64.04, 134.4, 133.3, 660, 1300}));
  p.devices.push_back(synthetic(90, 132, 1980, {63.9, 133.9, 133.1, -1, 1290}));  // HMMA not measured
  for (size_t i = 0; i < p.devices.size(); ++i) {
    DeviceProbe& d = p.devices[i];
    d.index = (int)i;
    d.name = "NVIDIA H200";
    d.total_bytes = 150120054784ll;  // 139.81 GiB
    d.copy_gbps = 4312.4;
    d.h2d_gbps = 53.21;
    d.d2h_gbps = 0.2467;
  }
  p.devices[1].notes.push_back("a note");
  PeerProbe q;
  q.a = 0;
  q.b = 1;
  q.a_to_b = q.b_to_a = true;
  q.a_to_b_gbps = 351.2;
  q.b_to_a_gbps = 340.06;
  p.peers.push_back(q);
  PeerProbe none;
  none.a = 0;
  none.b = 1;
  none.a_to_b = true;  // one way only: not p2p
  none.a_to_b_gbps = 20;
  p.peers.push_back(none);

  const std::string text = cli::rig_toml_from_probe(p, "two-h200", "2026-12-01 10:00:00 UTC", "testhost");
  INFO(text);
  CHECK_THAT(text, Catch::StartsWith("# Written by `qrig probe` on 2026-12-01 10:00:00 UTC (host testhost, 12.5 s)"));
  CHECK_THAT(text, Catch::Contains("# device 0 NVIDIA H200 (sm_90): FP32 FMA 0.96, HFMA2 1.00, DP4A 1.00"));
  CHECK_THAT(text, Catch::Contains("tensor cores healthy"));
  CHECK_THAT(text, Catch::Contains("HMMA not measured"));
  CHECK_THAT(text, Catch::Contains("#   note: a note"));
  const compiler::Rig rig = compiler::Rig::parse(text, "probe.toml");
  CHECK(rig.name == "two-h200");
  REQUIRE(rig.devices.size() == 2);
  const compiler::RigDevice& d0 = rig.devices[0];
  CHECK(d0.kind == "cuda");
  CHECK(d0.name == "NVIDIA H200");
  CHECK(d0.arch == "sm_90");
  CHECK(d0.sms == 132);
  CHECK(d0.memory_gib == Approx(140.0));  // 3 significant digits
  CHECK(d0.clock_mhz == 1980);
  CHECK(d0.mem_bw_gbps == 4310);
  CHECK(d0.fp32_tflops == Approx(64.0));
  CHECK(d0.hfma2_tflops == Approx(134.0));
  CHECK(d0.dp4a_tops == Approx(133.0));
  CHECK(d0.hmma_tflops == Approx(660.0));
  CHECK(d0.imma_tops == Approx(1300.0));
  CHECK(!d0.tensor_cores_throttled);
  CHECK(rig.devices[1].hmma_tflops == 0);  // not measured -> 0
  CHECK(rig.devices[1].imma_tops == Approx(1290.0));
  CHECK(rig.devices[1].tensor_cores_throttled);
  REQUIRE(rig.links.size() == 4);
  for (int i = 0; i < 2; ++i) {
    const compiler::RigLink& l = rig.links[(size_t)i];
    CHECK(l.from == "host");
    CHECK(l.to == std::to_string(i));
    CHECK(l.h2d_gbps == Approx(53.2));
    CHECK(l.d2h_gbps == Approx(0.247));
    CHECK(!l.p2p);
  }
  CHECK(rig.links[2].from == "0");
  CHECK(rig.links[2].to == "1");
  CHECK(rig.links[2].p2p);
  CHECK(rig.links[2].p2p_gbps == Approx(340.0));  // the slower direction
  CHECK(!rig.links[3].p2p);
  CHECK(rig.links[3].p2p_gbps == 0);
  // The compiler's own writer reproduces what it read.
  CHECK(compiler::Rig::parse(rig.to_toml(), "again").to_toml() == rig.to_toml());

  // A CMP-like device: the verdict reaches the rig and the comment says why.
  ProbeResult cmp;
  cmp.devices.push_back(synthetic(70, 68, 1380, {10, 22, 48, 6, -1}));
  cmp.devices[0].name = "NVIDIA CMP 100-210";
  cmp.devices[0].copy_gbps = 790;
  const std::string ctext = cli::rig_toml_from_probe(cmp, "cmp", "now", "rig");
  CHECK_THAT(ctext, Catch::Contains("HMMA 0.062 THROTTLED, IMMA absent; tensor cores not healthy"));
  const compiler::Rig crig = compiler::Rig::parse(ctext, "cmp.toml");
  REQUIRE(crig.devices.size() == 1);
  CHECK(crig.devices[0].arch == "sm_70");
  CHECK(crig.devices[0].tensor_cores_throttled);
  CHECK(crig.devices[0].hmma_tflops == Approx(6.0));
  CHECK(crig.devices[0].imma_tops == 0);
}

TEST_CASE("templates/probe_units.cu compiles with NVRTC for each tensor-core generation", "[cuda][probe]") {
  for (int sm : {70, 75, 80, 90}) {
    INFO("QRIG_SM=" << sm);
    const ProbeBuild b = compile_probe_units(sm);
    CHECK(b.arch.feature_sm == sm);
    CHECK(b.arch.target_sm == choose_arch(sm).target_sm);
    CHECK(cubin_sm(b.out.cubin) == b.arch.target_sm);
    INFO(b.out.log);
    std::set<std::string> expected, tensor_opcodes;
    for (Unit u : kUnits)
      if (auto k = unit_kernel(u, sm)) {
        expected.insert(k->entry);
        CHECK(b.out.ptx.find(k->opcode) != std::string::npos);
        if (is_tensor_unit(u)) tensor_opcodes.insert(k->opcode);
      }
    CHECK(expected.size() == (sm >= 75 ? 5u : 4u));
    std::set<std::string> entries;
    for (const PtxEntry& e : ptx_entries(b.out.ptx)) {
      entries.insert(e.name);
      CHECK(e.maxntid == kProbeThreads);
    }
    CHECK(entries == expected);
    const PtxasReport r = parse_ptxas_report(b.out.log);
    CHECK(r.registers > 0);
    CHECK(r.registers <= 65536 / (kProbeThreads * kProbeBlocksPerSm));  // 4 blocks of 256 per SM
    CHECK(r.spill_store_bytes == 0);
    CHECK(r.spill_load_bytes == 0);
    // The only instructions newer than plain sm_70 material are the benchmarked mma shapes (for QRIG_SM=70:
    // only Volta's m8n8k4, no int8 mma).
    std::set<std::string> found;
    for (const PtxFinding& f : scan_ptx_newer_than_sm70(b.out.ptx)) {
      INFO("line " << f.line << ": " << f.instruction);
      CHECK(tensor_opcodes.count(f.instruction) == 1);
      found.insert(f.instruction);
    }
    CHECK(found == tensor_opcodes);
  }
  if (choose_arch(70).substituted()) CHECK(compile_probe_units(70).arch.target_sm == 75);
}

TEST_CASE("without a GPU the probe fails with a clear error", "[cuda][probe]") {
  std::string why;
  if (device_count(&why) > 0) {
    WARN("a CUDA device is present: the no-GPU error path is not exercised here");
    return;
  }
  CHECK_THROWS_WITH(probe_rig(), Catch::Contains("no CUDA device to probe: " + why));
  CHECK_THROWS_AS(probe_device(0), CudaError);
}
