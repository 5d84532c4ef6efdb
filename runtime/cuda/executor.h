// The CUDA executor: runs a CUDA plan's graph on one GPU, deciding nothing the plan decided. Everything is bound
// once, at load: the allocations of runtime/cuda/layout.h checked against the plan's memory table, weights
// uploaded (Q8_0 matrices repacked for aligned 16-byte loads, the other block types split into quant and scale
// bytes, either stacked where the plan stacks matmuls, norm vectors as f32), exactly the kernel variants the plan names compiled or read from the cubin cache and loaded (after
// which compiling is forbidden), every activation at the arena offset the plan's memory pass gave it, per-slot
// state (conv windows, GDN states in f32, fp16 key and value caches) for the plan's context length.
//
// A step runs several sequences at once: their new tokens are concatenated into one batch of rows, so the
// matmuls, norms and residual adds run once over all rows (a decode step of B sequences reads every weight
// once), while the ops that touch a sequence's own state (conv, GDN, KV append, attention) run per sequence
// on its rows. Each op launches the kernels its `kernel` attribute names for its number of rows. Decode steps
// run as CUDA graphs (graph.h) when the plan says so.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "ir/plan.h"
#include "runtime/backend.h"
#include "runtime/errors.h"
#include "runtime/model_file.h"
#include "runtime/cuda/sampling.h"

namespace qrig::runtime {

struct CudaOptions {
  int device = 0;
  std::string cache_dir;  // cubin cache; empty: the default (~/.cache/qrig/kernels)
  // Decode steps (one token per sequence) as CUDA graphs (graph.h) where the plan says so (decode_graphs);
  // false turns them off for this executor (to compare, or to work around a driver).
  bool graphs = true;
  LoadProgressFn progress;  // BackendOptions::progress: called per weight uploaded
  // A pipeline plan: the stage (a placement's device, e.g. "cuda:1") this executor runs, on CUDA device `device`
  // (the placement's ordinal). Empty: a one-stage plan.
  std::string stage;
};

// How the decode steps ran (CudaExecutor::graph_stats).
struct GraphStats {
  int64_t captured = 0;  // steps captured into a new graph
  int64_t replayed = 0;  // steps that patched and launched an existing graph
  int64_t eager = 0;     // steps launched kernel by kernel (prefill, taps, graphs off)
  std::string disabled_because;  // set when a capture failed and graphs were turned off
};

// Per-op GPU time while profiling (CudaExecutor::set_profiling): one entry per op kind and the kernels it ran.
struct OpProfile {
  std::string op;      // e.g. "matmul: gemm_wq_dp4a_skinny_w12_p1_c1_r2_t128"
  int64_t calls = 0;   // ops timed (summed over the steps)
  double ms = 0;       // GPU time between the events around them
};

// What a step hands back: logits (rows x vocab_rows, host) and/or the greedy choice per row.
struct StepOutput {
  std::vector<float> logits;   // empty unless asked for
  std::vector<int32_t> argmax; // empty unless asked for
};

class CudaExecutor {
 public:
  CudaExecutor(const ir::Plan& plan, std::shared_ptr<const gguf::File> file, const CudaOptions& opt = {});
  ~CudaExecutor();
  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;
  GraphStats graph_stats() const;
  // Profiling (qrig bench --profile): while on, every step runs kernel by kernel (no CUDA graphs) with a pair of
  // CUDA events around each op, synchronised at the step's end; profile() sums them per op kind and kernels
  // (in graph order of first appearance) since profiling was last turned on. The target cards have no CUPTI.
  void set_profiling(bool on);
  std::vector<OpProfile> profile() const;

  const ir::Plan& plan() const;
  int slots() const;
  int64_t vocab_rows() const;
  int64_t position(int slot) const;
  void reset(int slot);
  std::string device_name() const;
  // How the kernels were built and loaded, e.g. "sm_90 cubins by NVRTC 13.0", or for a plan of kernel_code
  // "ptx": "sm_70 PTX by NVRTC 11.8, JIT-compiled by the driver for sm_90 (...)".
  std::string kernel_load() const;
  // Loaded kernels launched with programmatic dependent launch, and all loaded kernels (the plan's
  // programmatic_launch and each kernel's wait: executor_bind.cpp).
  std::pair<int64_t, int64_t> programmatic_kernels() const;
  int64_t device_bytes() const;  // weights + arena + states + workspaces allocated

  // Runs every input's tokens (appended at its slot's position). rows[k] lists the rows of input k (indices
  // into its tokens) whose output is wanted, in order; all of them together at most max_logit_rows.
  // want_logits / want_argmax pick what comes back for those rows. Validates everything before any state
  // changes (RuntimeError). tap: called for ops carrying a tap attribute (slow: synchronises per tap).
  // A pipeline stage's step reads its incoming rows from bridge buffer `stage_buf` (0 or 1; copied there by the
  // boundary), writes its outgoing rows to its bridge buffer `stage_buf`, and returns when they are complete.
  StepOutput step(const std::vector<StepInput>& batch, const std::vector<std::vector<int32_t>>& rows,
                  bool want_logits, bool want_argmax, const TapFn& tap = nullptr, int stage_buf = -1);
  // A stage's bridge buffers on its device (max rows per call x width f32), and their widths (0: none).
  float* bridge_in(int buf) const;
  float* bridge_out(int buf) const;
  int64_t bridge_in_width() const;
  int64_t bridge_out_width() const;
  bool has_output() const;  // computes the logits (the last stage, or a one-stage plan)
  int device() const;       // the CUDA device it runs on

  // After a step that named output rows: their logits stay on the device until the next step. select_top()
  // picks each row's candidates there (runtime/cuda/sampling.h; one TopKRow per output row of that step, in
  // order) and logits_row() downloads one row. Both synchronise.
  std::vector<TopCandidates> select_top(const std::vector<cuda::TopKRow>& rows);
  bool top_k_fits(const cuda::TopKRow& row) const;  // whether the plan's sampling buffers hold the row
  std::vector<float> logits_row(int64_t row);

  // Speculative decoding (docs/speculative.md; plans with draft_tokens > 0): a step input with logit_rows > 1 (a
  // verify step of T <= draft_tokens + 1 tokens, starting at position p) keeps the slot's recurrent states after
  // each of its first T - 1 tokens (inside the conv and recurrent GDN kernels); rollback() then returns the slot to
  // `position` in p + 1 .. p + T exactly as if only the first position - p tokens had run (their kept states are bit
  // for bit what such a step leaves). Throws RuntimeError for any other position.
  void rollback(int slot, int64_t position);

  // The MTP draft head's device side (plans with draft_tokens > 0; runtime/cuda/draft_head.h keeps its bookkeeping).
  // Row t of the head pairs the main model's final-normed hidden h_t (the value its graph's hidden_from names) with
  // the token at t + 1, at the head's own cache position t. A step copies the hidden rows of its tokens (T rows, the
  // inputs' in order) to step_hidden(); each slot has draft_pending_rows() rows of its own (draft_pending) for rows
  // waiting for their next token. draft_forward runs the head for `slot` over tokens.size() rows at head positions
  // pos.. (their hidden rows: the parts in order, device or host rows of draft_width() floats), returning the logits
  // of `rows` (indices into tokens; rows.size() x vocab_rows(), host) and leaving the last row's normed output
  // (mtp_hidden_out, what the next row of the head on its own output reads) in draft_carry(). Its part of the arena
  // follows the main graph's; select_top / logits_row still refuse after it, as before. tap: the draft
  // graph's taps (mtp_eh, mtp_hidden_out).
  struct DraftRows {
    const float* rows = nullptr;
    int64_t n = 0;
    bool host = false;
  };
  int64_t draft_width() const;         // 0: the plan does not draft
  int64_t draft_pending_rows() const;
  const float* step_hidden() const;
  float* draft_pending(int slot);
  const float* draft_carry() const;
  std::vector<float> draft_forward(int slot, int64_t pos, const std::vector<int32_t>& tokens,
                                   const std::vector<DraftRows>& hidden, const std::vector<int32_t>& rows,
                                   const TapFn& tap = nullptr);
  // Copies `rows` rows of draft_width() floats on the executor's stream (to or from the host: synchronously).
  enum class DraftCopy { on_device, to_host, to_device };
  void draft_copy(void* dst, const void* src, int64_t rows, DraftCopy how);

  // Recurrent state (conv + GDN; KV caches are append-only by position) of a slot, copied on the device.
  std::shared_ptr<Snapshot> save(int slot) const;
  void restore(int slot, const Snapshot& snap);
  int64_t snapshot_bytes() const;

  // Waits for everything queued (for timing).
  void synchronize() const;

  struct Impl;  // executor_impl.h (its op tables are free functions over it)

 private:
  std::unique_ptr<Impl> impl_;
};

// A Backend over the CUDA executor (what the engine and server drive): one executor, or a pipeline of one per stage.
std::unique_ptr<Backend> make_cuda_backend(const ir::Plan& plan, const BackendOptions& opt);
class PipelineStage;
// The stages of a pipeline plan, one executor each on its placement's GPU (what make_cuda_backend puts under the
// pipeline; tests wrap them).
std::vector<std::unique_ptr<PipelineStage>> make_cuda_stages(const ir::Plan& plan, const BackendOptions& opt);

}  // namespace qrig::runtime
