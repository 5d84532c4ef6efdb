// The CPU reference backend's executor: runs a plan's graph op by op in fp32 (weights dequantized on the fly),
// with per-sequence state (conv windows, GDN states, key and value caches) that persists across calls, so a
// prompt can be prefilled and then decoded token by token. Plans of the "dp4a-emulated" family carry the GPU
// family's numerics in their graph (quantize ops: int8 matmul inputs per 32 values, one or two planes; fp16
// key and value caches), and this executor computes exactly those, which shows how much of a GPU/reference
// difference is the family's arithmetic rather than a kernel.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "ir/plan.h"
#include "runtime/bound_graph.h"
#include "runtime/cpu/ops.h"
#include "runtime/errors.h"
#include "runtime/model_file.h"

namespace qrig::runtime {

// Per-sequence state: one buffer per graph state, plus how many tokens it has seen.
struct CpuSequence {
  std::vector<std::vector<float>> buffers;  // indexed like plan.graph.states
  int64_t n_past = 0;
  // Speculative verify (docs/speculative.md): with keep > 0 the next forward of T tokens keeps every non-positional
  // state (conv windows, GDN states) after each of its first min(keep, T - 1) tokens, so that rollback() can return
  // the sequence to any position inside that forward without running it again. The forward resets keep to 0.
  int64_t keep = 0;
  std::vector<std::vector<float>> kept;  // per state: the copies back to back (empty for key and value caches)
  int64_t kept_from = -1;                // n_past before the forward that kept them (-1: nothing kept)
  int64_t kept_count = 0;
  // Back to `position` in kept_from + 1 .. kept_from + kept_count + 1 (the last: where the forward ended): the
  // states after token position - 1; key and value caches keep their rows (append-only by position). Throws
  // RuntimeError for any other position.
  void rollback(int64_t position);
  void reset();
};

class CpuExecutor {
 public:
  // Binds every weight the graph names to the GGUF (which must be the file the plan was compiled for). With a
  // device (one stage of a multi-stage plan: a placement's device), only that stage's ops: it reads the residual
  // stream its bridge brings in (forward's hidden_in) and hands on what the next stage's bridge takes (hidden_out);
  // its sequences hold only its own layers' states. Empty: the whole graph (a one-stage plan).
  // draft: the plan's draft graph (Plan::draft, the MTP head) instead of its main graph; forward's hidden_in is then
  // its %hidden input (T rows of that input's width).
  CpuExecutor(const ir::Plan& plan, std::shared_ptr<const gguf::File> file, const std::string& device = {},
              bool draft = false);
  ~CpuExecutor();
  CpuExecutor(CpuExecutor&&) noexcept;

  CpuSequence new_sequence() const;
  // Bytes of one sequence's states (what new_sequence allocates).
  int64_t sequence_bytes() const;
  // Runs T = tokens.size() new tokens at positions seq.n_past..; returns the logits of the requested rows
  // (indices into tokens) as rows.size() x vocab floats. Throws RuntimeError on context overflow or bad ids
  // (checked before any state changes).
  // A stage: hidden_in holds T rows of the incoming bridge's width (stages after the first), hidden_out receives
  // T rows of the outgoing one (stages before the last; the result is then empty).
  std::vector<float> forward(CpuSequence& seq, const std::vector<int32_t>& tokens, const std::vector<int32_t>& rows,
                             const TapFn& tap = nullptr, const float* hidden_in = nullptr,
                             float* hidden_out = nullptr) const;
  bool first_stage() const { return bridge_in_ < 0; }
  bool last_stage() const { return bridge_out_ < 0; }
  int64_t bridge_width() const;  // values per row the outgoing bridge carries (0: last stage)
  bool draft() const { return graph_->has_hidden; }
  int64_t hidden_width() const { return graph_->has_hidden ? graph_->width(BoundGraph::kHidden) : 0; }
  const std::string& device() const { return device_; }

  const ir::Plan& plan() const { return plan_; }
  int64_t vocab_rows() const { return vocab_rows_; }

  struct Step;  // one bound op (executor.cpp)

 private:
  ir::Plan plan_;
  std::shared_ptr<const gguf::File> file_;
  std::unique_ptr<BoundGraph> graph_;
  std::vector<Step> steps_;
  int64_t vocab_rows_ = 0;
  std::string device_;         // the stage's device; empty: every op
  int bridge_in_ = -1;         // value id the incoming bridge defines (-1: first stage)
  int bridge_out_ = -1;        // value id the outgoing bridge reads (-1: last stage)
  std::vector<bool> own_state_;  // per graph state: read or written by this stage's ops
};

// Whether the CPU bind and run tables have a row for every op kind (ir/ops.h; tests check it).
bool cpu_op_tables_complete();

}  // namespace qrig::runtime
