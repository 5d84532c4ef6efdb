// The running half of the CUDA executor (executor.h): one step = every op of the graph over the rows of all
// sequences in the batch, per-sequence ops on each sequence's rows; snapshots of recurrent state.
#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "ir/ops.h"
#include "runtime/cuda/executor_impl.h"

namespace qrig::runtime {

CudaExecutor::CudaExecutor(const ir::Plan& plan, std::shared_ptr<const gguf::File> file, const CudaOptions& opt)
    : impl_(std::make_unique<Impl>()) {
  impl_->plan = plan;
  impl_->file = std::move(file);
  impl_->opt = opt;
  try {
    impl_->bind();
  } catch (const cuda::KernelError& e) {
    throw RuntimeError(std::string("CUDA kernels: ") + e.what());
  } catch (const cuda::CudaError& e) {
    throw RuntimeError(std::string("CUDA: ") + e.what());
  }
}

CudaExecutor::~CudaExecutor() {
  // Queued work must finish before buffers are freed and kernel libraries unloaded.
  if (impl_ && impl_->stream) {
    try {
      impl_->stream->sync("CUDA executor shutdown");
    } catch (const std::exception&) {
    }
  }
}

const ir::Plan& CudaExecutor::plan() const { return impl_->plan; }
int CudaExecutor::slots() const { return (int)impl_->slots.size(); }
int64_t CudaExecutor::vocab_rows() const { return impl_->vocab_rows; }
int64_t CudaExecutor::position(int slot) const { return impl_->slot(slot).n_past; }
std::string CudaExecutor::device_name() const { return impl_->info.name; }
std::string CudaExecutor::kernel_load() const { return impl_->kernel_load; }
std::pair<int64_t, int64_t> CudaExecutor::programmatic_kernels() const {
  int64_t on = 0;
  for (const auto& [name, k] : impl_->kernels) on += k->kernel.programmatic();
  return {on, (int64_t)impl_->kernels.size()};
}
int64_t CudaExecutor::device_bytes() const { return impl_->allocated; }
float* CudaExecutor::bridge_in(int buf) const { return impl_->bridge_in[buf & 1].data(); }
float* CudaExecutor::bridge_out(int buf) const { return impl_->bridge_out[buf & 1].data(); }
int64_t CudaExecutor::bridge_in_width() const { return impl_->layout.bridge_in_width; }
int64_t CudaExecutor::bridge_out_width() const { return impl_->layout.bridge_out_width; }
bool CudaExecutor::has_output() const { return impl_->layout.has_output; }
int CudaExecutor::device() const { return impl_->opt.device; }

void CudaExecutor::synchronize() const { impl_->stream->sync("CUDA executor"); }
GraphStats CudaExecutor::graph_stats() const { return impl_->graph_stats; }

void CudaExecutor::set_profiling(bool on) {
  Impl& m = *impl_;
  m.profiling = on;
  if (on) {
    m.profile_sums.clear();
    m.profile_order.clear();
  }
}

std::vector<OpProfile> CudaExecutor::profile() const {
  std::vector<OpProfile> out;
  for (const std::string& k : impl_->profile_order) out.push_back(impl_->profile_sums.at(k));
  return out;
}

namespace {

// What a profile entry is called: the op's kind and the kernels its kernel attribute (or, in a decode step the plan
// batches, its decode_kernel attribute) names for this step.
std::string profile_key(const CudaStep& s, int64_t n, bool batched_decode, int64_t seqs) {
  const std::vector<ir::LaunchRange>* ranges = &s.ranges;
  if (batched_decode && s.batched_range_for(seqs) >= 0) {
    ranges = &s.decode_ranges;
    n = seqs;
  }
  std::string names;
  for (const ir::LaunchRange& r : *ranges)
    if (n >= r.first && n <= r.last)
      for (const auto& part : r.parts)
        for (const std::string& v : part) names += (names.empty() ? "" : " + ") + v;
  return std::string(ir::op_name(s.b->kind)) + (names.empty() ? "" : ": " + names);
}

}  // namespace

void CudaExecutor::reset(int slot) {
  Impl& m = *impl_;
  Slot& s = m.slot(slot);
  s.n_past = 0;  // KV entries at positions >= n_past are never read before being written again
  s.kept_from = -1;
  s.kept_count = 0;
  if (s.rec.bytes() == 0) return;
  try {
    cuda::DeviceGuard guard(m.opt.device);
    cuda::fill_device_bytes_async(s.rec.data(), 0, s.rec.bytes(), m.stream->get(), "reset of slot states");
  } catch (const cuda::CudaError& e) {
    throw RuntimeError(std::string("CUDA: ") + e.what());
  }
}

StepOutput CudaExecutor::step(const std::vector<StepInput>& batch, const std::vector<std::vector<int32_t>>& rows,
                              bool want_logits, bool want_argmax, const TapFn& tap, int stage_buf) {
  Impl& m = *impl_;
  if (batch.empty()) throw RuntimeError("a step needs at least one input");
  const bool bridged = m.bridge_in_step >= 0 || m.bridge_out_value >= 0;
  if (bridged != (stage_buf == 0 || stage_buf == 1))
    throw RuntimeError(bridged ? "a pipeline stage's step names its bridge buffer (0 or 1)"
                               : "only a pipeline stage's step has bridge buffers");
  if (rows.size() != batch.size()) throw RuntimeError("step: one list of output rows per input");
  // Validate everything before any state changes.
  std::set<int> seen;
  std::vector<int32_t> tok, pos, out_rows;
  std::vector<int64_t> offset, keep;
  for (size_t k = 0; k < batch.size(); ++k) {
    const StepInput& in = batch[k];
    const Slot& s = m.slot(in.slot);
    if (!seen.insert(in.slot).second) throw RuntimeError(fmt::format("slot {} appears twice in one step", in.slot));
    if (in.tokens.empty()) throw RuntimeError("step input with no tokens");
    if (s.n_past + (int64_t)in.tokens.size() > m.plan.context_length)
      throw RuntimeError(fmt::format("context overflow in slot {}: {} tokens + {} new > context length {}", in.slot,
                                     s.n_past, in.tokens.size(), m.plan.context_length));
    for (int32_t t : in.tokens)
      if (t < 0 || t >= m.vocab_rows) throw RuntimeError(fmt::format("token id {} is out of range [0, {})", t, m.vocab_rows));
    for (int32_t r : rows[k]) {
      if (r < 0 || r >= (int32_t)in.tokens.size())
        throw RuntimeError(fmt::format("output row {} is out of range [0, {})", r, in.tokens.size()));
      out_rows.push_back((int32_t)tok.size() + r);
    }
    // A verify step of speculative decoding (StepInput::logit_rows > 1): the recurrent states after each of its
    // tokens but the last are kept for rollback() (the last one's are the live states).
    const int64_t nt = (int64_t)in.tokens.size();
    if (in.logit_rows < 1 || in.logit_rows > nt)
      throw RuntimeError(fmt::format("slot {}: logits of {} rows of a step of {} tokens", in.slot, in.logit_rows, nt));
    keep.push_back(in.logit_rows > 1 ? nt - 1 : 0);
    if (keep.back() > m.plan.draft_tokens)
      throw RuntimeError(fmt::format("slot {}: a verify step of {} tokens; this plan keeps the states of {} draft "
                                     "tokens", in.slot, nt, m.plan.draft_tokens));
    if (keep.back() > 0)
      for (const CudaStep& st : m.steps)
        if (st.gdn && !st.gdn->recurrent_for(nt))
          throw RuntimeError(fmt::format("{}: a verify step of {} tokens would run the chunked GDN, which keeps no "
                                         "state per token", st.b->op->describe(), nt));
    offset.push_back((int64_t)tok.size());
    for (size_t i = 0; i < in.tokens.size(); ++i) {
      tok.push_back(in.tokens[i]);
      pos.push_back((int32_t)(s.n_past + (int64_t)i));
    }
  }
  const int64_t T = (int64_t)tok.size(), R = (int64_t)out_rows.size();
  if (T > m.layout.max_t)
    throw RuntimeError(fmt::format("a step of {} tokens exceeds the plan's max_batch_tokens {}", T, m.layout.max_t));
  if (R > m.layout.max_r)
    throw RuntimeError(fmt::format("a step asking for {} output rows exceeds the plan's max_logit_rows {}", R,
                                   m.layout.max_r));
  if ((want_logits || want_argmax) && R == 0) throw RuntimeError("step asks for outputs but names no rows");
  if (R > 0 && !m.layout.has_output)
    throw RuntimeError(fmt::format("stage {} hands its rows on: it has no output rows", m.opt.stage));

  cuda::DeviceGuard guard(m.opt.device);
  const cuda::StreamHandle st = m.stream->get();
  cuda::copy_to_device_async(m.tokens_dev.data(), tok.data(), (size_t)T * 4, st, "step tokens");
  cuda::copy_to_device_async(m.pos_dev.data(), pos.data(), (size_t)T * 4, st, "step positions");
  if (R > 0) cuda::copy_to_device_async(m.rows_dev.data(), out_rows.data(), (size_t)R * 4, st, "step rows");
  // A decode step of several sequences: their slots and positions for the batched kernels (decode_seq, read by the
  // launches of this step or by the graph replayed for it).
  const bool decode = std::all_of(batch.begin(), batch.end(), [](const StepInput& in) { return in.tokens.size() == 1; });
  std::vector<int32_t> seq;
  if (decode && batch.size() >= 2) {
    const size_t n = m.slots.size();
    seq.assign(2 * n, 0);
    for (size_t k = 0; k < batch.size(); ++k) {
      seq[k] = batch[k].slot;
      seq[n + k] = (int32_t)m.slot(batch[k].slot).n_past;
    }
    cuda::copy_to_device_async(m.decode_seq.data(), seq.data(), seq.size() * 4, st, "decode step's slots and positions");
  }

  const StepCx cx{m, batch, offset, out_rows, keep, T, R, st, decode};
  // A stage's incoming rows, from the bridge buffer the boundary filled, into the bridge op's place.
  if (m.bridge_in_step >= 0)
    cuda::copy_on_device(m.steps[(size_t)m.bridge_in_step].out[0], m.bridge_in[stage_buf].data(),
                         (size_t)(T * m.layout.bridge_in_width) * 4, st, "bridge rows into the stage");
  // Every op of the graph (eager, or into a capture with `recorder` on for the patchable ops), or with
  // `patcher` only the patchable ops, updating a captured graph instead of launching.
  // Profiling: events before and after each op (eager steps only), read once the step is done.
  std::vector<std::pair<std::string, size_t>> timed;  // key, index of the op's first event
  auto run_ops = [&](cuda::LaunchHook* recorder, cuda::LaunchHook* patcher) {
    const bool prof = m.profiling && !recorder && !patcher;
    for (const CudaStep& s : m.steps) {
      const int64_t n = s.b->rows ? R : T;
      if (n == 0) continue;
      const bool patch = patchable(s.b->kind);
      if (patcher && !patch) continue;
      cuda::ScopedLaunchHook scoped(patch ? (patcher ? patcher : recorder) : nullptr);
      if (prof) {
        const size_t e = timed.size() * 2;
        while (m.profile_events.size() < e + 2) m.profile_events.push_back(std::make_unique<cuda::Event>(m.opt.device));
        timed.emplace_back(profile_key(s, n, decode && batch.size() >= 2, (int64_t)batch.size()), e);
        m.profile_events[e]->record(st);
        run_op(cx, s);
        m.profile_events[e + 1]->record(st);
      } else {
        run_op(cx, s);
      }
      // A plan that drafts: the rows the MTP head reads, out of the arena before later ops reuse their place.
      if (m.hidden_value >= 0 && s.b->results.size() == 1 && s.b->results[0] == m.hidden_value)
        cuda::copy_on_device(m.hidden_stage.data(), s.out[0], (size_t)(T * m.layout.draft_width) * 4, st,
                             "the step's rows for the draft head");
      if (tap && !s.b->tap.empty()) {
        const int64_t w = m.graph->width(s.b->results[0]);
        std::vector<float> host((size_t)(n * w));
        cuda::copy_to_host_async(host.data(), s.out[0], host.size() * 4, st, "tap " + s.b->tap);
        m.stream->sync("tap " + s.b->tap);
        tap(s.b->tap, host.data(), n, w);
      }
    }
  };
  try {
    if (m.use_graphs && decode && !tap && !m.profiling) {
      // The graph's shape: the step's slots, or for a batched decode step only their number (slot_free_step).
      std::vector<int32_t> key;
      if (slot_free_step(m, (int64_t)batch.size()))
        key = {-2, (int32_t)batch.size()};
      else
        for (const StepInput& in : batch) key.push_back(in.slot);
      key.push_back(-1);
      key.insert(key.end(), out_rows.begin(), out_rows.end());
      auto it = m.graphs.find(key);
      bool replayed = false;
      if (it != m.graphs.end()) {
        cuda::StepGraph& gr = *it->second;
        gr.begin_patch();
        run_ops(nullptr, gr.patcher());
        if (gr.finish_patch()) {
          gr.launch(st);
          replayed = true;
          ++m.graph_stats.replayed;
          m.graph_patch_failures = 0;
        } else {
          m.graphs.erase(it);  // its shape changed: capture anew
          // Refused updates again and again (not a shape change): this driver cannot patch; run eagerly.
          if (++m.graph_patch_failures >= 8) m.use_graphs = false;
        }
      }
      if (!replayed) {
        if (m.graphs.size() >= 64) m.graphs.clear();  // many shapes (slot combinations, unbatched): start over
        auto gr = std::make_unique<cuda::StepGraph>(st);
        bool captured = false;
        try {
          run_ops(gr->recorder(), nullptr);
          gr->end_capture();
          captured = true;
        } catch (const cuda::CudaError& e) {
          // Nothing of the step ran (a capture launches nothing): run it eagerly, and no more graphs.
          gr->abort_capture();
          m.use_graphs = false;
          m.graph_stats.disabled_because = e.what();
        } catch (...) {
          gr->abort_capture();
          throw;
        }
        if (captured) {
          gr->launch(st);
          m.graphs[key] = std::move(gr);
          ++m.graph_stats.captured;
        } else {
          run_ops(nullptr, nullptr);
          ++m.graph_stats.eager;
        }
      }
    } else {
      run_ops(nullptr, nullptr);
      ++m.graph_stats.eager;
    }
    StepOutput result;
    if (m.bridge_out_value >= 0) {
      cuda::copy_on_device(m.bridge_out[stage_buf].data(), m.f32_of[(size_t)m.bridge_out_value],
                           (size_t)(T * m.layout.bridge_out_width) * 4, st, "bridge rows out of the stage");
      m.stream->sync("stage step");
    } else if (bridged) {
      m.stream->sync("stage step");  // the pipeline needs the step complete when this returns
    }
    const float* logits = m.layout.has_output ? m.steps.back().out[0] : nullptr;
    if (want_argmax) {
      const int64_t valid = m.plan.vocab_real > 0 ? std::min(m.plan.vocab_real, m.vocab_rows) : m.vocab_rows;
      cuda::launch_argmax_f32(*m.argmax, logits, R, m.vocab_rows, valid, m.argmax_dev.data(), st);
      result.argmax.resize((size_t)R);
      cuda::copy_to_host_async(result.argmax.data(), m.argmax_dev.data(), (size_t)R * 4, st, "argmax");
    }
    if (want_logits) {
      result.logits.resize((size_t)(R * m.vocab_rows));
      cuda::copy_to_host_async(result.logits.data(), logits, result.logits.size() * 4, st, "logits");
    }
    if (want_logits || want_argmax) m.stream->sync("step");
    if (!timed.empty()) {
      m.stream->sync("profiled step");
      for (const auto& [key, e] : timed) {
        auto [it, fresh] = m.profile_sums.try_emplace(key, OpProfile{key, 0, 0.0});
        if (fresh) m.profile_order.push_back(key);
        ++it->second.calls;
        it->second.ms += cuda::Event::elapsed_ms(*m.profile_events[e], *m.profile_events[e + 1]);
      }
    }
    for (size_t k = 0; k < batch.size(); ++k) {
      Slot& sl = m.slot(batch[k].slot);
      sl.kept_from = keep[k] > 0 ? sl.n_past : -1;
      sl.kept_count = keep[k];
      sl.n_past += (int64_t)batch[k].tokens.size();
    }
    m.last_rows = R;
    return result;
  } catch (const std::exception& e) {
    m.last_rows = 0;
    // Some layers' states may have advanced: the batch's sequences start over rather than continue wrong.
    for (const StepInput& in : batch) {
      try {
        reset(in.slot);
      } catch (const std::exception&) {
      }
    }
    throw RuntimeError(std::string("CUDA step failed (the step's sequences were reset): ") + e.what());
  }
}

std::vector<TopCandidates> CudaExecutor::select_top(const std::vector<cuda::TopKRow>& rows) try {
  Impl& m = *impl_;
  if ((int64_t)rows.size() != m.last_rows)
    throw RuntimeError(fmt::format("select_top: {} rows for a step of {} output rows", rows.size(), m.last_rows));
  if (rows.empty()) return {};
  if (!m.top_k) throw RuntimeError("select_top: this stage has no output rows");
  cuda::DeviceGuard guard(m.opt.device);
  m.top_k->enqueue(m.steps.back().out[0], rows, m.stream->get());
  return m.top_k->collect(m.stream->get());
} catch (const cuda::KernelError& e) {
  throw RuntimeError(std::string("CUDA sampling candidates: ") + e.what());
} catch (const cuda::CudaError& e) {
  throw RuntimeError(std::string("CUDA sampling candidates: ") + e.what());
}

bool CudaExecutor::top_k_fits(const cuda::TopKRow& row) const { return impl_->top_k && impl_->top_k->fits(row); }

std::vector<float> CudaExecutor::logits_row(int64_t row) try {
  Impl& m = *impl_;
  if (row < 0 || row >= m.last_rows)
    throw RuntimeError(fmt::format("logits_row {}: the last step has {} output rows", row, m.last_rows));
  cuda::DeviceGuard guard(m.opt.device);
  std::vector<float> out((size_t)m.vocab_rows);
  cuda::copy_to_host_async(out.data(), m.steps.back().out[0] + row * m.vocab_rows, out.size() * 4,
                           m.stream->get(), "logits row");
  m.stream->sync("logits row");
  return out;
} catch (const cuda::CudaError& e) {
  throw RuntimeError(std::string("CUDA logits: ") + e.what());
}

std::shared_ptr<Snapshot> CudaExecutor::save(int slot) const try {
  const Impl& m = *impl_;
  const Slot& s = const_cast<Impl&>(m).slot(slot);
  cuda::DeviceGuard guard(m.opt.device);
  auto snap = std::make_shared<CudaSnapshot>();
  snap->device = m.opt.device;
  snap->position = s.n_past;
  if (s.rec.size() > 0) {
    snap->rec = cuda::DeviceBuffer<float>(m.opt.device, s.rec.size(), fmt::format("snapshot of slot {}", slot));
    cuda::copy_on_device(snap->rec.data(), s.rec.data(), s.rec.bytes(), m.stream->get(), "snapshot");
    m.stream->sync("snapshot");
  }
  return snap;
} catch (const cuda::CudaError& e) {
  throw RuntimeError(std::string("CUDA snapshot: ") + e.what());
}

void CudaExecutor::restore(int slot, const Snapshot& snap) {
  Impl& m = *impl_;
  const auto* cs = dynamic_cast<const CudaSnapshot*>(&snap);
  Slot& s = m.slot(slot);
  if (!cs || cs->rec.size() != s.rec.size()) throw RuntimeError("snapshot of another backend");
  if (cs->position < 0 || cs->position > m.plan.context_length || cs->device != m.opt.device)
    throw RuntimeError("snapshot does not fit this executor");
  try {
    cuda::DeviceGuard guard(m.opt.device);
    if (s.rec.bytes() > 0) {
      cuda::copy_on_device(s.rec.data(), cs->rec.data(), s.rec.bytes(), m.stream->get(), "restore");
      m.stream->sync("restore");  // the caller may free the snapshot as soon as this returns
    }
  } catch (const cuda::CudaError& e) {
    s.n_past = 0;
    throw RuntimeError(std::string("CUDA restore: ") + e.what());
  }
  s.n_past = cs->position;
  s.kept_from = -1;  // a verify step's copies belong to the state before the restore
  s.kept_count = 0;
}

void CudaExecutor::rollback(int slot, int64_t position) {
  Impl& m = *impl_;
  Slot& s = m.slot(slot);
  if (position == s.n_past) return;  // everything the last step ran is kept
  if (s.kept_from < 0)
    throw RuntimeError(fmt::format("rollback of slot {} to position {}: it is at {} and its last step kept positions "
                                   "for none (not a verify step, or rolled back already)", slot, position, s.n_past));
  if (position <= s.kept_from || position > s.kept_from + s.kept_count)
    throw RuntimeError(fmt::format("rollback of slot {} to position {}: it is at {} and its last step kept positions "
                                   "{}..{}", slot, position, s.n_past, s.kept_from + 1, s.kept_from + s.kept_count));
  const int64_t idx = position - s.kept_from - 1;  // the copy after token `position - 1`
  try {
    cuda::DeviceGuard guard(m.opt.device);
    // Key and value caches keep their rows (append-only by position: the rows past `position` are written again
    // before they are read); the recurrent states come back from the kept image.
    if (s.rec.bytes() > 0)
      cuda::copy_on_device(s.rec.data(), s.kept.data() + idx * m.layout.rec_floats, s.rec.bytes(), m.stream->get(),
                           "rollback of the recurrent states");
  } catch (const cuda::CudaError& e) {
    reset(slot);
    throw RuntimeError(std::string("CUDA rollback (the slot was reset): ") + e.what());
  }
  s.n_past = position;
  s.kept_from = -1;  // what was kept after `position` is stale now
  s.kept_count = 0;
}

int64_t CudaExecutor::snapshot_bytes() const { return impl_->layout.rec_floats * 4; }

int64_t CudaExecutor::draft_width() const { return impl_->draft_graph ? impl_->layout.draft_width : 0; }
int64_t CudaExecutor::draft_pending_rows() const { return impl_->draft_graph ? impl_->layout.draft_pending_rows : 0; }
const float* CudaExecutor::step_hidden() const { return impl_->hidden_stage.data(); }
const float* CudaExecutor::draft_carry() const { return impl_->draft_carry.data(); }
float* CudaExecutor::draft_pending(int slot) { return impl_->slot(slot).draft_pending.data(); }

void CudaExecutor::draft_copy(void* dst, const void* src, int64_t rows, DraftCopy how) try {
  Impl& m = *impl_;
  if (!m.draft_graph) throw RuntimeError("the plan has no draft head");
  if (rows <= 0) return;
  const size_t bytes = (size_t)(rows * m.layout.draft_width) * 4;
  cuda::DeviceGuard guard(m.opt.device);
  const cuda::StreamHandle st = m.stream->get();
  switch (how) {
    case DraftCopy::on_device: cuda::copy_on_device(dst, src, bytes, st, "draft head rows"); break;
    case DraftCopy::to_host:
      cuda::copy_to_host_async(dst, src, bytes, st, "draft head rows to the host");
      m.stream->sync("draft head rows to the host");
      break;
    case DraftCopy::to_device:
      cuda::copy_to_device_async(dst, src, bytes, st, "draft head rows to the device");
      m.stream->sync("draft head rows to the device");  // the host rows may go as soon as this returns
      break;
  }
} catch (const cuda::CudaError& e) {
  throw RuntimeError(std::string("CUDA draft head: ") + e.what());
}

std::vector<float> CudaExecutor::draft_forward(int slot, int64_t pos, const std::vector<int32_t>& tokens,
                                               const std::vector<DraftRows>& hidden, const std::vector<int32_t>& rows,
                                               const TapFn& tap) {
  Impl& m = *impl_;
  if (!m.draft_graph) throw RuntimeError("the plan has no draft head");
  m.slot(slot);
  const int64_t T = (int64_t)tokens.size(), R = (int64_t)rows.size(), W = m.layout.draft_width;
  if (T < 1 || T > m.layout.max_t)
    throw RuntimeError(fmt::format("a draft head call of {} rows (1..{})", T, m.layout.max_t));
  int64_t n = 0;
  for (const DraftRows& h : hidden) {
    if (h.n < 0 || !h.rows) throw RuntimeError("draft head: an empty part of its hidden rows");
    n += h.n;
  }
  if (n != T) throw RuntimeError(fmt::format("draft head: {} hidden rows for {} tokens", n, T));
  if (pos < 0 || pos + T > m.plan.context_length)
    throw RuntimeError(fmt::format("draft head: rows {}..{} beyond the context length {}", pos, pos + T - 1,
                                   m.plan.context_length));
  for (int32_t t : tokens)
    if (t < 0 || t >= m.vocab_rows) throw RuntimeError(fmt::format("token id {} is out of range [0, {})", t, m.vocab_rows));
  if (R > m.layout.max_r) throw RuntimeError(fmt::format("draft head: {} output rows (at most {})", R, m.layout.max_r));
  for (int32_t r : rows)
    if (r < 0 || r >= T) throw RuntimeError(fmt::format("draft head: output row {} of {} rows", r, T));
  try {
    cuda::DeviceGuard guard(m.opt.device);
    const cuda::StreamHandle st = m.stream->get();
    std::vector<int32_t> pos_h((size_t)T);
    for (int64_t i = 0; i < T; ++i) pos_h[(size_t)i] = (int32_t)(pos + i);
    cuda::copy_to_device_async(m.tokens_dev.data(), tokens.data(), (size_t)T * 4, st, "draft head tokens");
    cuda::copy_to_device_async(m.pos_dev.data(), pos_h.data(), (size_t)T * 4, st, "draft head positions");
    int64_t at = 0;
    for (const DraftRows& h : hidden) {
      float* dst = m.draft_hidden.data() + at * W;
      if (h.host) cuda::copy_to_device_async(dst, h.rows, (size_t)(h.n * W) * 4, st, "draft head rows");
      else cuda::copy_on_device(dst, h.rows, (size_t)(h.n * W) * 4, st, "draft head rows");
      at += h.n;
    }
    const std::vector<StepInput> batch{StepInput{slot, tokens, R > 0}};
    const std::vector<int64_t> offset{0}, keep{0};
    const StepCx cx{m, batch, offset, rows, keep, T, R, st, false, true, pos};
    for (const CudaStep& s : m.draft_steps) {
      const int64_t nr = s.b->rows ? R : T;
      if (nr == 0) continue;
      run_op(cx, s);
      if (s.b->results.size() == 1 && s.b->results[0] == m.carry_value)  // its last row, for the next draft step
        cuda::copy_on_device(m.draft_carry.data(), s.out[0] + (T - 1) * W, (size_t)W * 4, st, "draft head carry");
      if (tap && !s.b->tap.empty()) {
        const int64_t w = m.draft_graph->width(s.b->results[0]);
        std::vector<float> host((size_t)(nr * w));
        cuda::copy_to_host_async(host.data(), s.out[0], host.size() * 4, st, "tap " + s.b->tap);
        m.stream->sync("tap " + s.b->tap);
        tap(s.b->tap, host.data(), nr, w);
      }
    }
    std::vector<float> logits;
    if (R > 0) {
      logits.resize((size_t)(R * m.vocab_rows));
      cuda::copy_to_host_async(logits.data(), m.draft_steps.back().out[0], logits.size() * 4, st, "draft head logits");
    }
    m.stream->sync("draft head");
    m.last_rows = 0;  // the main step's logits were in the arena the head shares
    return logits;
  } catch (const cuda::KernelError& e) {
    throw RuntimeError(std::string("CUDA draft head: ") + e.what());
  } catch (const cuda::CudaError& e) {
    throw RuntimeError(std::string("CUDA draft head: ") + e.what());
  }
}

}  // namespace qrig::runtime
