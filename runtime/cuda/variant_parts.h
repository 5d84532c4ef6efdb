// The template registry (variant.h) is assembled from one list per kernel area, each defined next to the
// launchers of its area, so that adding a kernel touches its own files only:
//   base_templates       variant.cpp        rmsnorm, activation quantization, decode GEMV, embedding
//   pointwise_templates  pointwise.cpp      residual add, SwiGLU, conv1d, head/gated norms, RoPE, KV write, argmax
//   gemm_templates       gemm.cpp           prefill / multi-row Q8_0 x int8 GEMM (dp4a)
//   gdn_templates        gdn.cpp            Gated DeltaNet recurrent step and chunked prefill
//   attention_templates  attention.cpp      gated GQA attention over the f16 KV cache (prefill and split-KV decode)
//   sampling_templates   sampling.cpp       top-k candidate selection for sampling (chunk select, row merge)
#pragma once

#include <vector>

#include "runtime/cuda/variant.h"

namespace qrig::cuda {

// The block-size parameter every template ends with: {"t", "QRIG_THREADS", 32..1024, multiple of 32}.
TemplateParam threads_param();
// The activation-planes parameter of the quantizer and every matmul: {"p", "QRIG_PLANES", 1..2}.
TemplateParam planes_param();

std::vector<TemplateInfo> base_templates();
std::vector<TemplateInfo> pointwise_templates();
std::vector<TemplateInfo> gemm_templates();
std::vector<TemplateInfo> gdn_templates();
std::vector<TemplateInfo> attention_templates();
std::vector<TemplateInfo> sampling_templates();

}  // namespace qrig::cuda
