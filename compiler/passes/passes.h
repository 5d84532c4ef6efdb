// The compiler passes, in the order compile() runs them. Each decides one thing, records it in the plan
// (and the graph's op attributes), and appends a note saying what and why.
#pragma once

#include <vector>

#include "compiler/compile.h"
#include "kernels/kv_format.h"

namespace qrig::compiler::passes {

constexpr int64_t kSnapshotsPerSlot = 4;  // prefix-cache snapshots of recurrent state per slot (plan_memory)

// Bytes of one weight as a backend holds it: CUDA uploads Q8_0 matrices repacked (int8 values + fp16 scales: the
// file's bytes) and f32 vectors as they are (any other type: CompileError); the CPU maps the file's bytes.
int64_t device_weight_bytes(const gguf::TensorInfo& t, bool cuda);

// The rig devices the plan's stages run on, in stage order: those of the backend's kind (at most --gpus GPUs), at
// most one per layer. place_layers places stage s on element s; plan_memory budgets each stage by it.
std::vector<const RigDevice*> pipeline_devices(const CompileContext& cx);

// From plan_draft on, a plan that drafts has two graphs: the main one and the MTP head's (Plan::draft); the passes
// after it treat both (quantize ops, fusions, kernel choices, arena layout, the head's cache and memory).
void select_backend(CompileContext& cx);          // cpu or cuda, kernel family, arch target, tuning data
void place_layers(CompileContext& cx);            // layer ranges per device; every op's device
void choose_kv_format(CompileContext& cx);        // key and value cache element types (candidates; see below)
void schedule_gdn(CompileContext& cx);            // chunk length, recurrent threshold
void plan_draft(CompileContext& cx);              // speculative decoding: draft tokens, the MTP head's graph
void quantize_matmul_inputs(CompileContext& cx);  // dp4a: explicit quantize ops, two-plane rule (precise_rows)
void fuse_norm_quant(CompileContext& cx);         // rmsnorm + quantize -> rmsnorm_quant
void fuse_add_norm(CompileContext& cx);           // add + rmsnorm_quant of the sum -> add_rmsnorm_quant
void fuse_swiglu_quant(CompileContext& cx);       // swiglu + quantize -> swiglu_quant
void stack_matmuls(CompileContext& cx);           // matmuls on one input -> matmul_stack
void choose_kernels(CompileContext& cx);          // CUDA: kernel variants per op and range of rows, and why
void plan_prefix_cache(CompileContext& cx);       // cut and snapshot points, shared prefix cache budget
void plan_memory(CompileContext& cx);             // bytes per device, arena offsets, context length that fits

// The graphs the passes after plan_draft treat: the main graph, and the draft graph when the plan drafts.
std::vector<ir::Graph*> plan_graphs(ir::Plan& p);

// The KV-format pass's second half, which needs what the memory pass knows (choose_kv_format.cpp): the format
// pairs whose context the memory pass tabulates (plan.memory.kv_fits), and the choice among them once that table
// is filled: the most precise pair the backend runs at which the requested context fits.
std::vector<kernels::KvPair> kv_table_pairs(const CompileContext& cx);
// The pairs the backend runs, most precise first (the forced one alone with --kv): the placement pass sizes the
// caches by the most compact of them, so that it never refuses a context the KV pass could still reach.
std::vector<kernels::KvPair> kv_candidates(const CompileContext& cx);
void settle_kv_format(CompileContext& cx);
// CUDA plans that draft: the plan's current key and value formats on the draft graph's cache and ops (plan_draft
// calls it after lowering the head; settle_kv_format then sets both graphs' formats together).
void draft_kv_format(CompileContext& cx);

}  // namespace qrig::compiler::passes
