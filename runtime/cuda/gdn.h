// Gated DeltaNet on the GPU (QWEN35.md steps 3-5; CPU references cpu::gdn_recurrent and cpu::gdn_chunked): the
// recurrent kernel or the chunked pair (gdn_chunk_prep, then gdn_chunk_scan through a workspace), as the plan
// names them per range of a sequence's tokens (kernels/gdn.h chooses). Inputs as the CPU ops: mixed
// [T][2*Hk*dk + Hv*dv] (conv output q | k | v), alpha/beta raw [T][Hv], ssm_a/dt_bias [Hv]; state f32
// [Hv][dk][dv] read and updated in place; out [T][Hv*dv]. Value head j uses key head j % Hk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ir/kernel_attr.h"
#include "kernels/gdn.h"
#include "runtime/cuda/launch.h"

namespace qrig::cuda {

using kernels::GdnDims;

class GdnKernels {
 public:
  // ranges: per range of tokens either [gdn_recurrent] or [gdn_chunk_prep, gdn_chunk_scan] (ir/kernel_attr.h).
  GdnKernels(const KernelLoader& load, const GdnDims& d, int64_t chunk, const std::vector<ir::LaunchRange>& ranges);
  // The T tokens of one sequence. workspace: kernels::gdn_workspace_bytes(d, chunk, T) bytes, 256-byte aligned
  // (unused by the recurrent kernel). A verify step of speculative decoding (docs/speculative.md) keeps the state
  // after each of its first `keep` tokens (keep < T) at kept + t * kept_stride floats: only the recurrent kernel
  // keeps them (KernelError where the plan's range for T is the chunked pair).
  void run(const float* mixed, const float* alpha, const float* beta, const float* ssm_a, const float* dt_bias,
           int64_t T, float* state, float* out, void* workspace, StreamHandle stream, float* kept = nullptr,
           int64_t keep = 0, int64_t kept_stride = 0) const;
  bool recurrent_for(int64_t T) const;

 private:
  struct Range {
    int64_t first, last;
    std::vector<LoadedKernel> kernels;  // [recurrent] or [prep, scan]
  };
  const Range& range_for(int64_t T) const;
  GdnDims d_;
  int64_t chunk_;
  std::vector<Range> ranges_;
};

// A decode step of `seqs` sequences of one token each in one launch of the batched recurrent kernel (k: a
// gdn_recurrent b1 variant of these dims): mixed [seqs][2*Hk*dk + Hv*dv], alpha/beta [seqs][Hv], out [seqs][Hv*dv];
// sequence z's state at rec_of[seq_slot[z]] + state_offset floats (device arrays: the slots' recurrent-state
// images, the step's slots). Each sequence gets the bits GdnKernels::run gives it alone.
void launch_gdn_recurrent_batched(const LoadedKernel& k, const GdnDims& d, const float* mixed, const float* alpha,
                                  const float* beta, const float* ssm_a, const float* dt_bias, int64_t seqs,
                                  float* const* rec_of, const int32_t* seq_slot, int64_t state_offset, float* out,
                                  StreamHandle stream);

}  // namespace qrig::cuda
