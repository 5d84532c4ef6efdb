// The compiler passes, in the order compile() runs them. Each decides one thing, records it in the plan
// (and the graph's op attributes), and appends a note saying what and why.
#pragma once

#include "compiler/compile.h"

namespace qrig::compiler::passes {

void select_backend(CompileContext& cx);   // cpu or cuda, kernel family, arch target
void place_layers(CompileContext& cx);     // layer ranges per device
void choose_kv_format(CompileContext& cx); // KV cache dtype
void schedule_gdn(CompileContext& cx);     // chunk length, recurrent threshold
void plan_memory(CompileContext& cx);      // bytes per part, context length that fits
void choose_kernels(CompileContext& cx);   // kernel variant name per op

}  // namespace qrig::compiler::passes
