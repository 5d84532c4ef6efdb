// GPU top-k candidate selection for sampling: the sampler's logit bias and penalties (runtime/sampler.h,
// steps 2-3) applied to rows of logits in device memory, then per row the K <= kTopMax best candidates
// (larger logit first, then lower id) and the row's statistics (candidate and +inf counts, max, log-sum-exp),
// so that the host receives K (logit, id) pairs per row instead of the whole vocabulary and finishes with
// Sampler::pick_top(), bit-identical to Sampler::pick() on the full logits whenever Sampler::top_suffices().
// CPU reference: runtime::Sampler::top_candidates (ids, logits and counts exact; lse to ~1e-7 relative).
//
// Two kernels (templates/topk_chunk_f32.cu, templates/topk_merge_f32.cu, header comments there): a grid of
// (chunk of 2048 ids, row) blocks that adjust their chunk in shared memory and radix-select its best K,
// then one block per row that merges the chunk lists with bitonic merges. The logits are only read: a row
// the candidates cannot decide (Sampler::top_suffices false) falls back to downloading the unchanged
// logits and Sampler::pick(). Results are deterministic (every list is a set of unique keys; every sum has
// a fixed order). Default family: no tensor cores, nothing newer than sm_70.
//
// Use: enqueue() on the stream that produced the logits (after them), then collect(), which synchronises
// that stream and decodes; one enqueue() at a time (the host staging buffers are reused).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/sampling.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/launch.h"
#include "runtime/sampler.h"

namespace qrig::cuda {

// The most candidates per row the kernels select.
constexpr int32_t kTopMax = kernels::kTopMax;

// One row of a selection: how many candidates, and the sampler's steps 2-3 for it.
struct TopKRow {
  int32_t k = 1;  // 1..kTopMax
  float repetition_penalty = 1.0f, frequency_penalty = 0.0f, presence_penalty = 0.0f;
  std::vector<runtime::LogitAdjust> adjust;  // sorted by id, each id once, ids in [0, vocab_real)
};

// The row a sampler asks for: k candidates, its penalties and Sampler::adjustments().
TopKRow top_k_row(const runtime::Sampler& s, int32_t k);

class TopKSelector {
 public:
  // Rows of vocab_rows logits (the row stride) of which the first vocab_real are real tokens; up to
  // max_rows rows per enqueue(), each with at most adjust_per_row adjustments (what the plan sized the buffers
  // for: kernels::top_k_buffers). variants: the chunk-select and row-merge kernels the plan names. Device
  // buffers on `device`, exactly kernels::top_k_buffers(vocab_real, max_rows, adjust_per_row).total() bytes.
  TopKSelector(const KernelLoader& load, const std::vector<std::string>& variants, int device, int64_t vocab_rows,
               int64_t vocab_real, int64_t max_rows, int64_t adjust_per_row);
  TopKSelector(const TopKSelector&) = delete;
  TopKSelector& operator=(const TopKSelector&) = delete;

  // Whether a row's adjustments fit the buffers (a row that does not is sampled on the host from its logits).
  bool fits(const TopKRow& row) const { return (int64_t)row.adjust.size() <= adjust_per_row_; }
  int64_t device_bytes() const;  // what the selector allocated on the device

  // Queues the selection of logits [rows.size()][vocab_rows] (device memory, 4-byte aligned, read only) on
  // `stream`: the upload of the rows' parameters, both kernels and the download of the results. Throws
  // KernelError on bad arguments (row count, k, unsorted or out-of-range adjustments, a row that does not fit)
  // and when the previous enqueue() was not collected.
  void enqueue(const float* logits, const std::vector<TopKRow>& rows, StreamHandle stream);
  // Synchronises `stream` (the one given to enqueue) and returns per row its min(k, n_cand) best candidates
  // and statistics.
  std::vector<runtime::TopCandidates> collect(StreamHandle stream);
  bool pending() const { return pending_rows_ > 0; }

  // Tests: fill every device and host output buffer with 0xFF bytes (synchronous), so that anything the
  // kernels fail to write shows up.
  void poison_outputs();

  int64_t n_chunks() const { return n_chunks_; }

 private:
  LoadedKernel chunk_kernel_, merge_kernel_;
  int device_;
  int64_t vocab_rows_, vocab_real_, max_rows_, adjust_per_row_, n_chunks_;
  DeviceBuffer<unsigned long long> chunk_top_;  // [max_rows][n_chunks][kTopMax]
  DeviceBuffer<unsigned char> chunk_stats_;     // [max_rows][n_chunks] chunk statistics (24 bytes each)
  DeviceBuffer<unsigned char> row_out_;         // [max_rows] row results
  DeviceBuffer<unsigned char> inputs_;          // penalties, chunk ranges, adjustments
  PinnedBuffer staging_in_, staging_out_;
  int64_t pending_rows_ = 0;
  std::vector<int32_t> pending_k_;
};

}  // namespace qrig::cuda
