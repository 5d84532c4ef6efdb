// Top-k candidate selection for sampling (templates/topk_chunk_f32.cu, topk_merge_f32.cu): the variants the
// default family runs and the sizes of the buffers the selection needs (the memory pass plans them, the runtime
// allocates them), from the layouts of templates/qrig_topk.cuh.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/variant.h"

namespace qrig::kernels {

constexpr int32_t kTopMax = 64;                  // the most candidates per row the kernels select
constexpr int64_t kTopChunkStatsBytes = 24;      // struct QrigChunkStats
constexpr int64_t kTopRowOutBytes = 8 * kTopMax + 24;  // struct QrigRowOut
constexpr int64_t kLogitAdjustBytes = 12;        // struct QrigLogitAdjust (= runtime::LogitAdjust)

// The chunk-select and row-merge variants (they do not depend on the vocabulary).
std::vector<Variant> top_k_variants();
// Ids per chunk block of the chunk kernel (e * t).
int64_t top_k_chunk_ids();

// Device bytes of the selection for rows of `vocab_real` real ids, up to max_rows rows per step and up to
// adjust_per_row logit adjustments (bias and penalties) per row: chunk candidates, chunk statistics, row
// results and the row parameters.
struct TopKBuffers {
  int64_t chunk_top = 0, chunk_stats = 0, row_out = 0, inputs = 0;
  int64_t total() const { return chunk_top + chunk_stats + row_out + inputs; }
};
TopKBuffers top_k_buffers(int64_t vocab_real, int64_t max_rows, int64_t adjust_per_row);
// The rows a step's selection covers: every output row of the step (a selection runs over rows 0..R-1 of its
// logits), which is one per sequence at most, except in a plan that drafts, where a verify step asks for k + 1.
inline int64_t top_k_rows(int64_t max_logit_rows, int64_t max_sequences, int64_t draft_tokens) {
  return draft_tokens > 0 ? max_logit_rows : (max_logit_rows < max_sequences ? max_logit_rows : max_sequences);
}

}  // namespace qrig::kernels
