// The CPU reference backend: executes a plan's graph op by op in fp32 (Q8_0 weights dequantized on the
// fly), with per-sequence state (conv windows, GDN states, KV caches) that persists across calls, so a
// prompt can be prefilled and then decoded token by token.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "ir/plan.h"
#include "runtime/cpu/ops.h"

namespace qrig::runtime {

struct RuntimeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Per-sequence state: one buffer per graph state, plus how many tokens it has seen.
struct CpuSequence {
  std::vector<std::vector<float>> buffers;  // indexed like plan.graph.states
  int64_t n_past = 0;
  void reset();
};

// Called with (tap name, pointer to T x width floats, T, width) for every op carrying a `tap` attribute.
using TapFn = std::function<void(const std::string&, const float*, int64_t, int64_t)>;

class CpuExecutor {
 public:
  // Binds every weight the graph names to the GGUF (which must be the file the plan was compiled for).
  CpuExecutor(const ir::Plan& plan, std::shared_ptr<const gguf::File> file);

  CpuSequence new_sequence() const;
  // Runs T = tokens.size() new tokens at positions seq.n_past..; returns the logits of the requested rows
  // (indices into tokens) as rows.size() x vocab floats. Throws RuntimeError on context overflow or bad ids
  // (checked before any state changes).
  std::vector<float> forward(CpuSequence& seq, const std::vector<int32_t>& tokens, const std::vector<int32_t>& rows,
                             const TapFn& tap = nullptr) const;

  const ir::Plan& plan() const { return plan_; }
  int64_t vocab_rows() const { return vocab_rows_; }

  // Computes what the CUDA dp4a family computes, on the CPU: every matmul input quantized to int8 per 32
  // values (cpu::quantize_q8_activation; two planes for matmuls of at most precise_rows rows, as a CUDA plan's
  // precise_rows says) and keys/values rounded to fp16 as the GPU's KV cache stores them. The fp32 reference
  // stays the default; this shows how much of a GPU/reference difference is the family's numerics rather than
  // a kernel (qrig verify --emulate-dp4a).
  void emulate_dp4a_numerics(bool on, int64_t precise_rows = 0) {
    emulate_dp4a_ = on;
    emulate_precise_rows_ = precise_rows;
  }

 private:
  struct Step;
  ir::Plan plan_;
  std::shared_ptr<const gguf::File> file_;
  std::vector<Step> steps_;
  std::vector<std::vector<int64_t>> state_shapes_;
  int64_t n_values_ = 0;
  int64_t vocab_rows_ = 0;
  bool emulate_dp4a_ = false;
  int64_t emulate_precise_rows_ = 0;
 public:
  ~CpuExecutor();
  CpuExecutor(CpuExecutor&&) noexcept;
};

// Opens the plan's model file, checking it is the one the plan was compiled for (size).
std::shared_ptr<const gguf::File> open_plan_model(const ir::Plan& plan);

}  // namespace qrig::runtime
