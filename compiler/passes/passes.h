// The compiler passes, in the order compile() runs them. Each decides one thing, records it in the plan
// (and the graph's op attributes), and appends a note saying what and why.
#pragma once

#include <vector>

#include "compiler/compile.h"
#include "kernels/kv_format.h"

namespace qrig::compiler::passes {

void select_backend(CompileContext& cx);          // cpu or cuda, kernel family, arch target, tuning data
void place_layers(CompileContext& cx);            // layer ranges per device; every op's device
void choose_kv_format(CompileContext& cx);        // key and value cache element types (candidates; see below)
void schedule_gdn(CompileContext& cx);            // chunk length, recurrent threshold
void quantize_matmul_inputs(CompileContext& cx);  // dp4a: explicit quantize ops, two-plane rule (precise_rows)
void fuse_norm_quant(CompileContext& cx);         // rmsnorm + quantize -> rmsnorm_quant
void stack_matmuls(CompileContext& cx);           // matmuls on one input -> matmul_stack
void choose_kernels(CompileContext& cx);          // CUDA: kernel variants per op and range of rows, and why
void plan_memory(CompileContext& cx);             // bytes per device, arena offsets, context length that fits

// The KV-format pass's second half, which needs what the memory pass knows (choose_kv_format.cpp): the format
// pairs whose context the memory pass tabulates (plan.memory.kv_fits), and the choice among them once that table
// is filled: the most precise pair the backend runs at which the requested context fits.
std::vector<kernels::KvPair> kv_table_pairs(const CompileContext& cx);
void settle_kv_format(CompileContext& cx);

}  // namespace qrig::compiler::passes
