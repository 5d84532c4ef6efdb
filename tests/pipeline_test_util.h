// Test helpers for the pipeline (runtime/pipeline.h), shared by the CPU tests (tests/runtime/test_pipeline.cpp)
// and the GPU ones (tests/gpu/test_gpu_pipeline.cpp): a stage wrapper that sleeps at random in every call (so the
// threads of the pipeline meet in other orders) or throws on a chosen compute call.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/pipeline.h"

namespace qrig::test {

// A stage that passes every call on, and can sleep at random in each (the orderings of its threads change) or
// throw in compute on chosen calls.
class ShakyStage final : public runtime::PipelineStage {
 public:
  ShakyStage(std::unique_ptr<runtime::PipelineStage> s, uint32_t seed) : s_(std::move(s)), rng_(seed) {}
  std::atomic<int> fail_at{-1};  // compute call number that throws (-1: none)
  std::atomic<int> calls{0};
  bool jitter = false;

  const std::string& device() const override { return s_->device(); }
  int64_t out_width() const override { return s_->out_width(); }
  int64_t vocab_rows() const override { return s_->vocab_rows(); }
  int64_t position(int slot) const override { return s_->position(slot); }
  void reset(int slot) override { s_->reset(slot); }
  std::shared_ptr<runtime::Snapshot> save(int slot) const override { return s_->save(slot); }
  void restore(int slot, const runtime::Snapshot& snap) override { s_->restore(slot, snap); }
  int64_t snapshot_bytes() const override { return s_->snapshot_bytes(); }
  bool kv_spans() const override { return s_->kv_spans(); }
  std::shared_ptr<runtime::KvSpan> save_kv(int slot, int64_t begin, int64_t end) const override {
    return s_->save_kv(slot, begin, end);
  }
  void restore_kv(int slot, const runtime::KvSpan& span, int64_t begin, int64_t end) override {
    s_->restore_kv(slot, span, begin, end);
  }
  std::shared_ptr<runtime::KvSpan> slice_kv(const runtime::KvSpan& span, int64_t begin, int64_t end) const override {
    return s_->slice_kv(span, begin, end);
  }
  void compute(const runtime::PipelineUnit& u, const std::vector<runtime::StepInput>& b, int buf,
               const runtime::PipelineResults& r) override {
    nap();
    if (calls++ == fail_at) throw std::runtime_error("injected failure on " + device());
    s_->compute(u, b, buf, r);
    nap();
  }
  void download(int buf, float* host, int64_t rows) override {
    nap();
    s_->download(buf, host, rows);
  }
  void upload(const float* host, int buf, int64_t rows) override {
    nap();
    s_->upload(host, buf, rows);
    nap();
  }
  std::shared_ptr<float> host_buffer(int64_t n) override { return s_->host_buffer(n); }

 private:
  void nap() {
    if (!jitter) return;
    int us;
    {
      std::lock_guard<std::mutex> lock(mu_);
      us = std::uniform_int_distribution<int>(0, 3)(rng_) == 0 ? std::uniform_int_distribution<int>(0, 400)(rng_) : 0;
    }
    if (us) std::this_thread::sleep_for(std::chrono::microseconds(us));
  }
  std::unique_ptr<runtime::PipelineStage> s_;
  std::mt19937 rng_;
  std::mutex mu_;
};

struct Shaky {
  std::unique_ptr<runtime::Backend> backend;
  std::vector<ShakyStage*> stages;
};
// The plan's stages (CPU stages, or the ones given), each wrapped.
inline Shaky shaky_pipeline(const ir::Plan& plan, bool jitter, uint32_t seed = 1,
                            std::vector<std::unique_ptr<runtime::PipelineStage>> inner = {}) {
  Shaky out;
  std::vector<std::unique_ptr<runtime::PipelineStage>> stages;
  if (inner.empty()) inner = runtime::make_cpu_stages(plan);
  for (auto& s : inner) {
    auto w = std::make_unique<ShakyStage>(std::move(s), seed++);
    w->jitter = jitter;
    out.stages.push_back(w.get());
    stages.push_back(std::move(w));
  }
  out.backend = runtime::make_pipeline(plan, std::move(stages));
  return out;
}

}  // namespace qrig::test
