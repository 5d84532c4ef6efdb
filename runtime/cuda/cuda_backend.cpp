// Backend implementation over the CUDA executor: every input of a step runs in one batched step on the GPU.
#include <fmt/format.h>

#include "runtime/cuda/executor.h"

namespace qrig::runtime {

namespace {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const ir::Plan& plan) : ex_(plan, open_plan_model(plan)) {}
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
  std::shared_ptr<Snapshot> save(int slot) const override { return ex_.save(slot); }
  void restore(int slot, const Snapshot& snap) override { ex_.restore(slot, snap); }
  int64_t snapshot_bytes() const override { return ex_.snapshot_bytes(); }

 private:
  CudaExecutor ex_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const ir::Plan& plan) { return std::make_unique<CudaBackend>(plan); }

}  // namespace qrig::runtime
