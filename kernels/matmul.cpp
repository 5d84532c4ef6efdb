// The Q8_0 x int8 matmul kernels (matmul.h): registry entries, variants, and the choice of kernel per number
// of rows with its cost model. The tilings and their efficiencies are tuning data (tuning.cpp).
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
#include "kernels/matmul.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kernels/registry.h"

namespace qrig::kernels {

std::vector<TemplateInfo> matmul_templates() {
  return {
      {"quant_act_q8", "quant_act_q8.cu",
       {planes_param(), threads_param()},
       "f32 activations -> int8 + one f32 scale per 32 values (d = amax/127, q = round(x/d)), and with p2 the "
       "residual's int8 plane on the step d/254; one warp per 32"},
      {"gemv_q8_0_dp4a", "gemv_q8_0_dp4a.cu",
       {{"k", "QRIG_K", 32, 32768, 32, "input length (weight row length)"}, planes_param(),
        {"r", "QRIG_ROWS", 1, 8, 1, "output rows per warp"},
        {"u", "QRIG_UNROLL", 1, 8, 1, "512-byte chunks of each row loaded before use"},
        threads_param()},
       "decode GEMV: repacked Q8_0 weights [n][k] x quantized activation [k] with dp4a, f32 out"},
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
       "dp4a, f32 out",
       true},
      {"gemm_q8_0_dp4a_skinny", "gemm_q8_0_dp4a_skinny.cu",
       {planes_param(),
        {"c", "QRIG_COLS", 1, 16, 1, "activation rows (tokens), at most (a power of two)"},
        {"r", "QRIG_ROWS", 1, 8, 1, "weight rows per warp (a power of two)"},
        {"u", "QRIG_UNROLL", 1, 8, 1, "Q8_0 blocks of each row per lane loaded before use"},
        threads_param()},
       "few-row GEMM: each weight read once for up to c tokens (batched decode), 1 or 2 activation planes, "
       "dp4a, f32 out"},
      {"gemm_wq_dp4a_skinny", "gemm_wq_dp4a_skinny.cu",
       {{"w", "QRIG_WTYPE", 2, 23, 1, "weight type (ggml type id: 2 Q4_0 .. 14 Q6_K, 20 IQ4_NL, 23 IQ4_XS)"},
        planes_param(),
        {"c", "QRIG_COLS", 1, 16, 1, "activation rows (tokens) per launch, at most (a power of two)"},
        {"r", "QRIG_ROWS", 1, 4, 1, "weight rows per warp (a power of two)"},
        threads_param()},
       "GEMV / few-row GEMM of the GGUF block types other than Q8_0 (repacked quant and scale bytes), units of "
       "32 weights decoded to int8 codes, dp4a, scales and offsets per 16 values, f32 out"},
      {"gemv_wq_dp4a", "gemv_wq_dp4a.cu",
       {{"w", "QRIG_WTYPE", 2, 23, 1, "weight type (ggml type id: 2 Q4_0 .. 14 Q6_K, 20 IQ4_NL, 23 IQ4_XS)"},
        planes_param(),
        {"r", "QRIG_ROWS", 1, 4, 1, "weight rows per warp group"},
        {"s", "QRIG_SPLIT", 1, 8, 1, "warps splitting each row's units (a power of two)"},
        {"u", "QRIG_UNROLL", 1, 4, 1, "units of each row per lane whose loads are issued before any is decoded"},
        threads_param()},
       "decode GEMV of the GGUF block types other than Q8_0: each row's units split over s warps, the loads of u "
       "units per lane in flight, decoded to int8 codes, dp4a, scales and offsets per 16 values, f32 out"},
      {"gemv_wq_k4_dp4a", "gemv_wq_k4_dp4a.cu",
       {{"w", "QRIG_WTYPE", 12, 13, 1, "weight type (ggml type id: 12 Q4_K, 13 Q5_K)"},
        planes_param(),
        {"r", "QRIG_ROWS", 1, 4, 1, "weight rows per warp"},
        threads_param()},
       "decode GEMV of Q4_K / Q5_K: a lane takes 64 values (two sub-blocks) per step, their scales and mins "
       "decoded once, one integer dot per sub-block, the activation shared by r rows, dp4a, f32 out"},
      {"gemm_wq_dp4a_tiled", "gemm_wq_dp4a_tiled.cu",
       {{"w", "QRIG_WTYPE", 2, 23, 1, "weight type (ggml type id: 2 Q4_0 .. 14 Q6_K, 20 IQ4_NL, 23 IQ4_XS)"},
        planes_param(),
        {"bn", "QRIG_BN", 32, 256, 32, "weight rows per CTA"},
        {"bt", "QRIG_BT", 16, 256, 16, "tokens (activation rows) per CTA"},
        {"tn", "QRIG_TN", 4, 8, 4, "weight rows per thread"},
        {"tt", "QRIG_TT", 4, 8, 4, "tokens per thread"},
        threads_param()},
       "prefill GEMM of the GGUF block types other than Q8_0: each 128-value stage of a weight tile decoded once "
       "into int8 codes and per-16 scales/offsets in shared memory, K-interleaved tiles, dp4a, f32 out",
       true},
  };
}

Variant quant_act_q8_variant(int64_t planes) { return make_variant("quant_act_q8", {{"p", planes}, {"t", 256}}); }

Variant gemv_q8_0_variant(int64_t k, int64_t planes, int64_t rows_per_warp, int64_t unroll, int64_t threads) {
  return make_variant("gemv_q8_0_dp4a",
                      {{"k", k}, {"p", planes}, {"r", rows_per_warp}, {"u", unroll}, {"t", threads}});
}

Variant gemv_q8_0_variant(int64_t k, int64_t planes, const MatmulTuning& t) {
  return gemv_q8_0_variant(k, planes, t.gemv_rows_per_warp, t.gemv_unroll, t.gemv_threads);
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

// Modelled time (arbitrary units) of T rows of a [k] -> [n] matmul with tiling t on `sms` SMs: tiles are
// dealt to SMs round-robin; the busiest SM runs full rounds of ctas_per_sm tiles at eff, and a last round of
// c < ctas_per_sm tiles at eff * (c / ctas_per_sm)^partial_exponent (fewer warps hide less latency). A tile's
// work is its outputs times the planes (the dp4a per output).
double modelled_time(const GemmTiling& t, int64_t n, int64_t T, int sms, int64_t planes, double partial_exponent) {
  const int64_t tiles = ((n + t.bn - 1) / t.bn) * ((T + t.bt - 1) / t.bt);
  const int64_t per_sm = (tiles + sms - 1) / sms;  // tiles of the busiest SM
  const int64_t full = per_sm / t.ctas_per_sm, rest = per_sm % t.ctas_per_sm;
  const double work = (double)(t.bn * t.bt * planes);
  double time = (double)full * (double)t.ctas_per_sm * work / t.eff;
  if (rest > 0)
    time += (double)rest * work / (t.eff * std::pow((double)rest / (double)t.ctas_per_sm, partial_exponent));
  return time;
}

std::string tiling_name(const GemmTiling& t, int64_t kb) {
  return fmt::format("{}x{} (thread tile {}x{}, kb {}, {} K slice{})", t.bn, t.bt, t.tn, t.tt, kb, t.sk,
                     t.sk > 1 ? "s" : "");
}

// The kernel for exactly T rows, and why.
std::pair<Variant, std::string> choose_one(int64_t k, int64_t n, int64_t T, int sms, int64_t planes,
                                           const MatmulTuning& tun) {
  if (k <= 0 || k % 32 != 0 || n <= 0 || T <= 0 || sms <= 0 || planes < 1 || planes > 2)
    throw KernelError(fmt::format("matmul_q8_0: no kernel for T = {} rows of [{}] -> [{}] on {} SMs with {} planes", T,
                                  k, n, sms, planes));
  if (T == 1)
    return {gemv_q8_0_variant(k, planes, tun), "one row: the decode GEMV reads every weight once"};
  if (T <= tun.skinny_max_rows) {
    int64_t c = 2;
    while (c < T) c *= 2;
    for (const SkinnyTiling& s : tun.skinny)
      if (c <= s.max_rows)
        return {gemm_q8_0_skinny_variant(planes, s.max_rows, s.rows_per_warp, s.unroll, s.threads),
                fmt::format("{} rows or fewer: the skinny GEMM reads every weight once for all rows (bound by the "
                            "weight bytes up to ~4 rows)", s.max_rows)};
    throw KernelError(fmt::format("matmul_q8_0: the tuning has no skinny tiling for {} rows", T));
  }
  const GemmTiling* best = nullptr;
  const GemmTiling* second = nullptr;
  double best_time = 0, second_time = 0;
  int64_t best_kb = 1, second_kb = 1;
  const int64_t nb = k / 32;
  for (const GemmTiling& t : tun.tiled[planes - 1]) {
    if (nb % t.sk != 0) continue;  // each stage is split in sk equal slices
    const int64_t kb = nb % (t.kb * t.sk) == 0 ? t.kb : 1;
    if (gemm_q8_0_tiled_smem_bytes(planes, t.bn, t.bt, kb, t.sk) > kTiledSmemLimit) continue;
    const double time = modelled_time(t, n, T, sms, planes, tun.partial_exponent);
    if (!best || time < best_time) {
      second = best, second_time = best_time, second_kb = best_kb;
      best = &t, best_time = time, best_kb = kb;
    } else if (!second || time < second_time) {
      second = &t, second_time = time, second_kb = kb;
    }
  }
  if (!best) throw KernelError(fmt::format("matmul_q8_0: no tiling divides K = {}", k));
  std::string why = fmt::format("least modelled time at {} rows on {} SMs: {} ({} CTAs/SM at {:.0f}% of peak)", T, sms,
                                tiling_name(*best, best_kb), best->ctas_per_sm, best->eff * 100);
  if (second)
    why += fmt::format(", {:.0f}% faster than {}", (second_time / best_time - 1) * 100, tiling_name(*second, second_kb));
  return {gemm_q8_0_tiled_variant(planes, best->bn, best->bt, best->tn, best->tt, best_kb, best->sk), why};
}

}  // namespace

std::vector<KernelRange> choose_matmul_q8_0(int64_t k, int64_t n, int64_t min_rows, int64_t max_rows, int sms,
                                           int64_t planes, const MatmulTuning& t) {
  if (min_rows < 1 || max_rows < min_rows)
    throw KernelError(fmt::format("matmul_q8_0: rows {}..{}", min_rows, max_rows));
  std::vector<KernelRange> out;
  for (int64_t T = min_rows; T <= max_rows; ++T) {
    auto [v, why] = choose_one(k, n, T, sms, planes, t);
    if (!out.empty() && out.back().parts[0][0] == v) {
      out.back().last = T;
      continue;
    }
    out.push_back({T, T, {{std::move(v)}}, std::move(why)});
  }
  return out;
}

Variant matmul_q8_0_choice(int64_t k, int64_t n, int64_t T, int sms, int64_t planes, const MatmulTuning& t) {
  return choose_one(k, n, T, sms, planes, t).first;
}

std::vector<Variant> matmul_q8_0_variants(int64_t k, int64_t n, int64_t max_t, int sms, int64_t planes, int64_t min_t,
                                          const MatmulTuning& t) {
  std::vector<Variant> out;
  for (const KernelRange& r : choose_matmul_q8_0(k, n, min_t, max_t, sms, planes, t))
    if (std::find(out.begin(), out.end(), r.parts[0][0]) == out.end()) out.push_back(r.parts[0][0]);
  return out;
}

Variant gemv_q8_0_variant(int64_t k, int64_t planes) { return gemv_q8_0_variant(k, planes, default_tuning(90).matmul); }

namespace {

struct WqType {
  int64_t id;
  const char* format;
  WqLayout layout;
};
// Block values and bytes as ggml defines them; the quant range A of each block as templates/qrig_wtypes.cuh
// reads it (qs, with Q3_K's hmask / Q5_K's qh / Q6_K's qh next to it), the rest of the block being B.
constexpr WqType kWqTypes[] = {
    {2, "q4_0", {32, 18, 2, 16}},      {3, "q4_1", {32, 20, 4, 16}},      {6, "q5_0", {32, 22, 6, 16}},
    {7, "q5_1", {32, 24, 8, 16}},      {10, "q2_k", {256, 84, 16, 64}},   {11, "q3_k", {256, 110, 0, 96}},
    {12, "q4_k", {256, 144, 16, 128}}, {13, "q5_k", {256, 176, 16, 160}}, {14, "q6_k", {256, 210, 0, 192}},
    {20, "iq4_nl", {32, 18, 2, 16}},   {23, "iq4_xs", {256, 136, 8, 128}}};

const WqType* wq_type(int64_t id) {
  for (const WqType& t : kWqTypes)
    if (t.id == id) return &t;
  return nullptr;
}

}  // namespace

WqLayout wq_layout(int64_t ggml_type) {
  const WqType* t = wq_type(ggml_type);
  if (!t) throw KernelError(fmt::format("weight type {}: the dp4a family has no kernels for it", ggml_type));
  return t->layout;
}

int64_t wq_device_bytes(int64_t ggml_type, int64_t rows, int64_t cols) {
  const WqLayout l = wq_layout(ggml_type);
  if (rows <= 0 || cols <= 0 || cols % l.block_values != 0)
    throw KernelError(fmt::format("weight type {}: [{}][{}] is not rows of whole {}-value blocks", ggml_type, rows,
                                  cols, l.block_values));
  return rows * (cols / l.block_values) * l.block_bytes;
}

bool wq_dp4a_type(int64_t ggml_type) { return wq_type(ggml_type) != nullptr; }

int64_t wq_block_values(int64_t ggml_type) { return wq_layout(ggml_type).block_values; }

int64_t wq_type_of_format(const std::string& format) {
  for (const WqType& t : kWqTypes)
    if (format == t.format) return t.id;
  return -1;
}

Variant gemm_wq_skinny_variant(int64_t ggml_type, int64_t planes, int64_t cols, int64_t rows_per_warp,
                               int64_t threads) {
  auto pow2 = [](int64_t v) { return v > 0 && (v & (v - 1)) == 0; };
  if (!wq_dp4a_type(ggml_type))
    throw KernelError(fmt::format("gemm_wq_dp4a_skinny: weight type {} has no dp4a decode", ggml_type));
  if (!pow2(cols) || !pow2(rows_per_warp) || cols * rows_per_warp > 32)
    throw KernelError(fmt::format("gemm_wq_dp4a_skinny: {} tokens and {} rows per warp must be powers of two with "
                                  "at most 32 sums per lane", cols, rows_per_warp));
  return make_variant("gemm_wq_dp4a_skinny",
                      {{"w", ggml_type}, {"p", planes}, {"c", cols}, {"r", rows_per_warp}, {"t", threads}});
}

Variant gemv_wq_variant(int64_t ggml_type, int64_t planes, int64_t rows, int64_t split, int64_t unroll,
                        int64_t threads) {
  if (!wq_dp4a_type(ggml_type))
    throw KernelError(fmt::format("gemv_wq_dp4a: weight type {} has no dp4a decode", ggml_type));
  if (rows < 1 || rows > 4 || split < 1 || split > 8 || (split & (split - 1)) != 0 || unroll < 1 || unroll > 4 ||
      threads % (32 * split) != 0 || threads > 1024)
    throw KernelError(fmt::format("gemv_wq_dp4a: {} rows per group, {} warps per row, {} units in flight, {} threads",
                                  rows, split, unroll, threads));
  return make_variant("gemv_wq_dp4a", {{"w", ggml_type},
                                       {"p", planes},
                                       {"r", rows},
                                       {"s", split},
                                       {"u", unroll},
                                       {"t", threads}});
}

Variant gemv_wq_k4_variant(int64_t ggml_type, int64_t planes, int64_t rows, int64_t threads) {
  if (ggml_type != 12 && ggml_type != 13)
    throw KernelError(fmt::format("gemv_wq_k4_dp4a: weight type {} is not Q4_K or Q5_K", ggml_type));
  if (rows < 1 || rows > 4 || threads % 32 != 0 || threads < 32 || threads > 1024)
    throw KernelError(fmt::format("gemv_wq_k4_dp4a: {} rows per warp, {} threads", rows, threads));
  return make_variant("gemv_wq_k4_dp4a", {{"w", ggml_type}, {"p", planes}, {"r", rows}, {"t", threads}});
}

bool is_wq_gemv(std::string_view kernel) { return kernel == "gemv_wq_dp4a" || kernel == "gemv_wq_k4_dp4a"; }

std::vector<Variant> gemv_wq_sweep(int64_t ggml_type, int64_t planes) {
  struct Rsut {
    int64_t r, s, u, t;
  };
  std::vector<Variant> out;
  for (const Rsut& v : std::vector<Rsut>{{1, 1, 2, 128}, {2, 1, 1, 128}, {1, 2, 1, 128}, {1, 2, 2, 128},
                                         {2, 2, 1, 128}, {1, 4, 1, 128}, {1, 4, 2, 128}, {2, 4, 1, 128},
                                         {1, 4, 1, 256}, {2, 4, 2, 256}, {1, 8, 1, 256}, {1, 2, 4, 256}})
    out.push_back(gemv_wq_variant(ggml_type, planes, v.r, v.s, v.u, v.t));
  if (ggml_type == 12 || ggml_type == 13)  // the sub-block-pair kernel (not measured yet: not in the tuning table)
    for (const auto& [r, t] : std::vector<std::pair<int64_t, int64_t>>{{1, 128}, {2, 128}, {4, 128}, {2, 256}})
      out.push_back(gemv_wq_k4_variant(ggml_type, planes, r, t));
  return out;
}

// Mirrors the template: [32][bn+4] codes, per plane [32][bt+4] tokens, [8][bn] scales, [4][bt] activation
// scales, and with offsets [8][bn] offsets and [8][bt] zx, in 4-byte words.
int64_t gemm_wq_tiled_smem_bytes(int64_t ggml_type, int64_t planes, int64_t bn, int64_t bt) {
  const WqType* t = wq_type(ggml_type);
  const bool has_min = t && (t->id == 3 || t->id == 7 || t->id == 10 || t->id == 12 || t->id == 13);
  return 4 * (32 * (bn + 4) + planes * 32 * (bt + 4) + 8 * bn + 4 * bt + (has_min ? 8 * bn + 8 * bt : 0));
}

Variant gemm_wq_tiled_variant(int64_t ggml_type, int64_t planes, int64_t bn, int64_t bt, int64_t tn, int64_t tt) {
  if (!wq_dp4a_type(ggml_type))
    throw KernelError(fmt::format("gemm_wq_dp4a_tiled: weight type {} has no dp4a decode", ggml_type));
  if (tn <= 0 || tt <= 0 || bn % (8 * tn) != 0 || bt % (4 * tt) != 0)
    throw KernelError(fmt::format("gemm_wq_dp4a_tiled: a {} x {} CTA tile is not whole warp tiles of {} x {}", bn, bt,
                                  8 * tn, 4 * tt));
  const int64_t smem = gemm_wq_tiled_smem_bytes(ggml_type, planes, bn, bt);
  if (smem > kTiledSmemLimit)
    throw KernelError(fmt::format("gemm_wq_dp4a_tiled: a {} x {} tile with {} plane(s) needs {} bytes of shared "
                                  "memory (at most {})", bn, bt, planes, smem, kTiledSmemLimit));
  return make_variant("gemm_wq_dp4a_tiled", {{"w", ggml_type},
                                             {"p", planes},
                                             {"bn", bn},
                                             {"bt", bt},
                                             {"tn", tn},
                                             {"tt", tt},
                                             {"t", (bn / tn) * (bt / tt)}});
}

namespace {

// The block-type kernel for exactly T rows, and why.
std::pair<Variant, std::string> choose_one_wq(const WqType& wt, int64_t k, int64_t n, int64_t T, int sms,
                                              int64_t planes, const MatmulTuning& tun) {
  const int64_t type = wt.id;
  // One row: the GEMV with the type's tuning entry. Up to wq_skinny_max_rows rows: the skinny kernel of the
  // next power of two, 2 rows per warp up to 4 tokens, 1 beyond (session 7's tiling).
  auto skinny = [&](int64_t c) { return gemm_wq_skinny_variant(type, planes, c, c <= 4 ? 2 : 1); };
  if (T == 1) {
    const WqGemvTiling& g = tun.wq_gemv_for(type);
    if (g.split == -1)
      return {gemv_wq_k4_variant(type, planes, g.rows, g.threads),
              fmt::format("one row: the {} sub-block-pair GEMV, {} rows per warp (tuning: the fastest for this type "
                          "in the H200 sweep)", wt.format, g.rows)};
    if (g.split == 0)
      return {gemm_wq_skinny_variant(type, planes, 1, g.rows, g.threads),
              fmt::format("one row: the {} skinny kernel as GEMV, {} rows per warp (tuning: the fastest for this "
                          "type in the H200 sweep)", wt.format, g.rows)};
    return {gemv_wq_variant(type, planes, g.rows, g.split, g.unroll, g.threads),
            fmt::format("one row: the {} GEMV, each row's units split over {} warps, {} rows per group, the loads "
                        "of {} units per lane in flight (tuning: {})", wt.format, g.split, g.rows, g.unroll,
                        g.type == type ? "this type's entry" : "the default entry")};
  }
  int64_t widest = 1;
  while (widest * 2 <= tun.wq_skinny_max_rows) widest *= 2;
  if (T <= widest) {
    int64_t c = 2;
    while (c < T) c *= 2;
    return {skinny(c), fmt::format("{} rows or fewer: the {} skinny GEMM reads every weight once for all rows", c,
                                   wt.format)};
  }
  if (k % 128 != 0 || tun.wq_tiled[planes - 1].empty())
    return {skinny(widest),
            fmt::format("the {} skinny GEMM on tiles of {} rows (the tiled GEMM takes rows of a multiple of 128 "
                        "values; the weights are read once per {} rows)", wt.format, widest, widest)};
  const GemmTiling* best = nullptr;
  double best_time = 0;
  for (const GemmTiling& t : tun.wq_tiled[planes - 1]) {
    if (gemm_wq_tiled_smem_bytes(type, planes, t.bn, t.bt) > kTiledSmemLimit) continue;
    const double time = modelled_time(t, n, T, sms, planes, tun.partial_exponent);
    if (!best || time < best_time) best = &t, best_time = time;
  }
  if (!best) throw KernelError(fmt::format("matmul_{}: no tiling of the tiled GEMM fits", wt.format));
  return {gemm_wq_tiled_variant(type, planes, best->bn, best->bt, best->tn, best->tt),
          fmt::format("more than {} rows: the {} tiled GEMM decodes each weight tile once per {} tokens; least "
                      "modelled time at {} rows on {} SMs: {}x{} (thread tile {}x{}, {} CTAs/SM at an estimated "
                      "{:.0f}% of peak)", tun.wq_skinny_max_rows, wt.format, best->bt, T, sms, best->bn, best->bt,
                      best->tn, best->tt, best->ctas_per_sm, best->eff * 100)};
}

}  // namespace

std::vector<KernelRange> choose_matmul_wq(int64_t ggml_type, int64_t k, int64_t n, int64_t min_rows, int64_t max_rows,
                                          int64_t planes, int sms, const MatmulTuning& t) {
  const WqType* wt = wq_type(ggml_type);
  if (!wt) throw KernelError(fmt::format("matmul: weight type {} has no dp4a kernels", ggml_type));
  if (k <= 0 || k % wt->layout.block_values != 0 || n <= 0 || planes < 1 || planes > 2 || sms <= 0)
    throw KernelError(fmt::format("matmul_{}: no kernel for [{}] -> [{}] (rows must be whole {}-value blocks) with {} "
                                  "planes", wt->format, k, n, wt->layout.block_values, planes));
  if (min_rows < 1 || max_rows < min_rows) throw KernelError(fmt::format("matmul_{}: rows {}..{}", wt->format, min_rows, max_rows));
  std::vector<KernelRange> out;
  for (int64_t T = min_rows; T <= max_rows; ++T) {
    auto [v, why] = choose_one_wq(*wt, k, n, T, sms, planes, t);
    if (!out.empty() && out.back().parts[0][0] == v) {
      out.back().last = T;
      continue;
    }
    out.push_back({T, T, {{std::move(v)}}, std::move(why)});
  }
  return out;
}

bool wq_stack_view_aligned(int64_t ggml_type, int64_t cols, int64_t rows_before) {
  const WqLayout l = wq_layout(ggml_type);
  if (cols <= 0 || cols % l.block_values != 0 || rows_before < 0)
    throw KernelError(fmt::format("weight type {}: rows of {} values are not whole {}-value blocks", ggml_type, cols,
                                  l.block_values));
  return rows_before * (cols / l.block_values) * l.b_bytes() % 16 == 0;
}

void check_wq_stack(int64_t ggml_type, int64_t cols, const std::vector<int64_t>& member_rows) {
  const WqType* wt = wq_type(ggml_type);
  if (!wt) throw KernelError(fmt::format("stack: weight type {} has no dp4a kernels", ggml_type));
  if (member_rows.size() < 2 || member_rows.size() > 4)
    throw KernelError(fmt::format("stack: {} members (2 to 4 are stacked)", member_rows.size()));
  int64_t before = 0;
  for (size_t m = 0; m < member_rows.size(); ++m) {
    if (member_rows[m] <= 0) throw KernelError(fmt::format("stack: member {} has {} rows", m, member_rows[m]));
    if (!wq_stack_view_aligned(ggml_type, cols, before))
      throw KernelError(fmt::format("stack of {} weights: member {} would start {} x {} scale bytes into the stacked "
                                    "matrix, not 16-byte aligned (its own kernels read it from there); stack it "
                                    "elsewhere or not at all", wt->format, m, before,
                                    (cols / wt->layout.block_values) * wt->layout.b_bytes()));
    before += member_rows[m];
  }
}

KernelRange choose_matmul_stack_wq(int64_t ggml_type, int64_t k, int64_t rows, int64_t members, int64_t planes,
                                   int sms, const MatmulTuning& t) {
  KernelRange r = choose_matmul_wq(ggml_type, k, rows, 1, 1, planes, sms, t).at(0);
  const std::string own = r.reason.rfind("one row: ", 0) == 0 ? r.reason.substr(9) : r.reason;
  r.reason = fmt::format("one row: one launch over the {} stacked weights, each member's rows to its own result: {}",
                         members, own);
  return r;
}

}  // namespace qrig::kernels
