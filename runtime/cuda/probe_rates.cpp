// The probe's judgement, without a GPU: architectural unit rates per compute capability, the benchmark of each
// unit per architecture, and the verdicts (see probe.h).
//
// Rates in operations per clock per SM (a multiply-add = 2 ops; HFMA2 = 2 fp16 multiply-adds; DP4A = 4
// int8 multiply-adds; HMMA with fp16 accumulation, IMMA int8 with s32 accumulation, dense):
//
//   sm  | FP32 FMA | HFMA2 | DP4A | HMMA | IMMA | e.g.
//   70  |   128    |  256  | 512  | 1024 |    0 | V100, CMP 100-210 (no int8 mma on Volta)
//   75  |   128    |  256  | 512  | 1024 | 2048 | T4, RTX 2080 Ti
//   80  |   128    |  512  | 512  | 2048 | 4096 | A100
//   86  |   256    |  256  | 512  | 1024 | 2048 | RTX 3090, A40
//   89  |   256    |  256  | 512  | 1024 | 2048 | RTX 4090, L40
//   90  |   256    |  512  | 512  | 4096 | 8192 | H100, H200
//
// Sources:
// - FP32 and fp16 (non-tensor) results per clock per SM: CUDA C++ Programming Guide, "Throughput of Native
//   Arithmetic Instructions" (7.x: 64 fp32 and 128 fp16 results; 8.0: 64 and 256; 8.6/8.9: 128 fp32) and
//   the GPU whitepapers' peak tables: A100 78 TFLOP/s fp16 vs 19.5 fp32 (4:1); H100 SXM5 ~134 vs ~67 (2:1,
//   ../shared/BASELINES.md: HFMA2 ~134 TFLOP/s on the H200); GA102/AD102 fp16 = fp32 (RTX 3090 35.6 TFLOP/s
//   both; Accel-Sim's microbenchmarks measure 128 fp16 FMA/clk/SM on an RTX 3090, 64 int32 on A100 and 3090).
// - DP4A: issued at the 32-bit IMAD rate, 64 per clock per SM on every architecture here; measured 63.5 on
//   the H200 (../shared/KERNELS.md, BASELINES.md); the V100's 62.8 int8 TOPS (4x fp32) agrees.
// - Tensor cores: Volta whitepaper, 8 tensor cores per SM x 64 fp16 FMA/clk (V100 ~125 TFLOP/s); Turing
//   whitepaper, 8 x 64 fp16 FMA and int8 at twice that (T4 65 TFLOP/s, 130 TOPS); A100 whitepaper, 4 x 256
//   FMA (312 TFLOP/s, 624 TOPS); GA102 and AD102 whitepapers, dense fp16 with fp16 accumulation 1024
//   ops/clk/SM and int8 2048 (RTX 3090 142 TFLOP/s / 284 TOPS at 82 SMs x 1.695 GHz; RTX 4090 330 / 661 at
//   128 SMs x 2.52 GHz; GeForce halves fp16 with fp32 accumulation, which is why the probe accumulates in
//   fp16); H100 whitepaper, twice the A100 SM (989 TFLOP/s, 1979 TOPS at 132 SMs x 1.83 GHz). The per-SM
//   tensor FMA rates of PyTorch's torch/cuda/_device_limits.py (sm_80: 1024 fp16, 2048 int8; sm_90: 2048,
//   4096) agree. NVIDIA forum (R. Crovella, "How to calculate the Tensor Core FP16 performance of H100?")
//   derives the V100 and A100 figures the same way.
// Where sources differ by 2x the higher rate is used: a healthy unit then reads 0.5 at worst, far above the
// 0.25 threshold, and a measurement above the table would mean the table is wrong. On Hopper, mma.sync
// (the only tensor-core instruction the probe uses) reaches about two thirds of the wgmma peak in the
// table (H200, measured: HMMA m16n8k16 0.65, IMMA m16n8k32 0.66, FP32 0.98, HFMA2 0.97, DP4A 1.00 at the
// measured clock): healthy all the same. A CMP 100-210 (public measurements, BASELINES.md): HMMA ~6 TFLOP/s of
// 68 x 1.38 GHz x 1024 = 96, i.e. 1/16: throttled.
#include <fmt/format.h>

#include "runtime/cuda/probe.h"

namespace qrig::cuda {

namespace {

struct ArchRow {
  int sm;
  double rate[kUnitCount];  // in Unit order
};

constexpr ArchRow kArchRates[] = {
    {70, {128, 256, 512, 1024, 0}},    {75, {128, 256, 512, 1024, 2048}}, {80, {128, 512, 512, 2048, 4096}},
    {86, {256, 256, 512, 1024, 2048}}, {89, {256, 256, 512, 1024, 2048}}, {90, {256, 512, 512, 4096, 8192}},
};

}  // namespace

const char* unit_name(Unit u) {
  switch (u) {
    case Unit::fp32_fma: return "FP32 FMA";
    case Unit::hfma2: return "HFMA2";
    case Unit::dp4a: return "DP4A";
    case Unit::hmma: return "HMMA";
    case Unit::imma: return "IMMA";
  }
  return "?";
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::ok: return "ok";
    case Verdict::throttled: return "THROTTLED";
    case Verdict::absent: return "absent";
    case Verdict::unknown_arch: return "unknown arch";
    case Verdict::not_measured: return "not measured";
  }
  return "?";
}

std::optional<double> arch_unit_rate(int sm, Unit u) {
  for (const ArchRow& r : kArchRates)
    if (r.sm == sm) return r.rate[(int)u];
  return std::nullopt;
}

std::vector<int> arch_rate_table_archs() {
  std::vector<int> v;
  for (const ArchRow& r : kArchRates) v.push_back(r.sm);
  return v;
}

// Must agree with templates/probe_units.cu (tests/cuda/test_probe.cpp finds each opcode in the kernel's PTX).
std::optional<UnitKernel> unit_kernel(Unit u, int sm) {
  switch (u) {
    case Unit::fp32_fma: return UnitKernel{"probe_fp32_fma", "fma.rn.f32", 32 * 2};
    case Unit::hfma2: return UnitKernel{"probe_hfma2", "fma.rn.f16x2", 32 * 4};
    case Unit::dp4a: return UnitKernel{"probe_dp4a", "dp4a.s32.s32", 32 * 8};
    case Unit::hmma:
      if (sm >= 80) return UnitKernel{"probe_hmma", "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16", 2.0 * 16 * 8 * 16};
      if (sm >= 75) return UnitKernel{"probe_hmma", "mma.sync.aligned.m16n8k8.row.col.f16.f16.f16.f16", 2.0 * 16 * 8 * 8};
      // m8n8k4: each of the warp's four quad-pairs multiplies its own 8x4 by 4x8.
      if (sm >= 70) return UnitKernel{"probe_hmma", "mma.sync.aligned.m8n8k4.row.col.f16.f16.f16.f16", 4 * 2.0 * 8 * 8 * 4};
      return std::nullopt;
    case Unit::imma:
      if (sm >= 80) return UnitKernel{"probe_imma", "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32", 2.0 * 16 * 8 * 32};
      if (sm >= 75) return UnitKernel{"probe_imma", "mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32", 2.0 * 8 * 8 * 16};
      return std::nullopt;
  }
  return std::nullopt;
}

void apply_verdicts(DeviceProbe& d) {
  for (Unit u : kUnits) {
    UnitRate& r = d.unit(u);
    r.unit = u;
    const std::optional<double> expected = arch_unit_rate(d.sm, u);
    r.expected_ops_per_clk_per_sm = expected.value_or(0.0);
    r.ratio = 0;
    if ((expected && *expected == 0) || !unit_kernel(u, d.sm)) {
      r.verdict = Verdict::absent;
    } else if (!r.measured || r.ops_per_clk_per_sm <= 0) {
      r.verdict = Verdict::not_measured;
    } else if (!expected) {
      r.verdict = Verdict::unknown_arch;
    } else {
      r.ratio = r.ops_per_clk_per_sm / *expected;
      r.verdict = r.ratio < kThrottledBelow ? Verdict::throttled : Verdict::ok;
    }
  }
  const Verdict hmma = d.unit(Unit::hmma).verdict, imma = d.unit(Unit::imma).verdict;
  d.tensor_cores_throttled = !(hmma == Verdict::ok && (imma == Verdict::ok || imma == Verdict::absent));
}

bool ProbeResult::ok() const {
  for (const auto& d : devices)
    if (!d.errors.empty()) return false;
  for (const auto& p : peers)
    if (!p.errors.empty()) return false;
  return true;
}

}  // namespace qrig::cuda
