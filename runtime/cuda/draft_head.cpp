// CudaDraftHead (draft_head.h).
#include "runtime/cuda/draft_head.h"

#include <algorithm>

#include <fmt/format.h>

namespace qrig::runtime {

CudaDraftHead::CudaDraftHead(CudaExecutor& ex)
    : ex_(ex),
      width_(ex.draft_width()),
      capacity_(ex.draft_pending_rows()),
      max_rows_(ex.plan().rows_per_call()) {
  if (width_ <= 0 || capacity_ <= 0) throw RuntimeError("the plan has no draft head");
  slots_.assign((size_t)ex.slots(), Slot{});
}

CudaDraftHead::Slot& CudaDraftHead::slot(int s) {
  if (s < 0 || s >= (int)slots_.size()) throw RuntimeError(fmt::format("no slot {}", s));
  return slots_[(size_t)s];
}

std::vector<float> CudaDraftHead::run(int s, Slot& sl, int64_t extra, int64_t first_row,
                                      const std::vector<int32_t>& step_tokens, int32_t last_next, bool logits_of_last) {
  const int64_t P = (int64_t)sl.tokens.size(), N = P + extra;
  // The tokens of the N rows in order; row i's next token is tokens[i + 1], the last one's `last_next`.
  std::vector<int32_t> tokens = sl.tokens;
  tokens.insert(tokens.end(), step_tokens.begin(), step_tokens.begin() + extra);
  tokens.push_back(last_next);
  const float* pending = ex_.draft_pending(s);
  std::vector<float> logits;
  for (int64_t a = 0; a < N; a += max_rows_) {
    const int64_t b = std::min(N, a + max_rows_);
    std::vector<CudaExecutor::DraftRows> parts;
    if (a < P) parts.push_back({pending + a * width_, std::min(b, P) - a});
    if (b > P) {
      const int64_t from = std::max(a, P) - P;
      parts.push_back({ex_.step_hidden() + (first_row + from) * width_, b - std::max(a, P)});
    }
    const std::vector<int32_t> next(tokens.begin() + a + 1, tokens.begin() + b + 1);
    std::vector<int32_t> rows;
    if (logits_of_last && b == N) rows.push_back((int32_t)(b - a - 1));
    logits = ex_.draft_forward(s, sl.rows_done + a, next, parts, rows);
  }
  sl.rows_done += N;
  sl.tokens.clear();
  return logits;
}

void CudaDraftHead::observe(int s, int64_t from, const std::vector<int32_t>& tokens, int64_t first_row,
                            bool run_ready) {
  Slot& sl = slot(s);
  if (from == 0) reset(s);
  if (!sl.valid || tokens.empty()) return;
  const int64_t T = (int64_t)tokens.size();
  if (from != sl.rows_done + (int64_t)sl.tokens.size()) {  // a step the head did not see (cannot happen via step())
    sl.valid = false;
    return;
  }
  if (!run_ready) {  // a verify step: its rows wait for the rollback
    const int64_t P = (int64_t)sl.tokens.size();
    if (P + T > capacity_) {
      sl.valid = false;
      return;
    }
    ex_.draft_copy(ex_.draft_pending(s) + P * width_, ex_.step_hidden() + first_row * width_, T,
                   CudaExecutor::DraftCopy::on_device);
    sl.tokens.insert(sl.tokens.end(), tokens.begin(), tokens.end());
    return;
  }
  // Every row but the step's last has its next token now: run them, then the last one waits.
  if (!sl.tokens.empty() || T > 1) run(s, sl, T - 1, first_row, tokens, tokens[(size_t)T - 1], false);
  ex_.draft_copy(ex_.draft_pending(s), ex_.step_hidden() + (first_row + T - 1) * width_, 1,
                 CudaExecutor::DraftCopy::on_device);
  sl.tokens = {tokens.back()};
}

std::vector<int32_t> CudaDraftHead::draft(int s, int64_t position, int32_t next, int k,
                                          const std::function<int32_t(const float*)>& pick) {
  Slot& sl = slot(s);
  if (!ready(s, position))
    throw RuntimeError(fmt::format("slot {}: the draft head has not seen the sequence up to position {}", s, position));
  if (k < 1) throw RuntimeError("draft of no tokens");
  std::vector<int32_t> out;
  // The rows of the tokens the slot has seen, the last one paired with `next`: the first draft.
  std::vector<float> logits = run(s, sl, 0, 0, {}, next, true);
  out.push_back(pick(logits.data()));
  // Then the head on its own output: row rows_done + j - 1 pairs its previous normed output with the previous draft.
  for (int j = 1; j < k; ++j) {
    logits = ex_.draft_forward(s, sl.rows_done + j - 1, {out.back()}, {{ex_.draft_carry(), 1}}, {0});
    out.push_back(pick(logits.data()));
  }
  return out;  // rows_done stays: the drafts' cache rows are overwritten by the real ones (the cache is positional)
}

void CudaDraftHead::rollback(int s, int64_t position) {
  Slot& sl = slot(s);
  if (!sl.valid) return;
  const int64_t keep = position - sl.rows_done;
  if (keep < 0 || keep > (int64_t)sl.tokens.size()) {
    sl.valid = false;
    return;
  }
  sl.tokens.resize((size_t)keep);  // the waiting rows stay at the front of the slot's buffer
}

void CudaDraftHead::reset(int s) { slot(s) = Slot{}; }

void CudaDraftHead::lose(int s) {
  Slot& sl = slot(s);
  sl = Slot{};
  sl.valid = false;
}

bool CudaDraftHead::ready(int s, int64_t position) const {
  const Slot& sl = slot(s);
  return sl.valid && !sl.tokens.empty() && sl.rows_done + (int64_t)sl.tokens.size() == position;
}

CudaDraftHead::Saved CudaDraftHead::save(int s) const {
  const Slot& sl = slot(s);
  Saved v{sl.rows_done, sl.tokens, {}, sl.valid};
  v.rows.resize(sl.tokens.size() * (size_t)width_);
  ex_.draft_copy(v.rows.data(), ex_.draft_pending(s), (int64_t)sl.tokens.size(), CudaExecutor::DraftCopy::to_host);
  return v;
}

void CudaDraftHead::restore(int s, const Saved& v) {
  Slot& sl = slot(s);
  if ((int64_t)v.tokens.size() > capacity_ || v.rows.size() != v.tokens.size() * (size_t)width_) {
    sl = Slot{};
    sl.valid = false;
    return;
  }
  ex_.draft_copy(ex_.draft_pending(s), v.rows.data(), (int64_t)v.tokens.size(), CudaExecutor::DraftCopy::to_device);
  sl.rows_done = v.rows_done;
  sl.tokens = v.tokens;
  sl.valid = v.valid;
}

}  // namespace qrig::runtime
