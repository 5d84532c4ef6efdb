// Backends for tests that watch or break what the engine drives, shared by the runtime and server tests:
// ForwardingBackend passes every call on to another backend (the plan's own, or one given); RecordingBackend
// remembers the logits it returned keyed by the tokens the slot had seen (so a test can compare them bit for
// bit with a reference run); FailingBackend injects failures (a step that throws, a restore that fails).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace qrig::test {

// What the injecting backends throw, so a test can tell its own failure from a real one.
struct InjectedFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class ForwardingBackend : public runtime::Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<runtime::Backend> inner) : inner_(std::move(inner)) {}
  explicit ForwardingBackend(const ir::Plan& plan) : ForwardingBackend(runtime::make_backend(plan)) {}
  const ir::Plan& plan() const override { return inner_->plan(); }
  int slots() const override { return inner_->slots(); }
  int64_t vocab_rows() const override { return inner_->vocab_rows(); }
  int64_t context_length() const override { return inner_->context_length(); }
  int64_t position(int slot) const override { return inner_->position(slot); }
  void reset(int slot) override { inner_->reset(slot); }
  std::vector<std::vector<float>> step(const std::vector<runtime::StepInput>& batch) override {
    return inner_->step(batch);
  }
  std::shared_ptr<runtime::Snapshot> save(int slot) const override { return inner_->save(slot); }
  void restore(int slot, const runtime::Snapshot& snap) override { inner_->restore(slot, snap); }
  int64_t snapshot_bytes() const override { return inner_->snapshot_bytes(); }
  int draft_tokens() const override { return inner_->draft_tokens(); }
  bool can_draft(int slot) const override { return inner_->can_draft(slot); }
  std::vector<int32_t> draft(int slot, int32_t next, int k, const DraftPick& pick) override {
    return inner_->draft(slot, next, k, pick);
  }
  void rollback(int slot, int64_t position) override { inner_->rollback(slot, position); }
  bool kv_spans() const override { return inner_->kv_spans(); }
  std::shared_ptr<runtime::KvSpan> save_kv(int slot, int64_t begin, int64_t end) const override {
    return inner_->save_kv(slot, begin, end);
  }
  void restore_kv(int slot, const runtime::KvSpan& span, int64_t begin, int64_t end) override {
    inner_->restore_kv(slot, span, begin, end);
  }
  std::shared_ptr<runtime::KvSpan> slice_kv(const runtime::KvSpan& span, int64_t begin, int64_t end) const override {
    return inner_->slice_kv(span, begin, end);
  }

 private:
  std::unique_ptr<runtime::Backend> inner_;
};

// Tracks the tokens each slot's state has seen (reset clears them, a snapshot carries them) and records every
// logits row it returns under that token sequence. logits_after(tokens) lists the rows returned after a slot
// had seen exactly `tokens` (several when the same history ran more than once).
class RecordingBackend final : public ForwardingBackend {
 public:
  explicit RecordingBackend(std::unique_ptr<runtime::Backend> inner)
      : ForwardingBackend(std::move(inner)), seen_((size_t)slots()) {}
  explicit RecordingBackend(const ir::Plan& plan) : RecordingBackend(runtime::make_backend(plan)) {}

  void reset(int slot) override {
    ForwardingBackend::reset(slot);
    std::lock_guard<std::mutex> lk(mu_);
    seen_[(size_t)slot].clear();
  }
  std::vector<std::vector<float>> step(const std::vector<runtime::StepInput>& batch) override {
    std::vector<std::vector<float>> out = ForwardingBackend::step(batch);
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t k = 0; k < batch.size(); ++k) {
      auto& seen = seen_[(size_t)batch[k].slot];
      seen.insert(seen.end(), batch[k].tokens.begin(), batch[k].tokens.end());
      if (batch[k].want_logits) rows_[seen].push_back(out[k]);
    }
    return out;
  }
  void rollback(int slot, int64_t position) override {
    ForwardingBackend::rollback(slot, position);
    std::lock_guard<std::mutex> lk(mu_);
    seen_[(size_t)slot].resize((size_t)position);
  }
  struct Snap final : runtime::Snapshot {
    std::shared_ptr<runtime::Snapshot> inner;
    std::vector<int32_t> seen;
  };
  std::shared_ptr<runtime::Snapshot> save(int slot) const override {
    auto s = std::make_shared<Snap>();
    s->inner = ForwardingBackend::save(slot);
    s->position = s->inner->position;
    std::lock_guard<std::mutex> lk(mu_);
    s->seen = seen_[(size_t)slot];
    return s;
  }
  void restore(int slot, const runtime::Snapshot& snap) override {
    const Snap& s = dynamic_cast<const Snap&>(snap);
    ForwardingBackend::restore(slot, *s.inner);
    std::lock_guard<std::mutex> lk(mu_);
    seen_[(size_t)slot] = s.seen;
  }

  std::vector<std::vector<float>> logits_after(const std::vector<int32_t>& tokens) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = rows_.find(tokens);
    return it == rows_.end() ? std::vector<std::vector<float>>{} : it->second;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::vector<int32_t>> seen_;
  std::map<std::vector<int32_t>, std::vector<std::vector<float>>> rows_;
};

// Fails on command, before touching any state (as the Backend contract asks of a step that throws):
// - step() throws InjectedFailure(step_message) when any input carries poison_token;
// - restore() throws InjectedFailure(restore_message) while fail_restore is set.
// Counts the steps it ran and the failures it injected.
class FailingBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;

  std::vector<std::vector<float>> step(const std::vector<runtime::StepInput>& batch) override {
    const int32_t poison = poison_token.load();
    for (const auto& in : batch)
      for (int32_t t : in.tokens)
        if (t == poison) {
          ++failed_steps;
          throw InjectedFailure(step_message);
        }
    ++steps;
    return ForwardingBackend::step(batch);
  }
  void restore(int slot, const runtime::Snapshot& snap) override {
    if (fail_restore) {
      ++failed_restores;
      throw InjectedFailure(restore_message);
    }
    ForwardingBackend::restore(slot, snap);
  }

  std::atomic<int32_t> poison_token{-1};
  std::atomic<bool> fail_restore{false};
  std::string step_message = "injected step failure (test)";
  std::string restore_message = "injected restore failure (test)";
  std::atomic<int64_t> steps{0}, failed_steps{0}, failed_restores{0};
};

}  // namespace qrig::test
