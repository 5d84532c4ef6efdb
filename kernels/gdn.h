// Gated DeltaNet kernels of the default family (QWEN35.md steps 3-5; CPU references cpu::gdn_recurrent and
// cpu::gdn_chunked): a recurrent kernel for short steps (decode: fewer tokens per sequence than the tuning's
// gdn_recurrent_below) and the chunked algorithm for prefill (KERNELS.md "Chunked Gated DeltaNet": a parallel
// prep over (value head, chunk), then a scan over chunks parallel over (value head, value-column tile)).
// Variants, the validity rules of their tilings (the templates' static_asserts, also checked by the runtime on
// what a plan names), the workspace the chunked pair needs, and the choice per tokens-per-sequence range.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/choice.h"
#include "kernels/tuning.h"
#include "kernels/variant.h"

namespace qrig::kernels {

struct GdnDims {
  int64_t Hk = 0, Hv = 0, dk = 0, dv = 0;
};

// Throws KernelError unless the kernels take these dims and chunk length (Hv a multiple of Hk, chunk 16..64).
void gdn_check_dims(const GdnDims& d, int64_t chunk);
// The templates' static_asserts for a tiling (scan: ct columns per block, t threads; recurrent: cw columns per
// warp), shared memory included.
bool gdn_scan_tiling_ok(const GdnDims& d, int64_t chunk, int64_t ct, int64_t t);
bool gdn_recurrent_tiling_ok(const GdnDims& d, int64_t cw, int64_t t);

// batched 1: the variant that runs a decode step's sequences (one token each) in one launch (templates/gdn_recurrent.cu).
Variant gdn_recurrent_variant(const GdnDims& d, int64_t batched = 0);
Variant gdn_chunk_prep_variant(const GdnDims& d, int64_t chunk);
Variant gdn_chunk_scan_variant(const GdnDims& d, int64_t chunk);

// Device scratch of the chunked pair for up to max_t tokens of one sequence (0 when max_t <= 0).
int64_t gdn_workspace_bytes(const GdnDims& d, int64_t chunk, int64_t max_t);

// The kernels for 1..max_tokens tokens of one sequence: the recurrent kernel below t.gdn_recurrent_below,
// the chunked pair (prep + scan) from there.
std::vector<KernelRange> choose_gdn(const GdnDims& d, int64_t chunk, int64_t max_tokens, const Tuning& t);

// Decode steps of 1..max_seqs sequences of one token each (the op's decode_kernel attribute): one sequence runs the
// recurrent kernel as choose_gdn has it, 2..max_seqs its batched variant in one launch. Empty when one token runs
// the chunked pair (a tuning with gdn_recurrent_below <= 1): every sequence then runs on its own.
std::vector<KernelRange> choose_gdn_decode(const GdnDims& d, int64_t chunk, int64_t max_seqs, const Tuning& t);

// The three variants of these dims (recurrent, chunk prep, chunk scan), for tools and tests.
std::vector<Variant> gdn_variants(const GdnDims& d, int64_t chunk);

}  // namespace qrig::kernels
