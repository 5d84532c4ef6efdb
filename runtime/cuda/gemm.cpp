// The Q8_0 x int8 GEMM kernel set (gemm.h): the registry entries of its two templates, their checked
// launchers, the choice of kernel per number of rows T, and MatmulQ8.
//
// Tiling choice (KERNELS.md "Q8_0 x int8 GEMM"). On SIMT the prefill GEMM is bound by the dp4a rate (H200: 64
// dp4a/clk/SM x 132 SMs x 1.98 GHz = 133 int8 TOPS) only if shared memory and issue slots keep up, so the
// thread tile is sized by shared-memory traffic and the scale work is cut to the minimum:
//  - gemm_q8_0_dp4a_tiled with a 128 x 64 CTA tile, 256 threads, 8 x 4 outputs per thread: per 4 bytes of K a
//    thread does 32 dp4a fed by three 16-byte shared loads of K-interleaved tiles (one 32-bit word = one dp4a
//    operand, no byte shuffles; each warp load is a 128- or 64-byte span broadcast to the other lanes), per
//    32-block and output 2 FFMA (the dp4a sum starts at a magic constant whose float bits convert exactly,
//    see the template), 2 Q8_0 blocks per stage (one barrier per 64 bytes of K; 1 block per stage measured
//    5-15% slower). 127 registers: two CTAs (16 warps) per SM, with register-staged double buffering (sm_70
//    material, no cp.async). The dp4a pipe issues every other cycle; the other slot covers the ~0.4
//    instructions per dp4a of loads and scales. Measured on an H200 (bench_gpu_gemm.cpp): 92-97 TOPS (69-73%
//    of peak) at T = 512 and 97-102 TOPS (73-77%) at T >= 1024 on the 9B shapes; at T = 512 they give 384
//    (4096->12288), 256 (4096->8192) and 128 CTA tiles (4096->4096, 12288->4096) x 2 per SM: ~97% wave
//    efficiency. The 128 x 128 tile (8 x 8 per thread, 225 registers, one 8-warp CTA per SM: less latency
//    hiding) measured 5-10% slower; 128 x 128 with the next stage stored halfway made ptxas sink its global
//    loads next to the stores (12% slower). Expected ceiling of this structure ~80%: barrier drain and
//    refill per stage and the scale FFMAs that no other warp overlaps cost the rest.
//  - Fewer tokens: smaller tiles (128 x 32, 64 x 32) and sliced K (sk thread groups per CTA each take part
//    of every stage and add up at the end, deterministic) keep all SMs busy without a split-K workspace:
//    e.g. 12288->4096 at T = 32 runs in 65 us instead of 178 us with 64 x 32 tiles alone.
//  - T <= kSkinnyMaxT (16): gemm_q8_0_dp4a_skinny reads each weight once for all T tokens (the decode GEMV
//    with T columns; DRAM-bound up to T ~ 4, then issue-bound on 2 FFMA per 4 dp4a): 1.1-1.7x the GEMV's
//    time at T = 4-8, and at T = 16 faster than any tiling (36 vs 54 us on 4096->12288).
// The choice among tilings is a cost model (waves x tile work / measured efficiency, below), fitted to the
// H200 sweep of tests/gpu/bench_gpu_gemm.cpp ("[gemm_sweep]"): within 1% of the best tiling on average.
//
// Two activation planes (p2, gemm.h) double the dp4a per output and change what fits (ptxas for sm_90, CUDA
// 13): the second plane's token tiles add 2 * K4 * (bt + 4) words of shared memory (32 x 32 with 4 K slices
// and kb = 2 no longer fits 48 KiB: kb = 1), and each thread holds a second tn x tt block of sums: the
// 128 x 64 prefill tile takes 195 registers (one 8-warp CTA per SM instead of two), 128 x 32 takes 128
// (still two), 64 x 32 133 and 32 x 32 with 2 slices 160 (three 4-warp CTAs instead of five). Per 4 bytes of
// K a p2 thread of a 4 x 4 tile does 32 dp4a on three 16-byte shared loads, like the p1 prefill tile; the
// combine costs 5 float instructions per 16 dp4a (p1: 2 per 8). The p2 efficiencies below are estimates from
// those counts and the p1 measurements (8 warps per SM: like the p1 128 x 128 tile, ~7% below 16 warps), not
// yet measured: the sweep with QRIG_SWEEP_PLANES=2 is the data to fit them to.
#include "runtime/cuda/gemm.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include <fmt/format.h>

#include "runtime/cuda/variant_parts.h"

namespace qrig::cuda {

std::vector<TemplateInfo> gemm_templates() {
  return {
      {"gemm_q8_0_dp4a_tiled", "gemm_q8_0_dp4a_tiled.cu",
       {planes_param(),
        {"bn", "QRIG_BN", 32, 256, 32, "weight rows per CTA"},
        {"bt", "QRIG_BT", 16, 256, 16, "tokens (activation rows) per CTA"},
        {"tn", "QRIG_TN", 4, 8, 4, "weight rows per thread"},
        {"tt", "QRIG_TT", 4, 8, 4, "tokens per thread"},
        {"kb", "QRIG_KB", 1, 2, 1, "Q8_0 blocks of K per pipeline stage and K slice"},
        {"sk", "QRIG_SK", 1, 8, 1, "K slices: thread groups splitting each stage, summed at the end"},
        threads_param()},
       "prefill GEMM: repacked Q8_0 weights x int8 activations (1 or 2 planes), K-interleaved shared tiles, "
       "dp4a, f32 out"},
      {"gemm_q8_0_dp4a_skinny", "gemm_q8_0_dp4a_skinny.cu",
       {planes_param(),
        {"c", "QRIG_COLS", 1, 16, 1, "activation rows (tokens), at most (a power of two)"},
        {"r", "QRIG_ROWS", 1, 8, 1, "weight rows per warp (a power of two)"},
        {"u", "QRIG_UNROLL", 1, 8, 1, "Q8_0 blocks of each row per lane loaded before use"},
        threads_param()},
       "few-row GEMM: each weight read once for up to c tokens (batched decode), 1 or 2 activation planes, "
       "dp4a, f32 out"},
  };
}

// Mirrors the template's layout: two stages of [K4][bn+4] weight words, per plane [K4][bt+4] token words,
// [kb*sk][bn] and [kb*sk][bt] scales (K4 = 8*kb*sk).
int64_t gemm_q8_0_tiled_smem_bytes(int64_t planes, int64_t bn, int64_t bt, int64_t kb, int64_t sk) {
  const int64_t kbs = kb * sk, k4 = 8 * kbs;
  return 4 * (2 * k4 * (bn + 4) + planes * 2 * k4 * (bt + 4) + 2 * kbs * bn + 2 * kbs * bt);
}

Variant gemm_q8_0_tiled_variant(int64_t planes, int64_t bn, int64_t bt, int64_t tn, int64_t tt, int64_t kb,
                                int64_t sk) {
  if (tn <= 0 || tt <= 0 || bn % (8 * tn) != 0 || bt % (4 * tt) != 0)
    throw KernelError(fmt::format("gemm_q8_0_dp4a_tiled: a {} x {} CTA tile is not whole warp tiles of {} x {}", bn,
                                  bt, 8 * tn, 4 * tt));
  const int64_t smem = gemm_q8_0_tiled_smem_bytes(planes, bn, bt, kb, sk);
  const int64_t tile_words = 16 * kb * sk * ((bn + 4) + planes * (bt + 4));  // holds the slice sums at the end
  if (smem > kTiledSmemLimit || (sk - 1) * bn * bt > tile_words)
    throw KernelError(fmt::format("gemm_q8_0_dp4a_tiled: a {} x {} tile with kb = {}, sk = {} and {} plane(s) needs "
                                  "{} bytes of shared memory (at most {}, and room for the slice sums)",
                                  bn, bt, kb, sk, planes, smem, kTiledSmemLimit));
  return make_variant("gemm_q8_0_dp4a_tiled", {{"p", planes},
                                               {"bn", bn},
                                               {"bt", bt},
                                               {"tn", tn},
                                               {"tt", tt},
                                               {"kb", kb},
                                               {"sk", sk},
                                               {"t", sk * (bn / tn) * (bt / tt)}});
}

Variant gemm_q8_0_skinny_variant(int64_t planes, int64_t cols, int64_t rows_per_warp, int64_t unroll,
                                 int64_t threads) {
  auto pow2 = [](int64_t v) { return v > 0 && (v & (v - 1)) == 0; };
  if (!pow2(cols) || !pow2(rows_per_warp) || cols * rows_per_warp > 64)
    throw KernelError(fmt::format("gemm_q8_0_dp4a_skinny: {} tokens and {} rows per warp must be powers of two with "
                                  "at most 64 sums per lane", cols, rows_per_warp));
  return make_variant("gemm_q8_0_dp4a_skinny",
                      {{"p", planes}, {"c", cols}, {"r", rows_per_warp}, {"u", unroll}, {"t", threads}});
}

namespace {

void require_kernel(const LoadedKernel& k, const char* kernel) {
  if (k.variant.kernel != kernel)
    throw KernelError(fmt::format("{} launcher given the variant {}", kernel, k.variant.name));
}

void require_ptr(const void* p, size_t align, const LoadedKernel& k, const char* what) {
  if (!p) throw KernelError(fmt::format("{}: {} is null", k.variant.name, what));
  if (reinterpret_cast<uintptr_t>(p) % align != 0)
    throw KernelError(fmt::format("{}: {} is not {}-byte aligned", k.variant.name, what, align));
}

// The shared checks of both GEMM launchers; returns the second plane to pass (null for p1).
const signed char* require_gemm_args(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                                     const int8_t* xq2, int64_t T, float* y) {
  require_ptr(w.qs, 16, k, "weights");
  require_ptr(w.scales, 2, k, "weight scales");
  if (w.rows <= 0 || w.rows > INT_MAX || w.cols <= 0 || w.cols % 32 != 0 || w.cols > INT_MAX / 2)
    throw KernelError(fmt::format("{}: weights have shape [{}][{}]", k.variant.name, w.rows, w.cols));
  require_ptr(xq, 16, k, "xq");
  require_ptr(xd, 4, k, "xd");
  require_ptr(y, 16, k, "y");
  if (T <= 0 || T > INT_MAX) throw KernelError(fmt::format("{}: {} activation rows", k.variant.name, T));
  if (k.variant.param("p") == 1) return nullptr;
  require_ptr(xq2, 16, k, "xq2 (the second activation plane)");
  return reinterpret_cast<const signed char*>(xq2);
}

}  // namespace

void launch_gemm_q8_0_tiled(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                            const int8_t* xq2, int64_t T, float* y, cudaStream_t stream) {
  require_kernel(k, "gemm_q8_0_dp4a_tiled");
  const signed char* q2 = require_gemm_args(k, w, xq, xd, xq2, T, y);
  const int64_t bn = k.variant.param("bn"), bt = k.variant.param("bt");
  const int64_t per_stage = 32 * k.variant.param("kb") * k.variant.param("sk");
  if (w.cols % per_stage != 0)
    throw KernelError(fmt::format("{}: {} columns are not a multiple of {}", k.variant.name, w.cols, per_stage));
  const int64_t gx = (T + bt - 1) / bt, gy = (w.rows + bn - 1) / bn;
  if (gx > INT_MAX || gy > 65535)
    throw KernelError(fmt::format("{}: a grid of {} x {} CTAs", k.variant.name, gx, gy));
  k.kernel.launch(dim3((unsigned)gx, (unsigned)gy), dim3((unsigned)k.variant.threads()), 0, stream,
                  reinterpret_cast<const signed char*>(w.qs), reinterpret_cast<const unsigned short*>(w.scales),
                  reinterpret_cast<const signed char*>(xq), xd, q2, y, (int)w.cols, (int)w.rows, (int)T);
}

void launch_gemm_q8_0_skinny(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                             const int8_t* xq2, int64_t T, float* y, cudaStream_t stream) {
  require_kernel(k, "gemm_q8_0_dp4a_skinny");
  const signed char* q2 = require_gemm_args(k, w, xq, xd, xq2, T, y);
  if (T > k.variant.param("c"))
    throw KernelError(fmt::format("{}: {} activation rows, more than its {}", k.variant.name, T, k.variant.param("c")));
  const int64_t rows_per_block = k.variant.param("r") * (k.variant.threads() / 32);
  const int64_t g = (w.rows + rows_per_block - 1) / rows_per_block;
  k.kernel.launch(dim3((unsigned)g), dim3((unsigned)k.variant.threads()), 0, stream,
                  reinterpret_cast<const signed char*>(w.qs), reinterpret_cast<const unsigned short*>(w.scales),
                  reinterpret_cast<const signed char*>(xq), xd, q2, y, (int)w.cols, (int)w.rows, (int)T);
}

namespace {

// A tiling of the tiled kernel with its modelled throughput: `ctas_per_sm` CTAs fit one SM (registers and
// shared memory, H200), and an SM full of them runs at `eff` of the dp4a peak (measured at T = 4096 on an H200,
// bench_gpu_gemm.cpp's sweep; p2: estimated, see the top). kb is the preferred blocks per stage and slice (1
// when K does not allow it).
struct Tiling {
  int64_t bn, bt, tn, tt, kb, sk;
  int ctas_per_sm;
  double eff;
};
// The subset of the swept tilings whose modelled choice came within 1% of the measured best on average (7%
// at worst) over the 9B shapes and T = 8..4096; 128 x 128 (one 8-warp CTA per SM) lost to 128 x 64 (two)
// everywhere.
constexpr Tiling kTilings[] = {
    {128, 64, 8, 4, 2, 1, 2, 0.750},  // the prefill tile: 8 x 4 per thread, 16 warps per SM
    {128, 32, 4, 4, 2, 1, 2, 0.661},
    {64, 32, 4, 4, 2, 1, 5, 0.672},
    {64, 32, 4, 4, 2, 2, 2, 0.624},   // sliced K: more warps per tile when tiles are few
    {32, 32, 4, 4, 2, 4, 2, 0.431},
    {32, 32, 4, 4, 2, 2, 5, 0.560},
};
// The same tilings with two planes: CTAs per SM from their sm_90 registers (64 K per SM, allocated per warp in
// multiples of 8 per thread) and shared memory (all fit 48 KiB; 32 x 32 x 4 slices only with kb = 1).
constexpr Tiling kTilings2[] = {
    {128, 64, 8, 4, 2, 1, 1, 0.68},  // 195 registers: 8 warps per SM; 16 dp4a per 16-byte shared load
    {128, 32, 4, 4, 2, 1, 2, 0.70},  // 128 registers: 16 warps, the p1 prefill tile's loads per dp4a
    {64, 32, 4, 4, 2, 1, 3, 0.62},   // 133 registers: 12 warps (p1: 20)
    {64, 32, 4, 4, 2, 2, 2, 0.62},
    {32, 32, 4, 4, 1, 4, 2, 0.43},
    {32, 32, 4, 4, 2, 2, 3, 0.52},   // 160 registers: 12 warps (p1: 20)
};
constexpr double kPartialExponent = 0.3;

// Modelled time (arbitrary units) of T rows of a [k] -> [n] matmul with tiling t on `sms` SMs: tiles are
// dealt to SMs round-robin; the busiest SM runs full rounds of ctas_per_sm tiles at eff, and a last round of
// c < ctas_per_sm tiles at eff * (c / ctas_per_sm)^0.3 (fewer warps hide less latency; the exponent fitted
// to the same sweep). A tile's work is its outputs times the planes (the dp4a per output).
double modelled_time(const Tiling& t, int64_t n, int64_t T, int sms, int64_t planes) {
  const int64_t tiles = ((n + t.bn - 1) / t.bn) * ((T + t.bt - 1) / t.bt);
  const int64_t per_sm = (tiles + sms - 1) / sms;  // tiles of the busiest SM
  const int64_t full = per_sm / t.ctas_per_sm, rest = per_sm % t.ctas_per_sm;
  const double work = (double)(t.bn * t.bt * planes);
  double time = (double)full * t.ctas_per_sm * work / t.eff;
  if (rest > 0) time += (double)rest * work / (t.eff * std::pow((double)rest / t.ctas_per_sm, kPartialExponent));
  return time;
}

// What runs T rows: the GEMV (T = 1), the skinny kernel for up to `cols` rows, or a tiling of the tiled one.
struct Choice {
  enum Kind { gemv, skinny, tiled } kind;
  int64_t cols = 0;                // skinny
  const Tiling* tiling = nullptr;  // tiled
  int64_t kb = 1;
  bool operator==(const Choice& o) const {
    return kind == o.kind && cols == o.cols && tiling == o.tiling && kb == o.kb;
  }
};

Choice choose(int64_t k, int64_t n, int64_t T, int sms, int64_t planes) {
  if (k <= 0 || k % 32 != 0 || n <= 0 || T <= 0 || sms <= 0 || planes < 1 || planes > 2)
    throw KernelError(fmt::format("matmul_q8_0: no kernel for T = {} rows of [{}] -> [{}] on {} SMs with {} planes", T,
                                  k, n, sms, planes));
  if (T == 1) return {Choice::gemv};
  if (T <= kSkinnyMaxT) {
    int64_t c = 2;
    while (c < T) c *= 2;
    return {Choice::skinny, c};
  }
  const Tiling* best = nullptr;
  double best_time = 0;
  int64_t best_kb = 1;
  const int64_t nb = k / 32;
  auto consider = [&](const Tiling& t) {
    if (nb % t.sk != 0) return;  // each stage is split in sk equal slices
    const int64_t kb = nb % (t.kb * t.sk) == 0 ? t.kb : 1;
    if (gemm_q8_0_tiled_smem_bytes(planes, t.bn, t.bt, kb, t.sk) > kTiledSmemLimit) return;  // never, as listed
    const double time = modelled_time(t, n, T, sms, planes);
    if (!best || time < best_time) best = &t, best_time = time, best_kb = kb;
  };
  if (planes == 1)
    for (const Tiling& t : kTilings) consider(t);
  else
    for (const Tiling& t : kTilings2) consider(t);
  if (!best) throw KernelError(fmt::format("matmul_q8_0: no tiling divides K = {}", k));  // sk = 1 always does
  return {Choice::tiled, 0, best, best_kb};
}

Variant variant_of(const Choice& c, int64_t k, int64_t planes) {
  switch (c.kind) {
    case Choice::gemv: return gemv_q8_0_variant(k, planes);
    case Choice::skinny: {
      // Per token count, the fastest of bench_gpu_gemm.cpp's sweep on an H200 at the 9B shapes (p1; p2 takes
      // the same: none of them spills with two planes, c16 r4 at 255 registers as with one).
      if (c.cols <= 2) return gemm_q8_0_skinny_variant(planes, 2, 4, 2, 128);
      if (c.cols <= 4) return gemm_q8_0_skinny_variant(planes, 4, 8, 1, 64);
      if (c.cols <= 8) return gemm_q8_0_skinny_variant(planes, 8, 4, 1, 128);
      return gemm_q8_0_skinny_variant(planes, 16, 4, 1, 64);
    }
    case Choice::tiled: break;
  }
  return gemm_q8_0_tiled_variant(planes, c.tiling->bn, c.tiling->bt, c.tiling->tn, c.tiling->tt, c.kb,
                                 c.tiling->sk);
}

// The distinct choices for T = 1..max_t in order of first use; by_t (when given) gets (first T, index) at
// every T where the choice changes.
std::vector<Choice> choices(int64_t k, int64_t n, int64_t min_t, int64_t max_t, int sms, int64_t planes,
                            std::vector<std::pair<int64_t, size_t>>* by_t) {
  if (min_t < 1 || max_t < min_t) throw KernelError(fmt::format("matmul_q8_0: rows {}..{}", min_t, max_t));
  std::vector<Choice> out;
  for (int64_t T = min_t; T <= max_t; ++T) {
    const Choice c = choose(k, n, T, sms, planes);
    const size_t i = (size_t)(std::find(out.begin(), out.end(), c) - out.begin());
    if (i == out.size()) out.push_back(c);
    if (by_t && (by_t->empty() || by_t->back().second != i)) by_t->emplace_back(T, i);
  }
  return out;
}

}  // namespace

Variant matmul_q8_0_choice(int64_t k, int64_t n, int64_t T, int sms, int64_t planes) {
  return variant_of(choose(k, n, T, sms, planes), k, planes);
}

std::vector<Variant> matmul_q8_0_variants(int64_t k, int64_t n, int64_t max_t, int sms, int64_t planes,
                                          int64_t min_t) {
  std::vector<Variant> out;
  for (const Choice& c : choices(k, n, min_t, max_t, sms, planes, nullptr)) out.push_back(variant_of(c, k, planes));
  return out;
}

MatmulQ8::MatmulQ8(const KernelLoader& load, int64_t k, int64_t n, int64_t max_t, int sms, int64_t planes,
                   int64_t min_t)
    : k_(k), n_(n), max_t_(max_t), min_t_(min_t), sms_(sms), planes_(planes) {
  if (k <= 0 || k % 32 != 0 || n <= 0 || n > INT_MAX || min_t < 1 || max_t < min_t || max_t > INT_MAX || sms <= 0 ||
      planes < 1 || planes > 2)
    throw KernelError(fmt::format("MatmulQ8: [{}] -> [{}] for {}..{} rows on {} SMs with {} planes", k, n, min_t,
                                  max_t, sms, planes));
  for (const Choice& c : choices(k, n, min_t, max_t, sms, planes, &by_t_)) {
    const Variant v = variant_of(c, k, planes);
    LoadedKernel lk = load(v);
    if (!(lk.variant == v))
      throw KernelError(fmt::format("MatmulQ8: asked for {}, the loader gave {}", v.name, lk.variant.name));
    kernels_.push_back(std::move(lk));
  }
}

size_t MatmulQ8::index_for(int64_t T) const {
  if (T < min_t_ || T > max_t_)
    throw KernelError(fmt::format("MatmulQ8 [{}] -> [{}]: {} rows, outside {}..{}", k_, n_, T, min_t_, max_t_));
  auto it = std::upper_bound(by_t_.begin(), by_t_.end(), T,
                             [](int64_t t, const std::pair<int64_t, size_t>& e) { return t < e.first; });
  return std::prev(it)->second;
}

void MatmulQ8::run(const Q8Matrix& w, const int8_t* xq, const float* xd, const int8_t* xq2, int64_t T, float* y,
                   cudaStream_t stream) const {
  if (w.cols != k_ || w.rows != n_)
    throw KernelError(fmt::format("MatmulQ8 [{}] -> [{}] given weights [{}][{}]", k_, n_, w.rows, w.cols));
  const LoadedKernel& lk = kernels_[index_for(T)];
  if (lk.variant.kernel == "gemm_q8_0_dp4a_tiled")
    launch_gemm_q8_0_tiled(lk, w, xq, xd, xq2, T, y, stream);
  else if (lk.variant.kernel == "gemm_q8_0_dp4a_skinny")
    launch_gemm_q8_0_skinny(lk, w, xq, xd, xq2, T, y, stream);
  else
    launch_gemv_q8_0(lk, w, xq, xd, xq2, y, stream);  // T == 1
}

}  // namespace qrig::cuda
