// What the CUDA executor allocates for a plan on its device, worked out on the host before anything is
// allocated (no CUDA calls: tests run it without a GPU): every weight upload (Q8_0 matrices repacked, stacks of
// them, f32 vectors, RoPE tables), the activation arena the plan laid out, the per-step inputs and outputs, the
// sampling buffers and every slot's states. The executor allocates exactly these entries, and bind refuses a
// plan whose memory table (the compiler's plan_memory) disagrees with them, so `qrig inspect` shows what the
// runtime really takes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "ir/plan.h"
#include "kernels/kv_format.h"
#include "runtime/bound_graph.h"

namespace qrig::cuda {

// A stack (the plan's matmul_stack): its members' rows one after the other in one device matrix (q8_stack: the
// repacked Q8_0 rows; wq_stack: the block types' A and B arrays, kernels/matmul.h check_wq_stack), each member a
// view of it.
struct WeightUpload {
  enum Kind { q8, q8_stack, wq, wq_stack, f32, rope_table } kind = q8;
  std::vector<std::string> tensors;  // one tensor, or a stack's members in order
  int op = -1;                       // rope_table: the op (index into the graph's ops) whose table it is
  int64_t rows = 0, cols = 0;        // matrices: the (stacked) matrix; f32 / rope_table: rows = values
  int64_t bytes = 0;                 // device bytes (q8: int8 values + fp16 scales; wq: the file's block bytes)
  int64_t wtype = 8;                 // wq / wq_stack: the ggml type id
  bool draft = false;                // rope_table: `op` indexes the plan's draft graph (the MTP head)
};

struct DeviceLayout {
  std::vector<WeightUpload> weights;
  int64_t weight_bytes = 0;
  int64_t arena_bytes = 0;
  int64_t max_t = 0, max_r = 0;         // rows of a step, output rows of a step
  int64_t io_bytes = 0;                 // tokens, positions [max_t] + output rows, argmax [max_r] (int32), and a
                                        // pipeline stage's bridge buffers (two in, two out, max_t rows of f32),
                                        // and the batched decode tables (slots x (1 + states) pointers, 2 x slots int32)
  int64_t bridge_in_width = 0, bridge_out_width = 0;  // a stage's incoming / outgoing bridge rows (0: none)
  bool has_output = true;               // the stage computes the logits (the last stage, or the only one)
  int64_t top_k_rows = 0, top_k_adjust = 0, top_k_vocab = 0, vocab_rows = 0;
  int64_t sampling_bytes = 0;
  // Per slot: the recurrent states (each at a 64-float aligned offset of one f32 buffer), then one fp16 buffer per
  // key or value cache.
  std::vector<int64_t> state_offset;    // floats, per graph state (-1 for caches)
  std::vector<int64_t> cache_halves;    // per graph state: a cache's bytes / 2, rounded up (0 for recurrent states)
  int64_t rec_floats = 0;
  // Speculative decoding (plan draft_tokens > 0): per slot, draft_tokens whole copies of the recurrent states that a
  // verify step keeps for a rollback (the memory pass's draft_rollback_bytes); 0 otherwise.
  int64_t kept_floats = 0;
  // The MTP draft head (plan draft_tokens > 0, docs/speculative.md): its graph's states, per slot one fp16 (or
  // quantized-format) buffer per key or value cache (draft_cache_halves, like cache_halves), and a buffer of
  // draft_pending_rows rows of its %hidden width (draft_width) for the main model's hidden rows waiting for it; once
  // per executor three row buffers in the io bytes: the last step's hidden rows [max_t], the head's input rows
  // [max_t] and the row a draft step carries to the next [1]. Its activations share the arena.
  int64_t draft_width = 0;
  int64_t draft_pending_rows = 0;
  std::vector<int64_t> draft_cache_halves;
  int64_t slot_bytes = 0;
  int64_t slots = 0;
  int64_t total() const { return weight_bytes + arena_bytes + io_bytes + sampling_bytes + slot_bytes * slots; }
};

// Throws RuntimeError for weights the plan names that the file lacks or whose type or shape the plan's kernels
// cannot take. A plan that drafts: the draft graph's weights too (each tensor once: the head shares the embedding
// and the lm_head), its caches and buffers.
// `stage`: the device of one stage of a pipeline plan (its ops, states and bridges only); empty: every op (a
// one-stage plan).
DeviceLayout device_layout(const ir::Plan& plan, const runtime::BoundGraph& g, const gguf::File& f,
                           const std::string& stage = {});

// Throws RuntimeError naming the first part whose bytes differ from the plan's memory table (the plan was made
// by another compiler, edited, or the two disagree: a bug).
void check_layout(const DeviceLayout& layout, const ir::Plan& plan, const std::string& stage = {});

// The format of a key or value cache state (f16, q8, t4, t3); throws RuntimeError for any other type.
kernels::KvFormat cache_format(const runtime::BoundState& st);

// Whether op `op` runs on `stage` (every op when stage is empty).
inline bool on_stage(const ir::Op& op, const std::string& stage) { return stage.empty() || op.s("device") == stage; }

}  // namespace qrig::cuda
