// Registry entries, variants and the host side of the GPU top-k candidate selection (see sampling.h).
#include "runtime/cuda/sampling.h"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstring>

#include <fmt/format.h>


namespace qrig::cuda {

namespace {

// Host mirrors of the structs in templates/qrig_topk.cuh.
struct ChunkStats {
  float max;
  int32_t n_cand;
  int32_t n_pos_inf;
  int32_t pad;
  double sum;
};
static_assert(sizeof(ChunkStats) == kernels::kTopChunkStatsBytes && offsetof(ChunkStats, sum) == 16);

struct RowOut {
  uint64_t top[kTopMax];
  double lse;
  float max;
  int32_t n_cand;
  int32_t n_pos_inf;
  int32_t pad;
};
static_assert(sizeof(RowOut) == kernels::kTopRowOutBytes && offsetof(RowOut, lse) == 8 * kTopMax &&
              offsetof(RowOut, n_pos_inf) == 8 * kTopMax + 16);

// runtime::LogitAdjust is uploaded as it is: the layout of QrigLogitAdjust.
static_assert(sizeof(runtime::LogitAdjust) == kernels::kLogitAdjustBytes && offsetof(runtime::LogitAdjust, id) == 0 &&
              offsetof(runtime::LogitAdjust, bias) == 4 && offsetof(runtime::LogitAdjust, count) == 8);

float key_logit(uint32_t key) {
  const uint32_t bits = (key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

TopKRow top_k_row(const runtime::Sampler& s, int32_t k) {
  TopKRow r;
  r.k = k;
  r.repetition_penalty = s.params().repetition_penalty;
  r.frequency_penalty = s.params().frequency_penalty;
  r.presence_penalty = s.params().presence_penalty;
  r.adjust = s.adjustments();
  return r;
}

TopKSelector::TopKSelector(const KernelLoader& load, const std::vector<std::string>& variants, int device,
                           int64_t vocab_rows, int64_t vocab_real, int64_t max_rows, int64_t adjust_per_row)
    : device_(device), vocab_rows_(vocab_rows), vocab_real_(vocab_real), max_rows_(max_rows),
      adjust_per_row_(adjust_per_row) {
  if (vocab_real <= 0 || vocab_real > vocab_rows || vocab_rows > INT_MAX / 2)
    throw KernelError(fmt::format("top-k selection: vocabulary of {} real ids in rows of {}", vocab_real, vocab_rows));
  if (max_rows <= 0 || max_rows > 65535)
    throw KernelError(fmt::format("top-k selection: {} rows per step (1..65535)", max_rows));
  if (adjust_per_row < 0 || adjust_per_row > (1 << 24))
    throw KernelError(fmt::format("top-k selection: {} adjustments per row", adjust_per_row));
  if (variants.size() != 2) throw KernelError("top-k selection: the plan names two kernels (chunk select, merge)");
  chunk_kernel_ = load(parse_variant(variants[0]));
  merge_kernel_ = load(parse_variant(variants[1]));
  if (chunk_kernel_.variant.kernel != "topk_chunk_f32" || merge_kernel_.variant.kernel != "topk_merge_f32")
    throw KernelError("top-k selection: the plan names other kernels than topk_chunk_f32 and topk_merge_f32");
  if (chunk_kernel_.variant.param("e") * chunk_kernel_.variant.threads() != kernels::top_k_chunk_ids())
    throw KernelError(fmt::format("top-k selection: {} covers another chunk than the buffers are sized for",
                                  chunk_kernel_.variant.name));
  n_chunks_ = (vocab_real + kernels::top_k_chunk_ids() - 1) / kernels::top_k_chunk_ids();
  const kernels::TopKBuffers b = kernels::top_k_buffers(vocab_real, max_rows, adjust_per_row);
  chunk_top_ = DeviceBuffer<unsigned long long>(device, (size_t)b.chunk_top / 8, "top-k chunk candidates");
  chunk_stats_ = DeviceBuffer<unsigned char>(device, (size_t)b.chunk_stats, "top-k chunk statistics");
  row_out_ = DeviceBuffer<unsigned char>(device, (size_t)b.row_out, "top-k row results");
  staging_out_ = PinnedBuffer((size_t)b.row_out, "top-k row results (host)");
  inputs_ = DeviceBuffer<unsigned char>(device, (size_t)b.inputs, "top-k row parameters");
  staging_in_ = PinnedBuffer((size_t)b.inputs, "top-k row parameters (host)");
}

int64_t TopKSelector::device_bytes() const {
  return (int64_t)(chunk_top_.bytes() + chunk_stats_.bytes() + row_out_.bytes() + inputs_.bytes());
}

void TopKSelector::enqueue(const float* logits, const std::vector<TopKRow>& rows, StreamHandle stream) {
  if (pending_rows_ > 0) throw KernelError("top-k selection: the previous selection was not collected");
  const int64_t R = (int64_t)rows.size();
  if (R <= 0 || R > max_rows_) throw KernelError(fmt::format("top-k selection: {} rows (1..{})", R, max_rows_));
  if (!logits || reinterpret_cast<uintptr_t>(logits) % 4 != 0)
    throw KernelError("top-k selection: the logits are null or not 4-byte aligned");
  int32_t K = 0;
  size_t n_adjust = 0;
  for (int64_t r = 0; r < R; ++r) {
    const TopKRow& row = rows[(size_t)r];
    if (row.k < 1 || row.k > kTopMax)
      throw KernelError(fmt::format("top-k selection: row {} asks for {} candidates (1..{})", r, row.k, kTopMax));
    K = std::max(K, row.k);
    int64_t prev = -1;
    for (const runtime::LogitAdjust& a : row.adjust) {
      if (a.id <= prev || a.id >= vocab_real_)
        throw KernelError(fmt::format("top-k selection: row {}: adjustment ids must be increasing and below {}, "
                                      "got {} after {}", r, vocab_real_, a.id, prev));
      prev = a.id;
    }
    if (!fits(row))
      throw KernelError(fmt::format("top-k selection: row {} has {} adjustments, the plan's buffers hold {}", r,
                                    row.adjust.size(), adjust_per_row_));
    n_adjust += row.adjust.size();
  }
  const size_t ranges = (size_t)(n_chunks_ + 1);
  const size_t pen_bytes = (size_t)R * 3 * 4, range_bytes = (size_t)R * ranges * 4;
  const size_t bytes = pen_bytes + range_bytes + n_adjust * sizeof(runtime::LogitAdjust);
  if (bytes > inputs_.bytes()) throw KernelError("top-k selection: the row parameters do not fit the buffers");

  auto* base = static_cast<unsigned char*>(staging_in_.data());
  auto* pen = reinterpret_cast<float*>(base);
  auto* range = reinterpret_cast<int32_t*>(base + pen_bytes);
  auto* adj = reinterpret_cast<runtime::LogitAdjust*>(base + pen_bytes + range_bytes);
  const int64_t chunk = kernels::top_k_chunk_ids();
  size_t at = 0;  // global index of the next adjustment
  for (int64_t r = 0; r < R; ++r) {
    const TopKRow& row = rows[(size_t)r];
    pen[r * 3 + 0] = row.repetition_penalty;
    pen[r * 3 + 1] = row.frequency_penalty;
    pen[r * 3 + 2] = row.presence_penalty;
    size_t i = 0;
    for (int64_t c = 0; c <= n_chunks_; ++c) {  // first entry of chunk c: the first id >= c * chunk
      while (i < row.adjust.size() && row.adjust[i].id < c * chunk) ++i;
      range[(size_t)r * ranges + (size_t)c] = (int32_t)(at + i);
    }
    if (!row.adjust.empty()) std::memcpy(adj + at, row.adjust.data(), row.adjust.size() * sizeof(runtime::LogitAdjust));
    at += row.adjust.size();
  }
  if (at > (size_t)INT_MAX) throw KernelError("top-k selection: too many adjustments");
  copy_to_device_async(inputs_.data(), base, bytes, stream, "top-k row parameters");

  const float* d_pen = reinterpret_cast<const float*>(inputs_.data());
  const int* d_range = reinterpret_cast<const int*>(inputs_.data() + pen_bytes);
  const void* d_adj = inputs_.data() + pen_bytes + range_bytes;
  unsigned long long* d_top = chunk_top_.data();
  void* d_stats = chunk_stats_.data();
  void* d_out = row_out_.data();
  chunk_kernel_.kernel.launch(Dim3((unsigned)n_chunks_, (unsigned)R), Dim3((unsigned)chunk_kernel_.variant.threads()), 0,
                              stream, logits, (long long)vocab_rows_, (int)vocab_real_, (int)n_chunks_, (int)K, d_pen,
                              d_range, d_adj, d_top, d_stats);
  merge_kernel_.kernel.launch(Dim3((unsigned)R), Dim3((unsigned)merge_kernel_.variant.threads()), 0, stream,
                              (int)n_chunks_, static_cast<const unsigned long long*>(d_top),
                              static_cast<const void*>(d_stats), d_out);
  copy_to_host_async(staging_out_.data(), d_out, (size_t)R * sizeof(RowOut), stream, "top-k row results");
  pending_rows_ = R;
  pending_k_.clear();
  for (const TopKRow& row : rows) pending_k_.push_back(row.k);
}

std::vector<runtime::TopCandidates> TopKSelector::collect(StreamHandle stream) {
  if (pending_rows_ <= 0) throw KernelError("top-k selection: nothing to collect");
  const int64_t R = pending_rows_;
  pending_rows_ = 0;
  check(drv::driver().cuStreamSynchronize(stream), "top-k selection");
  const auto* out = static_cast<const RowOut*>(staging_out_.data());
  std::vector<runtime::TopCandidates> result((size_t)R);
  for (int64_t r = 0; r < R; ++r) {
    const RowOut& o = out[r];
    runtime::TopCandidates& t = result[(size_t)r];
    if (o.n_cand < 0 || o.n_cand > vocab_real_ || o.n_pos_inf < 0 || o.n_pos_inf > o.n_cand)
      throw KernelError(fmt::format("top-k selection: row {}: corrupt counts ({} candidates, {} +inf)", r, o.n_cand,
                                    o.n_pos_inf));
    t.n_cand = o.n_cand;
    t.n_pos_inf = o.n_pos_inf;
    t.max = o.max;
    t.lse = o.lse;
    const int32_t n = std::min(pending_k_[(size_t)r], o.n_cand);
    t.top.reserve((size_t)n);
    for (int32_t i = 0; i < n; ++i) {
      const uint64_t key = o.top[i];
      const int64_t id = 0xFFFFFFFFll - (int64_t)(key & 0xFFFFFFFFu);
      if (key == 0 || id < 0 || id >= vocab_real_)
        throw KernelError(fmt::format("top-k selection: row {}: corrupt candidate {} (key {:#x})", r, i, key));
      t.top.emplace_back(key_logit((uint32_t)(key >> 32)), (int32_t)id);
    }
  }
  return result;
}

void TopKSelector::poison_outputs() {
  chunk_top_.fill_bytes(0xFF);
  chunk_stats_.fill_bytes(0xFF);
  row_out_.fill_bytes(0xFF);
  std::memset(staging_out_.data(), 0xFF, staging_out_.bytes());
}

}  // namespace qrig::cuda
