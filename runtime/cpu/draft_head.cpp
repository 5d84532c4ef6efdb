// CpuDraftHead (draft_head.h).
#include "runtime/cpu/draft_head.h"

#include <algorithm>
#include <variant>

#include <fmt/format.h>

namespace qrig::runtime {

CpuDraftHead::CpuDraftHead(const ir::Plan& plan, std::shared_ptr<const gguf::File> file, int slots)
    : head_(plan, std::move(file), {}, true) {
  const ir::AttrValue* from = plan.draft.attr("hidden_from");
  if (!from || !std::holds_alternative<std::string>(*from))
    throw RuntimeError("the draft graph does not say which value feeds its %hidden (hidden_from)");
  hidden_from_ = std::get<std::string>(*from);
  for (int s = 0; s < slots; ++s) slots_.push_back({head_.new_sequence(), {}, {}, true});
}

CpuDraftHead::Slot& CpuDraftHead::slot(int s) {
  if (s < 0 || s >= (int)slots_.size()) throw RuntimeError(fmt::format("no slot {}", s));
  return slots_[(size_t)s];
}

void CpuDraftHead::observe(int s, int64_t from, const std::vector<int32_t>& tokens, const float* hidden,
                           bool run_ready) {
  Slot& sl = slot(s);
  if (from == 0) reset(s);
  if (!sl.valid) return;
  if (from != sl.seq.n_past + (int64_t)sl.tokens.size()) {  // a step the head did not see (cannot happen via step())
    sl.valid = false;
    return;
  }
  const int64_t W = width();
  sl.hidden.insert(sl.hidden.end(), hidden, hidden + (int64_t)tokens.size() * W);
  sl.tokens.insert(sl.tokens.end(), tokens.begin(), tokens.end());
  const int64_t ready = (int64_t)sl.tokens.size() - 1;
  if (run_ready && ready > 0) run_rows(sl, ready, sl.tokens[(size_t)ready], false, nullptr);
}

std::vector<float> CpuDraftHead::run_rows(Slot& sl, int64_t n, int32_t last_next, bool logits_of_last,
                                          std::vector<float>* out_hidden) {
  const int64_t W = width();
  std::vector<int32_t> next(sl.tokens.begin() + 1, sl.tokens.begin() + n);
  next.push_back(last_next);
  std::vector<int32_t> rows;
  if (logits_of_last) rows.push_back((int32_t)n - 1);
  auto tap = [&](const std::string& name, const float* x, int64_t nr, int64_t w) {
    if (out_hidden && name == "mtp_hidden_out") out_hidden->assign(x + (nr - 1) * w, x + nr * w);
  };
  auto logits = head_.forward(sl.seq, next, rows, tap, sl.hidden.data());
  sl.hidden.erase(sl.hidden.begin(), sl.hidden.begin() + n * W);
  sl.tokens.erase(sl.tokens.begin(), sl.tokens.begin() + n);
  return logits;
}

std::vector<int32_t> CpuDraftHead::draft(int s, int64_t position, int32_t next, int k,
                                         const std::function<int32_t(const float*)>& pick) {
  Slot& sl = slot(s);
  if (!sl.valid || sl.seq.n_past + (int64_t)sl.tokens.size() != position || sl.tokens.empty())
    throw RuntimeError(fmt::format("slot {}: the draft head has not seen the sequence up to position {}", s, position));
  if (k < 1) throw RuntimeError("draft of no tokens");
  std::vector<int32_t> out;
  std::vector<float> h;
  // The rows of the tokens the slot has seen, the last one paired with `next`: the first draft.
  std::vector<float> logits = run_rows(sl, (int64_t)sl.tokens.size(), next, true, &h);
  const int64_t done = sl.seq.n_past;
  out.push_back(pick(logits.data()));
  // Then the head on its own output: row position + j pairs its previous normed hidden with the previous draft.
  for (int j = 1; j < k; ++j) {
    logits = head_.forward(sl.seq, {out.back()}, {0}, [&](const std::string& name, const float* x, int64_t, int64_t w) {
      if (name == "mtp_hidden_out") h.assign(x, x + w);
    }, h.data());
    out.push_back(pick(logits.data()));
  }
  sl.seq.n_past = done;  // the drafts' rows are overwritten by the real ones (the cache is positional)
  return out;
}

void CpuDraftHead::rollback(int s, int64_t position) {
  Slot& sl = slot(s);
  if (!sl.valid) return;
  const int64_t keep = position - sl.seq.n_past;
  if (keep < 0 || keep > (int64_t)sl.tokens.size()) {
    sl.valid = false;
    return;
  }
  sl.tokens.resize((size_t)keep);
  sl.hidden.resize((size_t)(keep * width()));
}

void CpuDraftHead::reset(int s) {
  Slot& sl = slot(s);
  sl.seq.reset();
  sl.hidden.clear();
  sl.tokens.clear();
  sl.valid = true;
}

bool CpuDraftHead::ready(int s, int64_t position) const {
  const Slot& sl = const_cast<CpuDraftHead*>(this)->slot(s);
  return sl.valid && !sl.tokens.empty() && sl.seq.n_past + (int64_t)sl.tokens.size() == position;
}

CpuDraftHead::Saved CpuDraftHead::save(int s) const {
  const Slot& sl = const_cast<CpuDraftHead*>(this)->slot(s);
  return {sl.seq.n_past, sl.hidden, sl.tokens, sl.valid};
}

void CpuDraftHead::restore(int s, const Saved& v) {
  Slot& sl = slot(s);
  sl.seq.n_past = v.rows_done;
  sl.hidden = v.hidden;
  sl.tokens = v.tokens;
  sl.valid = v.valid;
}

}  // namespace qrig::runtime
