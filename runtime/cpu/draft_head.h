// The MTP draft head on the CPU backend (docs/speculative.md): the plan's draft graph bound by a second executor,
// and per slot what the head needs to draft from wherever the slot is. Row t of the head pairs the main model's
// final-normed hidden h_t with the token at t + 1, so the rows lag the main model: the head keeps the hidden rows
// (and their tokens) that have no next token yet, or that a verify step may still roll back, and runs them when
// the next token is known (after a prefill chunk or a plain decode step) or when it drafts.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cpu/executor.h"

namespace qrig::runtime {

class CpuDraftHead {
 public:
  CpuDraftHead(const ir::Plan& plan, std::shared_ptr<const gguf::File> file, int slots);
  // The tap of the main model's value the head reads (the draft graph's hidden_from).
  const std::string& hidden_from() const { return hidden_from_; }
  int64_t width() const { return head_.hidden_width(); }

  // The main model ran `tokens` for `slot` at positions from, from + 1, ...; hidden: their rows (T x width()).
  // run_ready: run the rows whose next token is now known (every one but the last); a verify step passes false,
  // its rows wait for the rollback.
  void observe(int slot, int64_t from, const std::vector<int32_t>& tokens, const float* hidden, bool run_ready);
  // Drafts k tokens after `next` (the slot's next token, at position `position` = where the main model is):
  // runs the waiting rows (the last with `next`), then k - 1 rows of its own (hidden = its previous normed output),
  // whose cache entries are dropped again. Throws RuntimeError when the head lost track of the slot.
  std::vector<int32_t> draft(int slot, int64_t position, int32_t next, int k,
                             const std::function<int32_t(const float*)>& pick);
  // The main model went back to `position`: rows at or after it are forgotten.
  void rollback(int slot, int64_t position);
  void reset(int slot);
  // Whether draft() can run for the slot at `position` (the head saw every token the slot has).
  bool ready(int slot, int64_t position) const;

  // What a snapshot of the slot keeps (the head's cache rows are positional: they stay in place).
  struct Saved {
    int64_t rows_done = 0;
    std::vector<float> hidden;
    std::vector<int32_t> tokens;
    bool valid = true;
  };
  Saved save(int slot) const;
  void restore(int slot, const Saved& s);
  int64_t sequence_bytes() const { return head_.sequence_bytes(); }

 private:
  struct Slot {
    CpuSequence seq;               // the head's own key and value cache; seq.n_past = rows run
    std::vector<float> hidden;     // main-model rows seq.n_past, seq.n_past + 1, ... not run yet
    std::vector<int32_t> tokens;   // the tokens at those positions
    bool valid = true;             // false: a step ran that the head did not see; it cannot draft until a reset
  };
  Slot& slot(int s);
  // Runs the first n waiting rows (row t's next token: the waiting token t + 1, the last one `last_next`);
  // returns their logits when `logits_of_last`.
  std::vector<float> run_rows(Slot& s, int64_t n, int32_t last_next, bool logits_of_last, std::vector<float>* out_hidden);

  CpuExecutor head_;
  std::string hidden_from_;
  std::vector<Slot> slots_;
};

}  // namespace qrig::runtime
