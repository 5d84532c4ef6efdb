// The MTP draft head on the CUDA backend (docs/speculative.md): the bookkeeping of runtime/cpu/draft_head.h over the
// CUDA executor's draft graph (CudaExecutor::draft_forward, its own key and value cache per slot). Row t of the head
// pairs the main model's final-normed hidden h_t with the token at t + 1, so the rows lag the main model: per slot
// the head keeps, on the device, the hidden rows that have no next token yet or that a verify step may still roll
// back (at most draft_tokens + 2: a verify step's k + 1 after the row waiting before it), and runs them when the
// next token is known (after a prefill chunk or a plain decode step) or when it drafts. Rows that would not fit
// (only a caller running verify steps without drafting before them could get there) make the slot's head lose
// track: it stops drafting until the slot resets, and the output is unchanged.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "runtime/cuda/executor.h"

namespace qrig::runtime {

class CudaDraftHead {
 public:
  explicit CudaDraftHead(CudaExecutor& ex);
  int64_t width() const { return width_; }

  // The main model's step ran `tokens` for `slot` at positions from, from + 1, ...; their hidden rows are the
  // executor's step_hidden() rows first_row, first_row + 1, ... run_ready: run the rows whose next token is now
  // known (every one but the last); a verify step passes false, its rows wait for the rollback.
  void observe(int slot, int64_t from, const std::vector<int32_t>& tokens, int64_t first_row, bool run_ready);
  // Drafts k tokens after `next` (the slot's next token, at `position` = where the main model is): runs the waiting
  // rows (the last with `next`), then k - 1 rows on its own output (draft_carry), whose cache entries are left to
  // be overwritten by the real rows. Throws RuntimeError when the head lost track of the slot.
  std::vector<int32_t> draft(int slot, int64_t position, int32_t next, int k,
                             const std::function<int32_t(const float*)>& pick);
  void rollback(int slot, int64_t position);  // the main model went back to `position`
  void reset(int slot);
  void lose(int slot);  // no drafts for the slot until it resets (a head call failed)
  bool ready(int slot, int64_t position) const;

  // What a snapshot of the slot keeps (the head's cache rows are positional: they stay in place): its counts, the
  // tokens and a host copy of the waiting rows.
  struct Saved {
    int64_t rows_done = 0;
    std::vector<int32_t> tokens;
    std::vector<float> rows;
    bool valid = true;
  };
  Saved save(int slot) const;
  void restore(int slot, const Saved& s);

 private:
  struct Slot {
    int64_t rows_done = 0;        // head rows run (its cache positions 0 .. rows_done - 1)
    std::vector<int32_t> tokens;  // the tokens at positions rows_done, rows_done + 1, ... (their rows are waiting)
    bool valid = true;            // false: the head lost track; no drafts until a reset
  };
  Slot& slot(int s);
  const Slot& slot(int s) const { return const_cast<CudaDraftHead*>(this)->slot(s); }
  // Runs the n waiting rows of the slot then the first `extra` of the step's rows from `first_row` (row t's next
  // token: the one after it; the last one's is `last_next`), in calls of at most the plan's rows per call; logits of
  // the last row when asked. The waiting rows are consumed (the caller puts back what still waits).
  std::vector<float> run(int slot, Slot& sl, int64_t extra, int64_t first_row, const std::vector<int32_t>& step_tokens,
                         int32_t last_next, bool logits_of_last);

  CudaExecutor& ex_;
  int64_t width_ = 0, capacity_ = 0, max_rows_ = 0;
  std::vector<Slot> slots_;
};

}  // namespace qrig::runtime
