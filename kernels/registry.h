// The template registry (variant.h) is assembled from one list per kernel area, each defined in the area's
// file of this library next to the area's choice functions, so that adding a kernel touches its area only:
//   pointwise_templates  pointwise.cpp   rmsnorm (+ fused quantization), embedding, residual add (+ fused quantized
//                                        rmsnorm), SwiGLU (+ fused quantization), conv1d,
//                                        head/gated norms, RoPE, KV write, argmax
//   matmul_templates     matmul.cpp      activation quantization, decode GEMV, prefill / multi-row GEMMs (dp4a)
//   gdn_templates        gdn.cpp         Gated DeltaNet recurrent step and chunked prefill
//   attention_templates  attention.cpp   gated GQA attention over the f16 KV cache (prefill, split-KV decode)
//   sampling_templates   sampling.cpp    top-k candidate selection for sampling (chunk select, row merge)
#pragma once

#include <vector>

#include "kernels/variant.h"

namespace qrig::kernels {

std::vector<TemplateInfo> pointwise_templates();
std::vector<TemplateInfo> matmul_templates();
std::vector<TemplateInfo> gdn_templates();
std::vector<TemplateInfo> attention_templates();
std::vector<TemplateInfo> sampling_templates();

}  // namespace qrig::kernels
