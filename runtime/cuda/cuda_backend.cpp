// Backend implementation over the CUDA executor: every input of a step runs in one batched step on the GPU;
// sampling candidates are selected on the GPU (step_select), so a sampled token costs the host K pairs
// instead of a 1 MB row of logits.
#include <fmt/format.h>

#include "runtime/cuda/executor.h"

namespace qrig::runtime {

namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ir::Plan& plan, const BackendOptions& opt)
      : ex_(plan, open_plan_model(plan), CudaOptions{0, {}, opt.cuda_graphs, opt.progress}) {}
  const ir::Plan& plan() const override { return ex_.plan(); }
  int slots() const override { return ex_.slots(); }
  int64_t vocab_rows() const override { return ex_.vocab_rows(); }
  int64_t context_length() const override { return ex_.plan().context_length; }
  int64_t position(int slot) const override { return ex_.position(slot); }
  void reset(int slot) override { ex_.reset(slot); }

  std::vector<std::vector<float>> step(const std::vector<StepInput>& batch) override {
    std::vector<std::vector<int32_t>> rows(batch.size());
    bool any = false;
    for (size_t k = 0; k < batch.size(); ++k)
      if (batch[k].want_logits && !batch[k].tokens.empty()) {
        rows[k].push_back((int32_t)batch[k].tokens.size() - 1);
        any = true;
      }
    StepOutput o = ex_.step(batch, rows, any, false);
    std::vector<std::vector<float>> out(batch.size());
    const size_t V = (size_t)ex_.vocab_rows();
    size_t r = 0;
    for (size_t k = 0; k < batch.size(); ++k)
      if (!rows[k].empty()) {
        out[k].assign(o.logits.begin() + (ptrdiff_t)(r * V), o.logits.begin() + (ptrdiff_t)((r + 1) * V));
        ++r;
      }
    return out;
  }
  int32_t top_k_max() const override { return cuda::kTopMax; }

  std::vector<std::vector<float>> step_select(const std::vector<StepInput>& batch, const std::vector<Select>& select,
                                              std::vector<std::optional<TopCandidates>>& top) override {
    if (select.size() != batch.size()) throw RuntimeError("step_select: one selection per input");
    std::vector<std::vector<int32_t>> rows(batch.size());
    std::vector<int64_t> row_of(batch.size(), -1);
    std::vector<char> sel(batch.size(), 0);
    int64_t n_rows = 0;
    bool selected = false;
    std::vector<cuda::TopKRow> req;
    for (size_t k = 0; k < batch.size(); ++k)
      if (batch[k].want_logits && !batch[k].tokens.empty()) {
        rows[k].push_back((int32_t)batch[k].tokens.size() - 1);
        row_of[k] = n_rows++;
        // A row with more adjustments than the plan's sampling buffers hold is sampled from its logits on the
        // host (the same result: the candidates are exact whenever they suffice).
        cuda::TopKRow r;  // rows not selected ride along with k = 1 and nothing to adjust (cheap)
        if (select[k].k > 0 && select[k].sampler) {
          cuda::TopKRow want = cuda::top_k_row(*select[k].sampler, select[k].k);
          if (ex_.top_k_fits(want)) {
            r = std::move(want);
            sel[k] = 1;
            selected = true;
          }
        }
        req.push_back(std::move(r));
      }
    ex_.step(batch, rows, false, false);
    std::vector<TopCandidates> cands;
    if (selected) cands = ex_.select_top(req);
    std::vector<std::vector<float>> out(batch.size());
    top.assign(batch.size(), std::nullopt);
    for (size_t k = 0; k < batch.size(); ++k) {
      if (row_of[k] < 0) continue;
      if (sel[k] && select[k].sampler->top_suffices(cands[(size_t)row_of[k]]))
        top[k] = std::move(cands[(size_t)row_of[k]]);
      else
        out[k] = ex_.logits_row(row_of[k]);  // the candidates cannot decide this row: its logits
    }
    return out;
  }

  std::shared_ptr<Snapshot> save(int slot) const override { return ex_.save(slot); }
  void restore(int slot, const Snapshot& snap) override { ex_.restore(slot, snap); }
  int64_t snapshot_bytes() const override { return ex_.snapshot_bytes(); }

 private:
  CudaExecutor ex_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const ir::Plan& plan, const BackendOptions& opt) {
  return std::make_unique<CudaBackend>(plan, opt);
}

}  // namespace qrig::runtime
