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
  void reset();
};

class CpuExecutor {
 public:
  // Binds every weight the graph names to the GGUF (which must be the file the plan was compiled for).
  CpuExecutor(const ir::Plan& plan, std::shared_ptr<const gguf::File> file);
  ~CpuExecutor();
  CpuExecutor(CpuExecutor&&) noexcept;

  CpuSequence new_sequence() const;
  // Bytes of one sequence's states (what new_sequence allocates).
  int64_t sequence_bytes() const;
  // Runs T = tokens.size() new tokens at positions seq.n_past..; returns the logits of the requested rows
  // (indices into tokens) as rows.size() x vocab floats. Throws RuntimeError on context overflow or bad ids
  // (checked before any state changes).
  std::vector<float> forward(CpuSequence& seq, const std::vector<int32_t>& tokens, const std::vector<int32_t>& rows,
                             const TapFn& tap = nullptr) const;

  const ir::Plan& plan() const { return plan_; }
  int64_t vocab_rows() const { return vocab_rows_; }

  struct Step;  // one bound op (executor.cpp)

 private:
  ir::Plan plan_;
  std::shared_ptr<const gguf::File> file_;
  std::unique_ptr<BoundGraph> graph_;
  std::vector<Step> steps_;
  int64_t vocab_rows_ = 0;
};

// Whether the CPU bind and run tables have a row for every op kind (ir/ops.h; tests check it).
bool cpu_op_tables_complete();

}  // namespace qrig::runtime
