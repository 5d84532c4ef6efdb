// Top-k candidate selection kernels (sampling.h): registry entries, variants, buffer sizes.
#include "kernels/sampling.h"

#include "kernels/registry.h"

namespace qrig::kernels {

namespace {

// e8 t256: chunks of 2048 ids (122 blocks per row of a 248k vocabulary, one wave on most GPUs), 64 registers
// without spills, 4 blocks per SM; the merge runs 32 warps per row.
constexpr int64_t kChunkElems = 8, kChunkThreads = 256, kMergeThreads = 1024;

}  // namespace

std::vector<TemplateInfo> sampling_templates() {
  return {
      {"topk_chunk_f32", "topk_chunk_f32.cu",
       {{"e", "QRIG_ELEMS", 1, 32, 1, "logits per thread (a chunk is e * t ids, 64..8192)"}, threads_param()},
       "sampling: bias and penalties on a chunk of a logit row in shared memory, the chunk's best K candidates "
       "(radix select) and its statistics"},
      {"topk_merge_f32", "topk_merge_f32.cu",
       {threads_param()},
       "sampling: the best K candidates of a row from its chunk lists (bitonic merges), counts and log-sum-exp"},
  };
}

std::vector<Variant> top_k_variants() {
  return {make_variant("topk_chunk_f32", {{"e", kChunkElems}, {"t", kChunkThreads}}),
          make_variant("topk_merge_f32", {{"t", kMergeThreads}})};
}

int64_t top_k_chunk_ids() { return kChunkElems * kChunkThreads; }

TopKBuffers top_k_buffers(int64_t vocab_real, int64_t max_rows, int64_t adjust_per_row) {
  const int64_t chunks = (vocab_real + top_k_chunk_ids() - 1) / top_k_chunk_ids();
  const int64_t lists = max_rows * chunks;
  TopKBuffers b;
  b.chunk_top = lists * kTopMax * 8;
  b.chunk_stats = lists * kTopChunkStatsBytes;
  b.row_out = max_rows * kTopRowOutBytes;
  // Per row: 3 penalties (f32), chunk ranges of its adjustments (chunks + 1 int32), its adjustments.
  b.inputs = max_rows * (12 + 4 * (chunks + 1) + adjust_per_row * kLogitAdjustBytes);
  return b;
}

}  // namespace qrig::kernels
