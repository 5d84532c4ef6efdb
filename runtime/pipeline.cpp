// The pipeline backend (pipeline.h): stage threads, boundary threads, double-buffered hand-off with a host fence,
// failure of a step on every stage without leaving a thread blocked, and the units a step is cut into.
#include "runtime/pipeline.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace qrig::runtime {

std::vector<PipelineUnit> pipeline_units(const ir::Plan& plan, const std::vector<StepInput>& batch) {
  const int64_t m = std::max<int64_t>(1, plan.rows_per_call());
  const int64_t chunk = 64;
  // A piece shorter than this would run the recurrent GDN, or quantize its matmul inputs to two planes, where the
  // whole input (longer) does not: give it a chunk of the piece before it.
  const int64_t precise = plan.precise_rows >= plan.max_batch_tokens ? 0 : plan.precise_rows;  // all two-plane
  const int64_t short_piece = std::max<int64_t>(plan.gdn_recurrent_below, precise + 1);
  std::vector<PipelinePiece> pieces;
  for (size_t k = 0; k < batch.size(); ++k) {
    const int64_t T = (int64_t)batch[k].tokens.size();
    std::vector<int64_t> sizes;
    for (int64_t b = 0; b < T; b += m) sizes.push_back(std::min(m, T - b));
    if (sizes.size() > 1 && sizes.back() < short_piece) {
      // Whole chunks from the piece before (the plan's micro-batch leaves it long enough: Plan::read checks).
      const int64_t move = (short_piece - sizes.back() + chunk - 1) / chunk * chunk;
      sizes[sizes.size() - 2] -= move;
      sizes.back() += move;
    }
    int64_t b = 0;
    for (size_t j = 0; j < sizes.size(); ++j) {
      pieces.push_back({(int)k, batch[k].slot, b, sizes[j], batch[k].want_logits && j + 1 == sizes.size()});
      b += sizes[j];
    }
  }
  std::vector<PipelineUnit> units;
  bool all_single = !pieces.empty();
  for (const auto& p : pieces) all_single &= p.count == 1;
  const int64_t stages = (int64_t)plan.placement.size();
  if (all_single && stages > 1) {
    // Decode: groups of at least pipeline_decode_group_rows sequences, at most one per stage.
    const int64_t n = (int64_t)pieces.size();
    const int64_t per = std::max<int64_t>(1, plan.pipeline_decode_group_rows);
    const int64_t groups = std::max(std::clamp<int64_t>(n / per, 1, stages), (n + m - 1) / m);  // none above m rows
    for (int64_t g = 0; g < groups; ++g) {
      PipelineUnit u;
      for (int64_t i = n * g / groups; i < n * (g + 1) / groups; ++i) u.pieces.push_back(pieces[(size_t)i]);
      u.rows = (int64_t)u.pieces.size();
      if (u.rows > 0) units.push_back(std::move(u));
    }
    return units;
  }
  PipelineUnit cur;
  std::set<int> slots;
  for (const auto& p : pieces) {
    if (!cur.pieces.empty() && (cur.rows + p.count > m || slots.count(p.slot))) {
      units.push_back(std::move(cur));
      cur = {};
      slots.clear();
    }
    cur.pieces.push_back(p);
    cur.rows += p.count;
    slots.insert(p.slot);
  }
  if (!cur.pieces.empty()) units.push_back(std::move(cur));
  return units;
}

namespace {

struct PipelineSnapshot : Snapshot {
  std::vector<std::shared_ptr<Snapshot>> stages;
};
struct PipelineKvSpan : KvSpan {
  std::vector<std::shared_ptr<KvSpan>> stages;
  int64_t bytes() const override {
    int64_t b = 0;
    for (const auto& s : stages) b += s->bytes();
    return b;
  }
};
const PipelineKvSpan& pipeline_span(const KvSpan& span, size_t stages) {
  const auto* ps = dynamic_cast<const PipelineKvSpan*>(&span);
  if (!ps || ps->stages.size() != stages) throw RuntimeError("KV span of another backend");
  return *ps;
}

using Clock = std::chrono::steady_clock;
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

class PipelineBackend final : public Backend {
 public:
  PipelineBackend(const ir::Plan& plan, std::vector<std::unique_ptr<PipelineStage>> stages, const PipelineOptions& opt)
      : plan_(plan), stages_(std::move(stages)), opt_(opt) {
    const size_t S = stages_.size();
    if (S != plan_.placement.size() || S < 1)
      throw RuntimeError(fmt::format("the pipeline has {} stages, the plan {}", S, plan_.placement.size()));
    for (size_t s = 0; s < S; ++s) {
      if (stages_[s]->device() != plan_.placement[s].device)
        throw RuntimeError(fmt::format("pipeline stage {} runs {}, the plan places {} there", s,
                                       stages_[s]->device(), plan_.placement[s].device));
      if ((stages_[s]->out_width() > 0) != (s + 1 < S))
        throw RuntimeError(fmt::format("pipeline stage {} ({}): only the last stage has no output rows", s,
                                       stages_[s]->device()));
    }
    vocab_rows_ = stages_.front()->vocab_rows();
    host_.resize(S - 1);
    for (size_t b = 0; b + 1 < S; ++b)
      for (auto& h : host_[b]) h = stages_[b]->host_buffer(plan_.rows_per_call() * stages_[b]->out_width());
    computed_.assign(S, 0);
    downloaded_.assign(S, 0);
    delivered_.assign(S, 0);
    stats_.resize(S);
    for (size_t s = 0; s < S; ++s) stats_[s].device = stages_[s]->device();
    for (size_t s = 0; s < S; ++s) threads_.emplace_back([this, s] { stage_loop(s); });
    for (size_t b = 0; b + 1 < S; ++b) threads_.emplace_back([this, b] { bridge_loop(b); });
  }
  ~PipelineBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  const ir::Plan& plan() const override { return plan_; }
  int slots() const override { return (int)plan_.max_sequences; }
  int64_t vocab_rows() const override { return vocab_rows_; }
  int64_t context_length() const override { return plan_.context_length; }
  int64_t position(int slot) const override {
    int64_t p = INT64_MAX;
    for (const auto& s : stages_) p = std::min(p, s->position(slot));
    return p;
  }
  void reset(int slot) override {
    for (auto& s : stages_) s->reset(slot);
  }
  int32_t top_k_max() const override { return stages_.back()->top_k_max(); }
  std::shared_ptr<Snapshot> save(int slot) const override {
    auto snap = std::make_shared<PipelineSnapshot>();
    for (const auto& s : stages_) snap->stages.push_back(s->save(slot));
    snap->position = snap->stages.front()->position;
    for (const auto& st : snap->stages)
      if (st->position != snap->position) throw RuntimeError("pipeline stages disagree on a slot's position");
    return snap;
  }
  void restore(int slot, const Snapshot& snap) override {
    const auto* ps = dynamic_cast<const PipelineSnapshot*>(&snap);
    if (!ps || ps->stages.size() != stages_.size()) throw RuntimeError("snapshot of another backend");
    try {
      for (size_t s = 0; s < stages_.size(); ++s) stages_[s]->restore(slot, *ps->stages[s]);
    } catch (...) {
      reset(slot);  // never leave the stages at different positions
      throw;
    }
  }
  int64_t snapshot_bytes() const override {
    int64_t b = 0;
    for (const auto& s : stages_) b += s->snapshot_bytes();
    return b;
  }
  bool kv_spans() const override {
    for (const auto& s : stages_)
      if (!s->kv_spans()) return false;
    return true;
  }
  std::shared_ptr<KvSpan> save_kv(int slot, int64_t begin, int64_t end) const override {
    auto span = std::make_shared<PipelineKvSpan>();
    span->begin = begin;
    span->end = end;
    for (const auto& s : stages_) span->stages.push_back(s->save_kv(slot, begin, end));
    return span;
  }
  void restore_kv(int slot, const KvSpan& span, int64_t begin, int64_t end) override {
    const PipelineKvSpan& ps = pipeline_span(span, stages_.size());
    for (size_t s = 0; s < stages_.size(); ++s) stages_[s]->restore_kv(slot, *ps.stages[s], begin, end);
  }
  std::shared_ptr<KvSpan> slice_kv(const KvSpan& span, int64_t begin, int64_t end) const override {
    const PipelineKvSpan& ps = pipeline_span(span, stages_.size());
    auto out = std::make_shared<PipelineKvSpan>();
    out->begin = begin;
    out->end = end;
    for (size_t s = 0; s < stages_.size(); ++s) out->stages.push_back(stages_[s]->slice_kv(*ps.stages[s], begin, end));
    return out;
  }
  std::vector<StageStats> stage_stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_stage_stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : stats_) s = StageStats{s.device};
  }

  std::vector<std::vector<float>> step(const std::vector<StepInput>& batch) override {
    std::vector<std::optional<TopCandidates>> top;
    return run(batch, nullptr, top);
  }
  std::vector<std::vector<float>> step_select(const std::vector<StepInput>& batch, const std::vector<Select>& select,
                                              std::vector<std::optional<TopCandidates>>& top) override {
    if (select.size() != batch.size()) throw RuntimeError("step_select: one selection per input");
    return run(batch, &select, top);
  }

 private:
  void validate(const std::vector<StepInput>& batch) const {
    std::set<int> seen;
    for (const auto& in : batch) {
      if (in.slot < 0 || in.slot >= slots()) throw RuntimeError(fmt::format("no slot {}", in.slot));
      if (!seen.insert(in.slot).second) throw RuntimeError(fmt::format("slot {} appears twice in a step", in.slot));
      if (in.tokens.empty()) throw RuntimeError("step input with no tokens");
      if (in.logit_rows != 1)  // speculative decoding's verify steps: not on pipelines yet
        throw RuntimeError(fmt::format("a pipeline returns the logits of one row per input, not {}", in.logit_rows));
      const int64_t pos = position(in.slot);
      if (pos + (int64_t)in.tokens.size() > context_length())
        throw RuntimeError(fmt::format("context overflow in slot {}: {} + {} > {}", in.slot, pos, in.tokens.size(),
                                       context_length()));
      for (int32_t t : in.tokens)
        if (t < 0 || t >= vocab_rows_) throw RuntimeError(fmt::format("token id {} is out of range", t));
      for (const auto& s : stages_)
        if (s->position(in.slot) != pos)
          throw RuntimeError(fmt::format("slot {}: the pipeline's stages are at different positions", in.slot));
    }
  }

  std::vector<std::vector<float>> run(const std::vector<StepInput>& batch, const std::vector<Select>* select,
                                      std::vector<std::optional<TopCandidates>>& top) {
    validate(batch);
    std::vector<std::vector<float>> logits(batch.size());
    top.assign(batch.size(), std::nullopt);
    if (batch.empty()) return logits;
    std::vector<PipelineUnit> units = pipeline_units(plan_, batch);
    {
      std::unique_lock<std::mutex> lock(mu_);
      batch_ = &batch;
      units_ = &units;
      results_ = {&logits, &top, select};
      error_ = nullptr;
      std::fill(computed_.begin(), computed_.end(), 0);
      std::fill(downloaded_.begin(), downloaded_.end(), 0);
      std::fill(delivered_.begin(), delivered_.end(), 0);
      ++generation_;
      cv_.notify_all();
      cv_.wait(lock, [&] { return computed_.back() == (int64_t)units.size() && bridges_idle(); });
      units_ = nullptr;
      batch_ = nullptr;
      if (error_) std::rethrow_exception(error_);
    }
    return logits;
  }

  bool bridges_idle() const {
    for (size_t b = 0; b + 1 < stages_.size(); ++b)
      if (delivered_[b] != (int64_t)units_->size()) return false;
    return true;
  }

  // Stage s may compute unit i once its input has arrived and unit i-2 has left its output buffer.
  bool can_compute(size_t s, int64_t i) const {
    if (s > 0 && delivered_[s - 1] <= i) return false;
    if (s + 1 < stages_.size() && downloaded_[s] < i - 1) return false;
    return true;
  }

  void stage_loop(size_t s) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const int64_t n = (int64_t)units_->size();
      for (int64_t i = 0; i < n; ++i) {
        cv_.wait(lock, [&] { return stop_ || can_compute(s, i); });
        if (stop_) return;
        const bool failed = error_ != nullptr;
        const PipelineUnit& u = (*units_)[(size_t)i];
        const auto& batch = *batch_;
        const PipelineResults res = results_;
        lock.unlock();
        std::exception_ptr err;
        const auto t0 = Clock::now();
        if (!failed) {  // after a failure the rest of the step drains without work
          try {
            stages_[s]->compute(u, batch, (int)(i % 2), res);
          } catch (...) {
            err = std::current_exception();
          }
        }
        const double dt = seconds(Clock::now() - t0);
        lock.lock();
        if (err && !error_) error_ = err;
        stats_[s].busy_s += dt;
        stats_[s].units += failed ? 0 : 1;
        computed_[s] = i + 1;
        cv_.notify_all();
      }
    }
  }

  // Boundary b moves unit i from stage b's output buffer to stage b+1's input buffer once stage b has computed it
  // and stage b+1 has finished unit i-2 (which read that input buffer).
  void bridge_loop(size_t b) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const int64_t n = (int64_t)units_->size();
      for (int64_t i = 0; i < n; ++i) {
        cv_.wait(lock, [&] { return stop_ || (computed_[b] > i && computed_[b + 1] >= i - 1); });
        if (stop_) return;
        const bool failed = error_ != nullptr;
        const int64_t rows = (*units_)[(size_t)i].rows;
        const int buf = (int)(i % 2);
        lock.unlock();
        std::exception_ptr err;
        const auto t0 = Clock::now();
        double link = 0;
        if (!failed) {
          try {
            float* host = host_[b][buf].get();
            stages_[b]->download(buf, host, rows);  // returns once the rows are in host memory: the fence
            const double bytes = (double)rows * (double)stages_[b]->out_width() * 4;
            // A simulated link: the device -> host leg, then (after the upload) the host -> device one.
            if (opt_.simulate_link_gbps > 0) link = bytes / (opt_.simulate_link_gbps * 1e9);
            if (link > 0) std::this_thread::sleep_for(std::chrono::duration<double>(link));
            stages_[b + 1]->upload(host, buf, rows);
            if (link > 0) std::this_thread::sleep_for(std::chrono::duration<double>(link));
          } catch (...) {
            err = std::current_exception();
          }
        }
        const double dt = seconds(Clock::now() - t0);
        lock.lock();
        if (err && !error_) error_ = err;
        stats_[b].bridge_s += dt;
        stats_[b].bridge_bytes += failed ? 0 : rows * stages_[b]->out_width() * 4;
        downloaded_[b] = i + 1;
        delivered_[b] = i + 1;
        cv_.notify_all();
      }
    }
  }

  ir::Plan plan_;
  std::vector<std::unique_ptr<PipelineStage>> stages_;
  PipelineOptions opt_;
  int64_t vocab_rows_ = 0;
  std::vector<std::thread> threads_;
  std::vector<std::array<std::shared_ptr<float>, 2>> host_;  // per boundary, double-buffered

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  const std::vector<StepInput>* batch_ = nullptr;
  const std::vector<PipelineUnit>* units_ = nullptr;
  PipelineResults results_;
  std::exception_ptr error_;
  std::vector<int64_t> computed_, downloaded_, delivered_;  // units done per stage / boundary in this step
  std::vector<StageStats> stats_;
};

}  // namespace

std::unique_ptr<Backend> make_pipeline(const ir::Plan& plan, std::vector<std::unique_ptr<PipelineStage>> stages,
                                       const PipelineOptions& opt) {
  return std::make_unique<PipelineBackend>(plan, std::move(stages), opt);
}

}  // namespace qrig::runtime
