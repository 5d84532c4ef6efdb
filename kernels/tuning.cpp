// The default tuning data per architecture (see tuning.h). Every number here was measured on one H200
// (sm_90, 132 SMs; bench/RESULTS.md 2026-11-30 and session 3) by the benchmarks in tests/gpu; other
// architectures get the same numbers until a rig file or a probe on that GPU says otherwise.
#include "kernels/tuning.h"

#include <fmt/format.h>

namespace qrig::kernels {

int64_t AttentionTuning::resident_of(const std::string& key, bool decode) const {
  for (const auto& [k, v] : resident)
    if (k == key) return v;
  return decode ? fallback_decode : fallback_prefill;
}

const WqGemvTiling& MatmulTuning::wq_gemv_for(int64_t type) const {
  for (const WqGemvTiling& t : wq_gemv)
    if (t.type == type) return t;
  return wq_gemv_default;
}

namespace {

// The subset of tests/gpu/bench_gpu_gemm.cpp's swept tilings (one plane) whose modelled choice came within 1%
// of the measured best on average (7% at worst) over the 9B shapes and T = 8..4096 on the H200; 128 x 128 (one
// 8-warp CTA per SM) lost to 128 x 64 (two) everywhere. Efficiencies are measured at T = 4096.
const std::vector<GemmTiling> kH200Tilings1 = {
    {128, 64, 8, 4, 2, 1, 2, 0.750},  // the prefill tile: 8 x 4 per thread, 16 warps per SM
    {128, 32, 4, 4, 2, 1, 2, 0.661},
    {64, 32, 4, 4, 2, 1, 5, 0.672},
    {64, 32, 4, 4, 2, 2, 2, 0.624},   // sliced K: more warps per tile when tiles are few
    {32, 32, 4, 4, 2, 4, 2, 0.431},
    {32, 32, 4, 4, 2, 2, 5, 0.560},
};
// The same tilings with two planes: CTAs per SM from their sm_90 registers (64 K per SM, allocated per warp in
// multiples of 8 per thread) and shared memory (all fit 48 KiB; 32 x 32 x 4 slices only with kb = 1). The
// efficiencies are estimates from instruction counts and the one-plane measurements, not yet measured.
const std::vector<GemmTiling> kH200Tilings2 = {
    {128, 64, 8, 4, 2, 1, 1, 0.68},  // 195 registers: 8 warps per SM; 16 dp4a per 16-byte shared load
    {128, 32, 4, 4, 2, 1, 2, 0.70},  // 128 registers: 16 warps, the p1 prefill tile's loads per dp4a
    {64, 32, 4, 4, 2, 1, 3, 0.62},   // 133 registers: 12 warps (p1: 20)
    {64, 32, 4, 4, 2, 2, 2, 0.62},
    {32, 32, 4, 4, 1, 4, 2, 0.43},
    {32, 32, 4, 4, 2, 2, 3, 0.52},   // 160 registers: 12 warps (p1: 20)
};

}  // namespace

Tuning default_tuning(int sm) {
  Tuning t;
  t.source = sm == 90 ? "defaults measured on an H200 (sm_90)"
                      : fmt::format("defaults measured on an H200 (sm_90), not on sm_{}: measure this GPU (qrig "
                                    "probe) or set [tuning] in the rig file",
                                    sm);
  MatmulTuning& m = t.matmul;
  m.tiled[0] = kH200Tilings1;
  m.tiled[1] = kH200Tilings2;
  m.partial_exponent = 0.3;  // fitted to the same sweep
  // Per row count, the fastest skinny tiling of bench_gpu_gemm.cpp's sweep at the 9B shapes (p1; p2 takes the
  // same: none of them spills with two planes, c16 r4 at 255 registers as with one). At 16 rows the skinny
  // kernel still beats every tiling (36 vs 54 us on 4096 -> 12288).
  m.skinny_max_rows = 16;
  m.skinny = {{2, 4, 2, 128}, {4, 8, 1, 64}, {8, 4, 1, 128}, {16, 4, 1, 64}};
  // r1 u2 t256 was the fastest GEMV tiling at every 9B decode shape (bench/RESULTS.md, 2026-11-30).
  m.gemv_rows_per_warp = 1;
  m.gemv_unroll = 2;
  m.gemv_threads = 256;
  // The block types: the GEMV for one row, the skinny kernel up to 16 rows (its tiling: kernels/matmul.cpp
  // choose_matmul_wq), the tiled GEMM beyond. The GEMV per type: the fastest (summed over 4096->12288,
  // 12288->4096, 4096->4096, two planes) of tests/gpu/test_gpu_wq.cpp's "[.bench][wq]" sweep on the H200
  // (bench/RESULTS.md, session 9): gemv_wq_dp4a {type, r, s, u, t}, or {type, r, 0, ...}: session 7's skinny
  // kernel with c = 1 where it was fastest. Every type within ~10% of the others' best: all are bound by
  // instructions (two planes: 16 dp4a per 16 weight bytes and row, 16 more for the activation sums of types with
  // offsets), not DRAM. Q4_K and Q5_K from the second sweep, after their scale words left local memory (Q4_K's
  // skinny GEMV 33-54% of copy, gemv_wq_dp4a 30-46%). Q4_K / Q5_K's gemv_wq_k4_dp4a (split -1: a lane per two
  // sub-blocks, ~2.5x fewer instructions per weight byte on the PTX) is in the sweep but not measured yet: not here.
  m.wq_gemv = {{2, 2, 0, 1, 128},  {3, 2, 2, 1, 128},  {6, 2, 2, 1, 128},  {7, 2, 2, 1, 128},
               {10, 2, 0, 1, 128}, {11, 2, 0, 1, 128}, {12, 2, 0, 1, 128}, {13, 2, 0, 1, 128},
               {14, 2, 0, 1, 128}, {20, 1, 1, 2, 128}, {23, 2, 0, 1, 128}};
  m.wq_gemv_default = {0, 1, 4, 1, 128};
  m.wq_skinny_max_rows = 16;
  // The tiled GEMM: the Q8_0 prefill tile (128 x 64, 8 x 4 per thread) and two smaller ones for short steps.
  // CTAs per SM from their registers under NVRTC 13 for sm_90 (__launch_bounds__(t, 1), so ptxas does not cap
  // them at 128 and spill): 128 x 64 takes 130-157 (p2: 180-207), one 8-warp CTA; 128 x 32 96-125 (p2:
  // 128-151), two (p2: one); 64 x 32 96-127 (p2: 126-151), four (p2: three). Efficiencies are estimates
  // (fraction of the dp4a peak, for choosing among these tilings only): the Q8_0 measurements less the decode
  // of each tile (~15% of a thread's instructions at 128 x 64), the second barrier per stage, and the extra
  // scale FFMAs (3 per 32 values and output with offsets, 4 for the per-16 types, against Q8_0's 2).
  m.wq_tiled[0] = {{128, 64, 8, 4, 1, 1, 1, 0.55}, {128, 32, 4, 4, 1, 1, 2, 0.48}, {64, 32, 4, 4, 1, 1, 4, 0.45}};
  m.wq_tiled[1] = {{128, 64, 8, 4, 1, 1, 1, 0.50}, {128, 32, 4, 4, 1, 1, 1, 0.42}, {64, 32, 4, 4, 1, 1, 3, 0.42}};
  // Blocks per SM of the attention kernels. attn_decode is register-bound at two (its __launch_bounds__(128, 2):
  // 194-254 registers under NVRTC 13.0 and 11.8, allocated 256 per thread at most) on every architecture.
  // attn_prefill (168 registers, 64 KiB of dynamic shared memory) is bound by each architecture's shared memory per
  // SM: 228 KiB on sm_90 (three, as the H200's occupancy query gave), 164 KiB on sm_80 (two), 96-100 KiB on sm_70,
  // sm_86 and sm_89 and 64 KiB on sm_75 (one).
  t.attention.resident = {};
  t.attention.fallback_decode = 2;
  t.attention.fallback_prefill = sm >= 90 ? 3 : sm == 80 ? 2 : 1;
  // The recurrent GDN kernel beats the chunked pair up to ~64 tokens (H200: 49.6 us vs 51.5 us at T = 64, 15 vs
  // 40 us at T = 16; tests/gpu/bench_gpu_gdn.cpp).
  t.gdn_recurrent_below = 64;
  return t;
}

}  // namespace qrig::kernels
