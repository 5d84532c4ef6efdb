// Q8_0 x int8 matrix multiplication kernels of the default family (dp4a, no tensor cores): the activation
// quantizer (quant_act_q8), the decode GEMV, the skinny GEMM for a few rows and the tiled prefill GEMM; their
// variants, the facts the runtime needs to launch them (shared memory of a tiling), and the choice of kernel
// per number of rows with its cost model (matmul.cpp's header says how it was fitted).
//
// Planes: every matmul kernel comes in two forms, `p` = 1 (the activation is d * q, int8 q) and 2 (quant_act_q8
// p2 also writes the residual's plane q2: the activation is d * (q + q2/254), ~15 bits). Two planes double the
// dp4a; matmuls bound by their weight bytes (decode) pay almost nothing for them.
//
// Determinism: every kernel adds each output's terms in a fixed order, so a run repeats bit for bit. A row's
// result does not depend on the other rows of the batch, but the order (and so the last bits) depends on the
// kernel chosen for the number of rows: the GEMV (1 row), the skinny kernel (up to skinny_max_rows) and the
// tiled kernel (per output in K-block order; with sliced K, per slice then slices in order). All tiled tilings
// with one K slice give identical bits, so e.g. prefill chunks of 512 and 1024 rows agree exactly.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/choice.h"
#include "kernels/tuning.h"
#include "kernels/variant.h"

namespace qrig::kernels {

// Activation rows -> int8 + f32 scale per 32 values, with p = 2 the second plane too.
Variant quant_act_q8_variant(int64_t planes);
// Decode GEMV: repacked Q8_0 [n][k] x quantized activation [k].
Variant gemv_q8_0_variant(int64_t k, int64_t planes, int64_t rows_per_warp, int64_t unroll, int64_t threads);
Variant gemv_q8_0_variant(int64_t k, int64_t planes, const MatmulTuning& t);
// The tiled GEMM: CTA tile bn weight rows x bt tokens, thread tile tn x tt, kb Q8_0 blocks per stage and K
// slice, sk K slices (thread groups adding up at the end), sk*(bn/tn)*(bt/tt) threads. A tiling whose two
// pipeline stages do not fit the kernel's 48 KiB of static shared memory is refused (KernelError), like tiles
// that are not whole warp tiles.
Variant gemm_q8_0_tiled_variant(int64_t planes, int64_t bn, int64_t bt, int64_t tn, int64_t tt, int64_t kb,
                                int64_t sk = 1);
// The skinny GEMM: up to `cols` tokens, `rows_per_warp` weight rows per warp, every weight read once.
Variant gemm_q8_0_skinny_variant(int64_t planes, int64_t cols, int64_t rows_per_warp, int64_t unroll, int64_t threads);
// Static shared memory of a tiled variant in bytes (what the template allocates), and the most it may use.
int64_t gemm_q8_0_tiled_smem_bytes(int64_t planes, int64_t bn, int64_t bt, int64_t kb, int64_t sk);
constexpr int64_t kTiledSmemLimit = 48 * 1024;

// The kernel for every row count min_rows..max_rows on a GPU with `sms` SMs: the GEMV for 1 row, the skinny
// kernel up to t.skinny_max_rows, else the tiling of least modelled time. Consecutive row counts with the same
// kernel form one range. Throws KernelError for shapes no kernel takes (k not a multiple of 32, ...).
std::vector<KernelRange> choose_matmul_q8_0(int64_t k, int64_t n, int64_t min_rows, int64_t max_rows, int sms,
                                           int64_t planes, const MatmulTuning& t);

// Conveniences over choose_matmul_q8_0 for tools, tests and benchmarks (the compiler uses the ranges): the
// kernel for exactly T rows, and every distinct kernel for min_t..max_t rows, in order of first use; both with
// the given tuning (default: the sm_90 defaults). The GEMV with the default tiling for k.
Variant matmul_q8_0_choice(int64_t k, int64_t n, int64_t T, int sms, int64_t planes,
                           const MatmulTuning& t = default_tuning(90).matmul);
std::vector<Variant> matmul_q8_0_variants(int64_t k, int64_t n, int64_t max_t, int sms, int64_t planes,
                                          int64_t min_t = 1, const MatmulTuning& t = default_tuning(90).matmul);
Variant gemv_q8_0_variant(int64_t k, int64_t planes);

// The GGUF weight types other than Q8_0 (templates/qrig_wtypes.cuh): Q4_0, Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K,
// IQ4_NL, IQ4_XS, by ggml type id; and their values per block (32 or 256).
bool wq_dp4a_type(int64_t ggml_type);
int64_t wq_block_values(int64_t ggml_type);
// Their device layout (runtime/cuda/q8_layout.h repack_wq): each GGUF block split into its quant bytes
// [a_offset, a_offset + a_bytes) (array A, a multiple of 16 bytes per block) and the rest (array B, the scales);
// the same bytes as the file. Throws KernelError for other types / shapes that are not whole blocks.
struct WqLayout {
  int64_t block_values = 0, block_bytes = 0, a_offset = 0, a_bytes = 0;
  int64_t b_bytes() const { return block_bytes - a_bytes; }
};
WqLayout wq_layout(int64_t ggml_type);
int64_t wq_device_bytes(int64_t ggml_type, int64_t rows, int64_t cols);
// The ggml type id of a plan's weight format name ("q4_k"), or -1 when the dp4a family has no kernels for it
// (q8_0 included: it has its own).
int64_t wq_type_of_format(const std::string& format);
// Their matmul for a few rows: up to `cols` tokens per launch (a power of two, 1 = the decode GEMV),
// rows_per_warp weight rows per warp; longer steps the tuning does not give to the tiled GEMM run it on tiles of
// `cols` tokens.
Variant gemm_wq_skinny_variant(int64_t ggml_type, int64_t planes, int64_t cols, int64_t rows_per_warp,
                               int64_t threads = 128);
// Their decode GEMV: each row's units split over `split` warps (a power of two <= 8), `rows` rows per group
// of warps, the loads of `unroll` units per lane in flight, `threads` a multiple of 32 * split.
Variant gemv_wq_variant(int64_t ggml_type, int64_t planes, int64_t rows, int64_t split, int64_t unroll,
                        int64_t threads);
// Q4_K / Q5_K only (templates/gemv_wq_k4_dp4a.cu): rows per warp, threads per block.
Variant gemv_wq_k4_variant(int64_t ggml_type, int64_t planes, int64_t rows, int64_t threads);
// Whether a kernel is one of the block types' one-row GEMVs with gemv_wq_dp4a's arguments (gemv_wq_dp4a,
// gemv_wq_k4_dp4a): one activation row, split outputs, grid ceil(rows / (r * t/32 / s)) (s = 1 for the K4 one).
bool is_wq_gemv(std::string_view kernel);
// The GEMV tilings (one plane, as block-type plans decode unless --precise-rows asks for two) among which the
// tuning table's per-type entry is chosen: what tests/gpu/test_gpu_wq.cpp's bandwidth benchmark measures (with both
// plane counts).
std::vector<Variant> gemv_wq_sweep(int64_t ggml_type, int64_t planes = 1);
// Their tiled GEMM (prefill): bn weight rows x bt tokens per CTA, tn x tt per thread, (bn/tn)*(bt/tt) threads;
// a tiling whose tiles pass the kernel's 48 KiB of static shared memory is refused (KernelError).
Variant gemm_wq_tiled_variant(int64_t ggml_type, int64_t planes, int64_t bn, int64_t bt, int64_t tn, int64_t tt);
int64_t gemm_wq_tiled_smem_bytes(int64_t ggml_type, int64_t planes, int64_t bn, int64_t bt);
// The kernel for every row count min_rows..max_rows of a [k] -> [n] matmul with these weights on a GPU with
// `sms` SMs: the GEMV for one row (per type from t.wq_gemv), the skinny kernel of the next power of two up to
// t.wq_skinny_max_rows rows, the tiled GEMM (the tiling of least modelled time) beyond when k is a multiple of
// 128, else the widest skinny kernel on tiles of its rows. Throws KernelError when k is not a multiple of the
// type's block.
std::vector<KernelRange> choose_matmul_wq(int64_t ggml_type, int64_t k, int64_t n, int64_t min_rows,
                                          int64_t max_rows, int64_t planes, int sms = 132,
                                          const MatmulTuning& t = default_tuning(90).matmul);

// Stacked block-type matrices (the compiler's matmul_stack over weights of one type): the members' repacked rows
// one after the other in one A and one B array, which is the repacked layout of one matrix of all their rows
// (repack_wq keeps whole rows in row order; nothing interleaves rows), so the single-row launch over the stack is
// the type's one-row kernel (gemv_wq_dp4a, gemv_wq_k4_dp4a or the skinny kernel with c = 1, by the tuning) with
// split outputs.
// Member m's own kernels (steps of more rows) read it through a view starting at its first row, which the
// launchers need 16-byte aligned in B: member_rows_before * (cols / block) * b_bytes must be a multiple of 16 (A
// always is). wq_stack_view_aligned says whether a member starting after `rows_before` rows is; check_wq_stack
// throws KernelError naming the first member that is not, or a shape that is not whole blocks.
bool wq_stack_view_aligned(int64_t ggml_type, int64_t cols, int64_t rows_before);
void check_wq_stack(int64_t ggml_type, int64_t cols, const std::vector<int64_t>& member_rows);
// The single-row launch over such a stack of `rows` rows in all: the one-row choice of choose_matmul_wq for the
// stacked shape, with its reason.
KernelRange choose_matmul_stack_wq(int64_t ggml_type, int64_t k, int64_t rows, int64_t members, int64_t planes,
                                   int sms = 132, const MatmulTuning& t = default_tuning(90).matmul);

}  // namespace qrig::kernels
