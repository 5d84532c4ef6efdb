// Gated DeltaNet on the GPU (QWEN35.md steps 3-5; CPU references cpu::gdn_recurrent and cpu::gdn_chunked):
// a recurrent kernel for short steps (decode, T < the plan's recurrent_below) and the chunked algorithm for
// prefill (KERNELS.md "Chunked Gated DeltaNet": a parallel prep over (value head, chunk), then a scan over
// chunks parallel over (value head, value-column tile)). Inputs as the CPU ops: mixed [T][2*Hk*dk + Hv*dv]
// (conv output q | k | v), alpha/beta raw [T][Hv], ssm_a/dt_bias [Hv]; state f32 [Hv][dk][dv] read and
// updated in place; out [T][Hv*dv]. Value head j uses key head j % Hk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/cuda/launch.h"

namespace qrig::cuda {

struct GdnDims {
  int64_t Hk = 0, Hv = 0, dk = 0, dv = 0;
};

// Every variant run() may launch for these dims and chunk length.
std::vector<Variant> gdn_variants(const GdnDims& d, int64_t chunk);

class GdnKernels {
 public:
  GdnKernels(const KernelLoader& load, const GdnDims& d, int64_t chunk);
  // Device scratch run() needs for up to max_t tokens (0 when none).
  size_t workspace_bytes(int64_t max_t) const;
  // recurrent: token-serial kernel; else chunked. workspace: workspace_bytes(T) bytes, 256-byte aligned.
  void run(const float* mixed, const float* alpha, const float* beta, const float* ssm_a, const float* dt_bias,
           int64_t T, float* state, float* out, bool recurrent, void* workspace, cudaStream_t stream) const;

 private:
  GdnDims d_;
  int64_t chunk_;
  std::vector<LoadedKernel> kernels_;
};

}  // namespace qrig::cuda
