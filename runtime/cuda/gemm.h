// Q8_0 x int8 matrix multiplication for any number of activation rows (prefill GEMM, and the multi-row
// decode of several sequences): Y[T][n] = X[T][k] W[n][k]^T, with W repacked Q8_0 (launch.h Q8Matrix) and X
// quantized by quant_act_q8 (int8 xq [T][k] row-major, f32 xd [T][k/32]). CPU reference: cpu::matmul on the
// same weights and the dequantized activation. Default family: dp4a only (no tensor cores, sm_70 material).
//
// Planes: every kernel here comes in two forms, `planes` = 1 (the activation is d * q, int8 q) and 2 (the
// precise matmuls: quant_act_q8 p2 also writes the residual's plane q2, int8 [T][k] laid out like xq, and the
// activation is d * (q + q2/254), ~15 bits). With two planes a kernel does twice the dp4a and adds the two
// integer sums of a block (a 16-byte piece in the skinny kernel and the GEMV) as fmaf(s2, 1/254, s1) before
// scaling; the order of the float additions is the one-plane order. The tiled kernel stages the second plane
// like the first (more shared memory and registers: gemm.cpp picks among the tilings that fit, with their own
// occupancy).
//
// Determinism: every kernel adds each output's terms in a fixed order, so a run repeats bit for bit. A row's
// result does not depend on the other rows of the batch, but the order (and so the last bits) depends on the
// kernel MatmulQ8 picks for T: the GEMV (T = 1), the skinny kernel (T <= kSkinnyMaxT: per-lane sums over the
// K vectors, then butterflies) and the tiled kernel (per output in K-block order; with sliced K, per slice
// then slices in order). All tiled tilings with one K slice give identical bits, so e.g. prefill chunks of
// 512 and 1024 rows agree exactly; T = 1 and T = 2 can differ in the last bits (rel. ~1e-7).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/cuda/launch.h"

namespace qrig::cuda {

// The two GEMM templates (MatmulQ8 picks among their tilings; tests and benchmarks use them directly):
//   gemm_q8_0_dp4a_tiled   CTA tile bn weight rows x bt tokens, thread tile tn x tt, kb Q8_0 blocks per stage
//                          and K slice, sk K slices (thread groups adding up at the end), sk*(bn/tn)*(bt/tt)
//                          threads: the prefill GEMM
//   gemm_q8_0_dp4a_skinny  up to `cols` tokens, `rows_per_warp` weight rows per warp, every weight read once:
//                          batched decode and short prefills
// A tiled variant whose two pipeline stages do not fit the kernel's 48 KiB of static shared memory is refused
// (KernelError), like tiles that are not whole warp tiles.
Variant gemm_q8_0_tiled_variant(int64_t planes, int64_t bn, int64_t bt, int64_t tn, int64_t tt, int64_t kb,
                                int64_t sk = 1);
Variant gemm_q8_0_skinny_variant(int64_t planes, int64_t cols, int64_t rows_per_warp, int64_t unroll, int64_t threads);
// Static shared memory of a tiled variant in bytes (what the template allocates), and the most it may use.
int64_t gemm_q8_0_tiled_smem_bytes(int64_t planes, int64_t bn, int64_t bt, int64_t kb, int64_t sk);
constexpr int64_t kTiledSmemLimit = 48 * 1024;

// Checked launchers: y [T][w.rows] f32 = xq/xd(/xq2) [T][w.cols] x w^T. The tiling and the number of planes
// come from the loaded variant. xq 16-byte aligned, xd 4, y 16; xq2 (the second plane, read only by p2
// variants, which require it) 16, may be null for p1. tiled: w.cols a multiple of 32*kb*sk. skinny: T <= cols.
void launch_gemm_q8_0_tiled(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                            const int8_t* xq2, int64_t T, float* y, cudaStream_t stream);
void launch_gemm_q8_0_skinny(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                             const int8_t* xq2, int64_t T, float* y, cudaStream_t stream);

// The variant MatmulQ8 runs for T rows of a [k] -> [n] matmul with `planes` activation planes on a GPU with
// `sms` SMs: the decode GEMV for T = 1, the skinny kernel for T <= kSkinnyMaxT, else the tiling of least
// modelled time (gemm.cpp).
constexpr int64_t kSkinnyMaxT = 16;
Variant matmul_q8_0_choice(int64_t k, int64_t n, int64_t T, int sms, int64_t planes);

// Every variant a [k] -> [n] matmul with `planes` planes may launch for T = min_t..max_t rows on a GPU with
// `sms` SMs (the plan precompiles them; the run never compiles). min_t > 1 when smaller steps go elsewhere
// (the executor's one-plane matmuls only run above plan.precise_rows rows).
std::vector<Variant> matmul_q8_0_variants(int64_t k, int64_t n, int64_t max_t, int sms, int64_t planes,
                                          int64_t min_t = 1);

// The kernels of one matmul shape and number of planes, loaded once; run() picks the variant for T (the GEMV
// for T = 1).
class MatmulQ8 {
 public:
  MatmulQ8(const KernelLoader& load, int64_t k, int64_t n, int64_t max_t, int sms, int64_t planes,
           int64_t min_t = 1);
  // y [T][n] f32 = xq/xd(/xq2) [T][k] x w^T. min_t <= T <= max_t. Device pointers; y 16-byte aligned; xq2 the
  // second plane (required with two planes, ignored with one).
  void run(const Q8Matrix& w, const int8_t* xq, const float* xd, const int8_t* xq2, int64_t T, float* y,
           cudaStream_t stream) const;
  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  int64_t planes() const { return planes_; }
  // The variant run() launches for T rows (tests, benchmarks).
  const Variant& variant_for(int64_t T) const { return kernels_[index_for(T)].variant; }

 private:
  size_t index_for(int64_t T) const;  // throws KernelError unless min_t <= T <= max_t

  int64_t k_, n_, max_t_, min_t_;
  int sms_;
  int64_t planes_;
  std::vector<LoadedKernel> kernels_;  // the implementation's choice of variants, in its order
  // (first T, index into kernels_), ascending: T in [first, next first) runs that kernel.
  std::vector<std::pair<int64_t, size_t>> by_t_;
};

}  // namespace qrig::cuda
