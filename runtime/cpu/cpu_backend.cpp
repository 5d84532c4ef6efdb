// Backend implementation over the CPU reference executor: one CpuSequence per slot, steps run slot by slot.
// With a progress callback (BackendOptions::progress) it reads the weights in at load, reporting as it goes.
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "runtime/backend.h"
#include "runtime/cpu/draft_head.h"
#include "runtime/cpu/executor.h"
#include "runtime/pipeline.h"

namespace qrig::runtime {

namespace {

// Reads one byte of every page of the weights the plan's ops use, so that loading, not the first request, pays
// for the disk; reports the bytes read at least every 64 MiB and after each tensor.
void read_weights_in(const ir::Plan& plan, const gguf::File& f, const LoadProgressFn& progress) {
  std::set<std::string> names;
  for (const ir::Op& op : plan.graph.ops) {
    for (const char* key : {"weight", "ssm_a", "dt_bias"})
      if (op.has(key)) names.insert(op.s(key));
    if (op.has("weights"))
      for (const auto& w : op.strs("weights")) names.insert(w);
  }
  std::vector<const gguf::TensorInfo*> tensors;
  int64_t total = 0;
  for (const auto& name : names)
    if (const gguf::TensorInfo* t = f.find_tensor(name)) {
      tensors.push_back(t);
      total += (int64_t)t->n_bytes;
    }
  // In file order: the disk reads sequentially.
  std::sort(tensors.begin(), tensors.end(), [](const gguf::TensorInfo* a, const gguf::TensorInfo* b) {
    return a->shard != b->shard ? a->shard < b->shard : a->offset < b->offset;
  });
  const char* stage = "reading weights";
  progress({stage, 0, total});
  constexpr int64_t kPage = 4096, kReport = 64ll << 20;
  int64_t done = 0, reported = 0;
  volatile uint8_t sink = 0;
  for (const gguf::TensorInfo* t : tensors) {
    const uint8_t* p = f.tensor_data(*t);
    for (int64_t k = 0; k < (int64_t)t->n_bytes; k += kPage) {
      sink = sink + p[k];
      if (done + k - reported >= kReport) {
        reported = done + k;
        progress({stage, reported, total});
      }
    }
    done += (int64_t)t->n_bytes;
    if (done < total) {
      reported = done;
      progress({stage, done, total});
    }
  }
  progress({stage, total, total});
}

struct CpuSnapshot : Snapshot {
  std::vector<std::vector<float>> states;  // non-positional states only (empty vector for KV caches)
  std::optional<CpuDraftHead::Saved> head;  // plans that draft: the draft head's rows of the slot
  int slot = -1;                             // the slot it was taken from (the head's rows stay in that slot)
};
// Positions [begin, end) of every key and value cache of one executor's sequence (empty vectors for the other
// states), rows as the caches hold them (fp32 values or a quantized format's bytes).
struct CpuKvSpan : KvSpan {
  std::vector<std::vector<float>> states;
  int64_t bytes() const override {
    int64_t b = 0;
    for (const auto& s : states) b += (int64_t)s.size() * 4;
    return b;
  }
};
// Every slot's sequence of one executor (the whole plan, or one stage's part), and its snapshots: the
// non-positional states (conv, GDN) copied, the key and value caches left in place (append-only by position).
struct CpuSlots {
  std::vector<CpuSequence> seqs;
  std::vector<bool> positional;  // per graph state: a key or value cache

  CpuSlots(const CpuExecutor& ex, const ir::Plan& plan) : ctx(plan.context_length) {
    for (int64_t s = 0; s < plan.max_sequences; ++s) seqs.push_back(ex.new_sequence());
    for (const auto& st : plan.graph.states) {
      bool pos = false;
      for (int64_t d : st.type.shape) pos |= d == ir::kContext;
      positional.push_back(pos);
    }
  }
  CpuSequence& seq(int slot) {
    if (slot < 0 || slot >= (int)seqs.size()) throw RuntimeError(fmt::format("no slot {}", slot));
    return seqs[(size_t)slot];
  }
  const CpuSequence& seq(int slot) const { return const_cast<CpuSlots*>(this)->seq(slot); }
  std::shared_ptr<Snapshot> save(int slot) const {
    auto snap = std::make_shared<CpuSnapshot>();
    const CpuSequence& s = seq(slot);
    snap->position = s.n_past;
    for (size_t i = 0; i < s.buffers.size(); ++i)
      snap->states.push_back(positional[i] ? std::vector<float>() : s.buffers[i]);
    return snap;
  }
  void restore(int slot, const Snapshot& snap) {
    const auto* cs = dynamic_cast<const CpuSnapshot*>(&snap);
    CpuSequence& s = seq(slot);
    if (!cs || cs->states.size() != s.buffers.size()) throw RuntimeError("snapshot of another backend");
    for (size_t i = 0; i < s.buffers.size(); ++i)
      if (!positional[i] && cs->states[i].size() != s.buffers[i].size())
        throw RuntimeError("snapshot of another stage");
    for (size_t i = 0; i < s.buffers.size(); ++i)
      if (!positional[i]) s.buffers[i] = cs->states[i];
    s.n_past = cs->position;
    s.kept_from = -1;  // a verify step's copies belong to the state before the restore
    s.kept_count = 0;
  }
  int64_t snapshot_bytes() const {
    int64_t b = 0;
    for (size_t i = 0; i < positional.size(); ++i)
      if (!positional[i]) b += (int64_t)seqs[0].buffers[i].size() * 4;
    return b;
  }
  // KV spans: a cache buffer holds context_length rows of equal size, position-major (executor.cpp).
  int64_t ctx = 0;
  int64_t row_floats(size_t i) const { return positional[i] ? (int64_t)seqs[0].buffers[i].size() / ctx : 0; }
  std::shared_ptr<KvSpan> save_kv(int slot, int64_t begin, int64_t end) const {
    const CpuSequence& s = seq(slot);
    if (begin < 0 || begin > end || end > s.n_past)
      throw RuntimeError(fmt::format("KV span [{}, {}) beyond slot {}'s {} positions", begin, end, slot, s.n_past));
    auto span = std::make_shared<CpuKvSpan>();
    span->begin = begin;
    span->end = end;
    for (size_t i = 0; i < s.buffers.size(); ++i) {
      const int64_t r = row_floats(i);
      span->states.emplace_back(s.buffers[i].begin() + begin * r, s.buffers[i].begin() + end * r);
    }
    return span;
  }
  const CpuKvSpan& check_span(const KvSpan& span, int64_t begin, int64_t end) const {
    const auto* cs = dynamic_cast<const CpuKvSpan*>(&span);
    if (!cs || cs->states.size() != positional.size()) throw RuntimeError("KV span of another backend");
    if (begin < cs->begin || begin > end || end > cs->end || end > ctx)
      throw RuntimeError(fmt::format("positions [{}, {}) outside the KV span [{}, {})", begin, end, cs->begin, cs->end));
    for (size_t i = 0; i < positional.size(); ++i)
      if ((int64_t)cs->states[i].size() != (cs->end - cs->begin) * row_floats(i))
        throw RuntimeError("KV span of another stage");
    return *cs;
  }
  void restore_kv(int slot, const KvSpan& span, int64_t begin, int64_t end) {
    const CpuKvSpan& cs = check_span(span, begin, end);
    CpuSequence& s = seq(slot);
    for (size_t i = 0; i < s.buffers.size(); ++i) {
      const int64_t r = row_floats(i);
      std::copy(cs.states[i].begin() + (begin - cs.begin) * r, cs.states[i].begin() + (end - cs.begin) * r,
                s.buffers[i].begin() + begin * r);
    }
  }
  std::shared_ptr<KvSpan> slice_kv(const KvSpan& span, int64_t begin, int64_t end) const {
    const CpuKvSpan& cs = check_span(span, begin, end);
    auto out = std::make_shared<CpuKvSpan>();
    out->begin = begin;
    out->end = end;
    for (size_t i = 0; i < cs.states.size(); ++i) {
      const int64_t r = row_floats(i);
      out->states.emplace_back(cs.states[i].begin() + (begin - cs.begin) * r,
                               cs.states[i].begin() + (end - cs.begin) * r);
    }
    return out;
  }
};


class CpuBackend final : public Backend {
 public:
  CpuBackend(const ir::Plan& plan, const BackendOptions& opt) : file_(open_plan_model(plan)), ex_(plan, file_) {
    // Every slot's states are allocated up front: refuse a plan whose states cannot fit this machine's memory
    // rather than let the allocations run until the process is killed.
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    const double ram = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
    const double need = (double)ex_.sequence_bytes() * (double)plan.max_sequences;
    if (ram > 0 && need > ram)
      throw RuntimeError(fmt::format("the plan's states need {:.1f} GiB ({} sequences x {:.1f} MiB) but this machine "
                                     "has {:.1f} GiB: recompile with a smaller --ctx or --parallel",
                                     need / (1 << 30), plan.max_sequences, (double)ex_.sequence_bytes() / (1 << 20),
                                     ram / (1 << 30)));
    if (opt.progress) read_weights_in(plan, *file_, opt.progress);
    slots_.emplace(ex_, plan);
    if (plan.draft_tokens > 0) head_.emplace(plan, file_, (int)plan.max_sequences);
    kv_copied_.assign(slots_->seqs.size(), 0);
  }
  const ir::Plan& plan() const override { return ex_.plan(); }
  int slots() const override { return (int)slots_->seqs.size(); }
  int64_t vocab_rows() const override { return ex_.vocab_rows(); }
  int64_t context_length() const override { return ex_.plan().context_length; }
  int64_t position(int slot) const override { return seq(slot).n_past; }
  void reset(int slot) override {
    seq(slot).reset();
    if (head_) head_->reset(slot);
  }

  std::vector<std::vector<float>> step(const std::vector<StepInput>& batch) override {
    for (const auto& in : batch) {
      const CpuSequence& s = seq(in.slot);
      if (in.tokens.empty()) throw RuntimeError("step input with no tokens");
      if (s.n_past + (int64_t)in.tokens.size() > context_length())
        throw RuntimeError(fmt::format("context overflow in slot {}: {} + {} > {}", in.slot, s.n_past,
                                       in.tokens.size(), context_length()));
      for (int32_t t : in.tokens)
        if (t < 0 || t >= vocab_rows()) throw RuntimeError(fmt::format("token id {} is out of range", t));
      if (in.logit_rows != 1 && (!head_ || in.logit_rows < 1 || in.logit_rows > (int64_t)in.tokens.size() ||
                                 in.logit_rows > draft_tokens() + 1))
        throw RuntimeError(fmt::format("a step input wants the logits of {} rows (this plan drafts {} tokens)",
                                       in.logit_rows, draft_tokens()));
    }
    // The plan's output rows per step, as the CUDA backend holds them (its logits buffer): the same limit here, so
    // a caller that asks for more fails on the CPU too.
    int64_t R = 0;
    for (const auto& in : batch) R += in.want_logits ? in.logit_rows : 0;
    if (ex_.plan().max_logit_rows > 0 && R > ex_.plan().max_logit_rows)
      throw RuntimeError(fmt::format("a step asking for {} output rows exceeds the plan's max_logit_rows {}", R,
                                     ex_.plan().max_logit_rows));
    std::vector<std::vector<float>> out(batch.size());
    for (size_t k = 0; k < batch.size(); ++k) {
      const auto& in = batch[k];
      const int64_t T = (int64_t)in.tokens.size();
      std::vector<int32_t> rows;
      if (in.want_logits)
        for (int64_t r = T - in.logit_rows; r < T; ++r) rows.push_back((int32_t)r);
      CpuSequence& sq = seq(in.slot);
      const int64_t from = sq.n_past;
      if (in.logit_rows > 1) sq.keep = T - 1;  // a verify step: keep what a rollback needs
      std::vector<float> hidden;
      TapFn tap;
      if (head_)
        tap = [&](const std::string& name, const float* x, int64_t n, int64_t w) {
          if (name == head_->hidden_from()) hidden.assign(x, x + n * w);
        };
      auto logits = ex_.forward(sq, in.tokens, rows, tap);
      if (head_) {
        if ((int64_t)hidden.size() != T * head_->width()) throw RuntimeError("the main model did not report its hidden");
        head_->observe(in.slot, from, in.tokens, hidden.data(), in.logit_rows <= 1);
      }
      if (in.want_logits) out[k] = std::move(logits);
    }
    return out;
  }
  std::shared_ptr<Snapshot> save(int slot) const override {
    auto snap = slots_->save(slot);
    if (head_) static_cast<CpuSnapshot&>(*snap).head = head_->save(slot);
    static_cast<CpuSnapshot&>(*snap).slot = slot;
    return snap;
  }
  // The draft head's cache rows are positional and stay in their slot, so a snapshot restores the head only into
  // the slot it came from, and only when no KV span was copied in (restore_kv) since: the prefix cache restores a
  // shared prefix into another slot, or into this one after its rows were overwritten. Otherwise the head resets
  // and the slot decodes without drafts until it resets (the output is the same; only the speed-up is lost).
  void restore(int slot, const Snapshot& snap) override {
    slots_->restore(slot, snap);
    if (head_) {
      const auto& cs = static_cast<const CpuSnapshot&>(snap);
      const bool spans = kv_copied_[(size_t)slot] != 0;
      kv_copied_[(size_t)slot] = 0;
      if (cs.head && cs.slot == slot && !spans) head_->restore(slot, *cs.head);
      else head_->reset(slot);
    }
  }
  int64_t snapshot_bytes() const override { return slots_->snapshot_bytes(); }
  int draft_tokens() const override { return head_ ? (int)ex_.plan().draft_tokens : 0; }
  bool can_draft(int slot) const override { return head_ && head_->ready(slot, seq(slot).n_past); }
  std::vector<int32_t> draft(int slot, int32_t next, int k, const DraftPick& pick) override {
    if (!head_) return Backend::draft(slot, next, k, pick);
    if (k < 1 || k > draft_tokens()) throw RuntimeError(fmt::format("draft of {} tokens (the plan drafts {})", k, draft_tokens()));
    if (next < 0 || next >= vocab_rows()) throw RuntimeError(fmt::format("token id {} is out of range", next));
    return head_->draft(slot, seq(slot).n_past, next, k, pick);
  }
  void rollback(int slot, int64_t position) override {
    if (!head_) return Backend::rollback(slot, position);
    seq(slot).rollback(position);
    head_->rollback(slot, position);
  }
  bool kv_spans() const override { return true; }
  std::shared_ptr<KvSpan> save_kv(int slot, int64_t begin, int64_t end) const override {
    return slots_->save_kv(slot, begin, end);
  }
  void restore_kv(int slot, const KvSpan& span, int64_t begin, int64_t end) override {
    slots_->restore_kv(slot, span, begin, end);
    if (head_) kv_copied_[(size_t)slot] = 1;
  }
  std::shared_ptr<KvSpan> slice_kv(const KvSpan& span, int64_t begin, int64_t end) const override {
    return slots_->slice_kv(span, begin, end);
  }

 private:
  CpuSequence& seq(int slot) { return slots_->seq(slot); }
  const CpuSequence& seq(int slot) const { return slots_->seq(slot); }

  std::shared_ptr<const gguf::File> file_;
  CpuExecutor ex_;
  std::optional<CpuSlots> slots_;  // made after the weights are read in
  std::optional<CpuDraftHead> head_;  // plans that draft (Plan::draft_tokens > 0)
  std::vector<char> kv_copied_;       // per slot: restore_kv ran since its last restore (see restore)
};

// One stage of a multi-stage CPU plan: the executor bound to the stage's ops, a sequence (its layers' states) per
// slot, and two input and two output buffers of a micro-batch of rows each.
class CpuStage final : public PipelineStage {
 public:
  CpuStage(const ir::Plan& plan, std::shared_ptr<const gguf::File> file, const std::string& device)
      : device_(device), ex_(plan, std::move(file), device), slots_(ex_, plan) {
    const int64_t rows = plan.rows_per_call();
    for (const auto& op : plan.graph.ops)
      if (op.kind == ir::OpKind::bridge && op.s("to") == device) in_width_ = op.types[0].shape.back();
    for (int b = 0; b < 2; ++b) {
      in_[b].assign((size_t)(rows * in_width_), NAN);
      out_[b].assign((size_t)(rows * ex_.bridge_width()), NAN);
    }
  }
  const std::string& device() const override { return device_; }
  int64_t out_width() const override { return ex_.bridge_width(); }
  int64_t vocab_rows() const override { return ex_.vocab_rows(); }
  int64_t position(int slot) const override { return seq(slot).n_past; }
  void reset(int slot) override { seq(slot).reset(); }
  std::shared_ptr<Snapshot> save(int slot) const override { return slots_.save(slot); }
  void restore(int slot, const Snapshot& snap) override { slots_.restore(slot, snap); }
  int64_t snapshot_bytes() const override { return slots_.snapshot_bytes(); }
  bool kv_spans() const override { return true; }
  std::shared_ptr<KvSpan> save_kv(int slot, int64_t begin, int64_t end) const override {
    return slots_.save_kv(slot, begin, end);
  }
  void restore_kv(int slot, const KvSpan& span, int64_t begin, int64_t end) override {
    slots_.restore_kv(slot, span, begin, end);
  }
  std::shared_ptr<KvSpan> slice_kv(const KvSpan& span, int64_t begin, int64_t end) const override {
    return slots_.slice_kv(span, begin, end);
  }
  void compute(const PipelineUnit& u, const std::vector<StepInput>& batch, int buf,
               const PipelineResults& res) override {
    int64_t row = 0;
    for (const PipelinePiece& p : u.pieces) {
      const auto& all = batch[(size_t)p.input].tokens;
      const std::vector<int32_t> tokens(all.begin() + p.begin, all.begin() + p.begin + p.count);
      std::vector<int32_t> rows;
      if (p.want_logits) rows.push_back((int32_t)p.count - 1);
      const float* in = ex_.first_stage() ? nullptr : in_[buf].data() + row * in_width_;
      float* out = ex_.last_stage() ? nullptr : out_[buf].data() + row * out_width();
      auto logits = ex_.forward(seq(p.slot), tokens, rows, nullptr, in, out);
      if (p.want_logits && ex_.last_stage()) (*res.logits)[(size_t)p.input] = std::move(logits);
      row += p.count;
    }
  }
  void download(int buf, float* host, int64_t rows) override {
    std::copy(out_[buf].begin(), out_[buf].begin() + rows * out_width(), host);
  }
  void upload(const float* host, int buf, int64_t rows) override {
    std::copy(host, host + rows * in_width_, in_[buf].begin());
  }
  std::shared_ptr<float> host_buffer(int64_t floats) override {
    return std::shared_ptr<float>(new float[(size_t)std::max<int64_t>(1, floats)], std::default_delete<float[]>());
  }

 private:
  CpuSequence& seq(int slot) { return slots_.seq(slot); }
  const CpuSequence& seq(int slot) const { return slots_.seq(slot); }

  std::string device_;
  CpuExecutor ex_;
  CpuSlots slots_;
  int64_t in_width_ = 0;
  std::vector<float> in_[2], out_[2];
};

}  // namespace

std::vector<std::unique_ptr<PipelineStage>> make_cpu_stages(const ir::Plan& plan) {
  auto file = open_plan_model(plan);
  std::vector<std::unique_ptr<PipelineStage>> stages;
  for (const auto& pl : plan.placement) stages.push_back(std::make_unique<CpuStage>(plan, file, pl.device));
  return stages;
}

std::unique_ptr<Backend> make_cpu_backend(const ir::Plan& plan, const BackendOptions& opt) {
  if (plan.placement.size() > 1) {
    if (opt.progress) read_weights_in(plan, *open_plan_model(plan), opt.progress);
    return make_pipeline(plan, make_cpu_stages(plan), PipelineOptions{opt.simulate_link_gbps});
  }
  return std::make_unique<CpuBackend>(plan, opt);
}

}  // namespace qrig::runtime
