// Tuning data: the measured numbers the choice functions of this library model a GPU with (GEMM tiling
// efficiencies, which skinny tiling serves how many rows, the GEMV tiling, blocks resident per SM of the
// attention kernels, where the recurrent GDN stops paying). They are rig data, not code: defaults per
// architecture live here (fitted on one H200, sm_90, and said so for every other architecture), and a rig
// file may replace any of them (compiler/rig.cpp reads a [tuning] section; `qrig inspect` shows which
// source a plan used).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qrig::kernels {

// A tiling of the tiled Q8_0 GEMM with its modelled throughput: `ctas_per_sm` CTAs fit one SM (registers and
// shared memory), and an SM full of them runs at `eff` of the dp4a peak. kb is the preferred Q8_0 blocks per
// stage and K slice (1 when K does not allow it).
struct GemmTiling {
  int64_t bn = 0, bt = 0, tn = 0, tt = 0, kb = 0, sk = 0;
  int64_t ctas_per_sm = 0;
  double eff = 0;
};

// The skinny GEMM tiling for steps of at most `max_rows` rows (c = max_rows tokens per launch).
struct SkinnyTiling {
  int64_t max_rows = 0, rows_per_warp = 0, unroll = 0, threads = 0;
};

// The block types' decode GEMV (gemv_wq_dp4a) for one ggml weight type: rows per warp group, warps per row,
// units per lane whose loads are issued before use, threads per block; split 0: the skinny kernel with c = 1 and
// `rows` rows per warp instead; split -1 (Q4_K, Q5_K): gemv_wq_k4_dp4a with `rows` rows per warp.
struct WqGemvTiling {
  int64_t type = 0, rows = 1, split = 4, unroll = 1, threads = 128;
};

struct MatmulTuning {
  std::vector<GemmTiling> tiled[2];  // by activation planes - 1
  double partial_exponent = 0.3;     // a last round of c < ctas_per_sm CTAs runs at eff * (c/ctas_per_sm)^this
  int64_t skinny_max_rows = 16;      // steps of 2..this many rows run the skinny kernel, longer ones tiled
  std::vector<SkinnyTiling> skinny;  // ascending max_rows; the last one covers skinny_max_rows
  int64_t gemv_rows_per_warp = 1, gemv_unroll = 2, gemv_threads = 256;
  // The GGUF block types other than Q8_0 (kernels/matmul.h choose_matmul_wq): the GEMV per type (a type not
  // listed takes wq_gemv_default), the skinny kernel for 2..wq_skinny_max_rows rows, and the tilings of their
  // tiled GEMM for longer steps, by planes - 1 (kb and sk unused: one 128-value stage).
  std::vector<WqGemvTiling> wq_gemv;
  WqGemvTiling wq_gemv_default;
  const WqGemvTiling& wq_gemv_for(int64_t type) const;
  int64_t wq_skinny_max_rows = 16;
  std::vector<GemmTiling> wq_tiled[2];
};

// Blocks of each attention kernel resident per SM (the split-KV count is sized from them). Keys "decode_g<G>_n<N>"
// and "prefill_g<G>_h<H>" of the variants' parameters; a kernel not listed counts `fallback_*`.
struct AttentionTuning {
  std::vector<std::pair<std::string, int64_t>> resident;
  int64_t fallback_decode = 2, fallback_prefill = 3;
  int64_t resident_of(const std::string& key, bool decode) const;
};

struct Tuning {
  std::string source;                 // where these numbers come from (shown in notes and inspect)
  MatmulTuning matmul;
  AttentionTuning attention;
  int64_t gdn_recurrent_below = 64;   // GDN steps of fewer tokens per sequence run the recurrent kernel
};

// The defaults for a feature-set architecture (70, 75, 80, 86, 89, 90, ...): the H200 fit for every one of
// them (the source says so when the architecture is not sm_90).
Tuning default_tuning(int sm);

}  // namespace qrig::kernels
