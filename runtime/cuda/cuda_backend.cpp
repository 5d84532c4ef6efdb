// Backend implementations over the CUDA executor. One stage: every input of a step runs in one batched step on the
// GPU; sampling candidates are selected on the GPU (step_select), so a sampled token costs the host K pairs instead
// of a 1 MB row of logits. Several stages: one executor per stage (each on its placement's GPU) under the pipeline
// (runtime/pipeline.h); boundaries copy the stage's bridge buffer to pinned host memory on a copy stream, wait on the
// host for it, then copy it up to the next stage's device.
#include <fmt/format.h>

#include <optional>

#include "runtime/cuda/draft_head.h"
#include "runtime/cuda/executor.h"
#include "runtime/pipeline.h"

namespace qrig::runtime {

namespace {

// Runs `batch` on the executor (last token of each input that wants logits as an output row; a verify step's last
// logit_rows tokens) and hands back, per input, its logits (logit_rows rows of them) or (where select asks and the
// candidates decide the row) its top candidates.
void step_and_collect(CudaExecutor& ex, const std::vector<StepInput>& batch, const std::vector<Backend::Select>* select,
                      int stage_buf, std::vector<std::vector<float>>& out,
                      std::vector<std::optional<TopCandidates>>& top) {
  std::vector<std::vector<int32_t>> rows(batch.size());
  std::vector<int64_t> row_of(batch.size(), -1);
  std::vector<char> sel(batch.size(), 0);
  int64_t n_rows = 0;
  bool selected = false;
  std::vector<cuda::TopKRow> req;
  for (size_t k = 0; k < batch.size(); ++k)
    if (batch[k].want_logits && !batch[k].tokens.empty()) {
      const int32_t T = (int32_t)batch[k].tokens.size(), n = batch[k].logit_rows;
      if (n < 1 || n > T) throw RuntimeError(fmt::format("logits of {} rows of an input of {} tokens", n, T));
      row_of[k] = n_rows;
      if (n > 1) {  // a verify step of speculative decoding: its last n rows, from their logits on the host
        for (int32_t r = T - n; r < T; ++r) rows[k].push_back(r);
        n_rows += n;
        req.resize(req.size() + (size_t)n);
        continue;
      }
      rows[k].push_back(T - 1);
      ++n_rows;
      // A row with more adjustments than the plan's sampling buffers hold is sampled from its logits on the
      // host (the same result: the candidates are exact whenever they suffice).
      cuda::TopKRow r;  // rows not selected ride along with k = 1 and nothing to adjust (cheap)
      if (select && (*select)[k].k > 0 && (*select)[k].sampler) {
        cuda::TopKRow want = cuda::top_k_row(*(*select)[k].sampler, (*select)[k].k);
        if (ex.top_k_fits(want)) {
          r = std::move(want);
          sel[k] = 1;
          selected = true;
        }
      }
      req.push_back(std::move(r));
    }
  ex.step(batch, rows, false, false, nullptr, stage_buf);
  std::vector<TopCandidates> cands;
  if (selected) cands = ex.select_top(req);
  for (size_t k = 0; k < batch.size(); ++k) {
    if (row_of[k] < 0) continue;
    if (batch[k].logit_rows > 1) {
      for (int32_t r = 0; r < batch[k].logit_rows; ++r) {
        const std::vector<float> row = ex.logits_row(row_of[k] + r);
        out[k].insert(out[k].end(), row.begin(), row.end());
      }
      continue;
    }
    if (sel[k] && (*select)[k].sampler->top_suffices(cands[(size_t)row_of[k]]))
      top[k] = std::move(cands[(size_t)row_of[k]]);
    else
      out[k] = ex.logits_row(row_of[k]);  // the candidates cannot decide this row: its logits
  }
}

// A snapshot of a plan that drafts: the executor's, and the draft head's rows of the slot it was taken from.
struct CudaDraftSnapshot : Snapshot {
  std::shared_ptr<Snapshot> inner;
  CudaDraftHead::Saved head;
  int slot = -1;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ir::Plan& plan, const BackendOptions& opt)
      : ex_(plan, open_plan_model(plan), CudaOptions{0, {}, opt.cuda_graphs, opt.progress, {}}) {
    if (plan.draft_tokens > 0) head_.emplace(ex_);
  }
  const ir::Plan& plan() const override { return ex_.plan(); }
  int slots() const override { return ex_.slots(); }
  int64_t vocab_rows() const override { return ex_.vocab_rows(); }
  int64_t context_length() const override { return ex_.plan().context_length; }
  int64_t position(int slot) const override { return ex_.position(slot); }
  void reset(int slot) override {
    ex_.reset(slot);
    if (head_) head_->reset(slot);
  }

  std::vector<std::vector<float>> step(const std::vector<StepInput>& batch) override {
    std::vector<std::vector<float>> out(batch.size());
    std::vector<std::optional<TopCandidates>> top(batch.size());
    run(batch, nullptr, out, top);
    return out;
  }
  int32_t top_k_max() const override { return cuda::kTopMax; }

  std::vector<std::vector<float>> step_select(const std::vector<StepInput>& batch, const std::vector<Select>& select,
                                              std::vector<std::optional<TopCandidates>>& top) override {
    if (select.size() != batch.size()) throw RuntimeError("step_select: one selection per input");
    std::vector<std::vector<float>> out(batch.size());
    top.assign(batch.size(), std::nullopt);
    run(batch, &select, out, top);
    return out;
  }

  std::shared_ptr<Snapshot> save(int slot) const override {
    if (!head_) return ex_.save(slot);
    auto snap = std::make_shared<CudaDraftSnapshot>();
    snap->inner = ex_.save(slot);
    snap->position = snap->inner->position;
    snap->head = head_->save(slot);
    snap->slot = slot;
    return snap;
  }
  // The draft head's cache rows are positional and stay in their slot: a snapshot restores the head only into the
  // slot it came from (else the head starts over there and the slot decodes without drafts until it resets).
  void restore(int slot, const Snapshot& snap) override {
    if (!head_) return ex_.restore(slot, snap);
    const auto* ds = dynamic_cast<const CudaDraftSnapshot*>(&snap);
    if (!ds) throw RuntimeError("snapshot of another backend");
    ex_.restore(slot, *ds->inner);
    if (ds->slot == slot) head_->restore(slot, ds->head);
    else head_->reset(slot);
  }
  int64_t snapshot_bytes() const override { return ex_.snapshot_bytes(); }

  // Speculative decoding with the plan's MTP head (runtime/cuda/draft_head.h): the executor's verify step keeps the
  // recurrent states a rollback needs, the head drafts on the device.
  int draft_tokens() const override { return head_ ? (int)ex_.plan().draft_tokens : 0; }
  bool can_draft(int slot) const override { return head_ && head_->ready(slot, ex_.position(slot)); }
  std::vector<int32_t> draft(int slot, int32_t next, int k, const DraftPick& pick) override {
    if (!head_) return Backend::draft(slot, next, k, pick);
    if (k < 1 || k > draft_tokens()) throw RuntimeError(fmt::format("draft of {} tokens (the plan drafts {})", k, draft_tokens()));
    if (next < 0 || next >= vocab_rows()) throw RuntimeError(fmt::format("token id {} is out of range", next));
    return head_->draft(slot, ex_.position(slot), next, k, pick);
  }
  void rollback(int slot, int64_t position) override {
    ex_.rollback(slot, position);
    if (head_) head_->rollback(slot, position);
  }

 private:
  // The step, then (a plan that drafts) each input's rows to the draft head, after the logits were collected (the
  // head runs in the arena after the main graph's part).
  void run(const std::vector<StepInput>& batch, const std::vector<Select>* select, std::vector<std::vector<float>>& out,
           std::vector<std::optional<TopCandidates>>& top) {
    std::vector<int64_t> from;
    if (head_)
      for (const StepInput& in : batch) from.push_back(ex_.position(in.slot));
    step_and_collect(ex_, batch, select, -1, out, top);
    if (!head_) return;
    int64_t row = 0;
    for (size_t k = 0; k < batch.size(); ++k) {
      try {
        head_->observe(batch[k].slot, from[k], batch[k].tokens, row, batch[k].logit_rows <= 1);
      } catch (const std::exception&) {
        head_->lose(batch[k].slot);  // drafting is an optimisation: the slot goes on without it
      }
      row += (int64_t)batch[k].tokens.size();
    }
  }
  CudaExecutor ex_;
  std::optional<CudaDraftHead> head_;  // plans that draft (Plan::draft_tokens > 0)
};

// One stage of a pipeline plan on its GPU. Its executor keeps the stage's slots; compute() runs a unit as one
// batched step (the unit's pieces as the step's inputs); the boundaries' copies run on a stream of their own, so
// they overlap the stage's next unit.
class CudaStage final : public PipelineStage {
 public:
  CudaStage(const ir::Plan& plan, std::shared_ptr<const gguf::File> file, const ir::Placement& pl,
            const BackendOptions& opt)
      : device_(pl.device),
        ex_(plan, std::move(file), CudaOptions{(int)pl.ordinal, {}, opt.cuda_graphs, opt.progress, pl.device}),
        copies_(ex_.device()) {}
  const std::string& device() const override { return device_; }
  int64_t out_width() const override { return ex_.bridge_out_width(); }
  int64_t vocab_rows() const override { return ex_.vocab_rows(); }
  int64_t position(int slot) const override { return ex_.position(slot); }
  void reset(int slot) override { ex_.reset(slot); }
  std::shared_ptr<Snapshot> save(int slot) const override { return ex_.save(slot); }
  void restore(int slot, const Snapshot& snap) override { ex_.restore(slot, snap); }
  int64_t snapshot_bytes() const override { return ex_.snapshot_bytes(); }
  int32_t top_k_max() const override { return ex_.has_output() ? cuda::kTopMax : 0; }

  void compute(const PipelineUnit& u, const std::vector<StepInput>& batch, int buf,
               const PipelineResults& res) override {
    std::vector<StepInput> sub;
    std::vector<Backend::Select> select;
    for (const PipelinePiece& p : u.pieces) {
      const auto& all = batch[(size_t)p.input].tokens;
      sub.push_back({p.slot, std::vector<int32_t>(all.begin() + p.begin, all.begin() + p.begin + p.count),
                     p.want_logits && ex_.has_output()});
      select.push_back(res.select && p.want_logits ? (*res.select)[(size_t)p.input] : Backend::Select{});
    }
    std::vector<std::vector<float>> out(sub.size());
    std::vector<std::optional<TopCandidates>> top(sub.size());
    step_and_collect(ex_, sub, res.select ? &select : nullptr, buf, out, top);
    if (!ex_.has_output()) return;
    for (size_t k = 0; k < u.pieces.size(); ++k) {
      const size_t input = (size_t)u.pieces[k].input;
      if (!u.pieces[k].want_logits) continue;
      if (top[k]) (*res.top)[input] = std::move(top[k]);
      else (*res.logits)[input] = std::move(out[k]);
    }
  }
  void download(int buf, float* host, int64_t rows) override {
    cuda::DeviceGuard guard(ex_.device());
    cuda::copy_to_host_async(host, ex_.bridge_out(buf), (size_t)(rows * out_width()) * 4, copies_.get(),
                             "bridge rows to the host");
    copies_.sync("bridge rows to the host");  // the host fence: the rows are in host memory now
  }
  void upload(const float* host, int buf, int64_t rows) override {
    cuda::DeviceGuard guard(ex_.device());
    cuda::copy_to_device_async(ex_.bridge_in(buf), host, (size_t)(rows * ex_.bridge_in_width()) * 4, copies_.get(),
                               "bridge rows from the host");
    copies_.sync("bridge rows from the host");
  }
  std::shared_ptr<float> host_buffer(int64_t floats) override {
    auto pinned = std::make_shared<cuda::PinnedBuffer>((size_t)std::max<int64_t>(1, floats) * 4,
                                                       "bridge rows (pinned host memory)");
    return std::shared_ptr<float>(pinned, static_cast<float*>(pinned->data()));
  }

 private:
  std::string device_;
  CudaExecutor ex_;
  cuda::Stream copies_;
};

}  // namespace

std::vector<std::unique_ptr<PipelineStage>> make_cuda_stages(const ir::Plan& plan, const BackendOptions& opt) {
  auto file = open_plan_model(plan);
  std::vector<std::unique_ptr<PipelineStage>> stages;
  for (const auto& pl : plan.placement) stages.push_back(std::make_unique<CudaStage>(plan, file, pl, opt));
  return stages;
}

std::unique_ptr<Backend> make_cuda_backend(const ir::Plan& plan, const BackendOptions& opt) {
  if (plan.placement.size() == 1) return std::make_unique<CudaBackend>(plan, opt);
  return make_pipeline(plan, make_cuda_stages(plan, opt), PipelineOptions{opt.simulate_link_gbps});
}

}  // namespace qrig::runtime
