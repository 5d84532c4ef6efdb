// Engine scheduler: admission with prefix reuse, chunked prefill mixed with decode, sampling, finishing, and
// sample groups (one prefill, then each sample from the prompt's snapshot in the same slot).
#include "runtime/engine.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "runtime/errors.h"
#include "runtime/speculative.h"

namespace qrig::runtime {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}
}  // namespace

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::stop: return "stop";
    case Finish::length: return "length";
    case Finish::cancelled: return "cancelled";
    case Finish::error: return "error";
  }
  return "?";
}

// The shared prefill of a sample group (submit_group). Touched by the worker thread only.
struct Engine::Group {
  std::shared_ptr<Snapshot> snap;  // the slot's state after the prompt
  std::vector<float> logits;       // the logits after the prompt: every sample's first token is drawn from them
  int slot = -1;                   // the slot whose KV entries below the prompt's end are the prompt's
  bool ready = false;              // snap and logits are set, and the slot still holds the prompt
  bool broken = false;             // the first sample ended before `ready`, or the slot's state was lost:
                                   // the samples still waiting prefill on their own like any request
};

struct Engine::Active {
  uint64_t id = 0;
  Request req;
  Callbacks cb;
  std::unique_ptr<Sampler> sampler;
  std::shared_ptr<Group> group;  // a sample of a group (the first one prefills for all)
  bool leads_group = false;
  bool first_from_group = false;  // started from the group's snapshot: the first token comes from its logits
  int slot = -1;
  size_t prefilled = 0;          // prompt tokens already in the slot's state
  int64_t cached = 0;
  int64_t generated = 0;
  int32_t last = -1;             // token to feed next during generation
  bool in_generation = false;
  Clock::time_point start, admitted, first_token;  // admitted: a slot took it (start until then: the queue)
  std::vector<int32_t> history;  // tokens in the slot's state, for prefix reuse after the request
  SpecState spec;                // speculative decoding (speculative.h)
  int64_t decode_steps = 0;      // steps that produced generated tokens
  // Prefix cache (runtime/prefix_cache.h): where the prompt's prefill is cut, whether every piece so far ended at
  // the plan's cut points from a state that did too (then the slot's state equals a prefill from scratch there and
  // may go into the shared index), and the position up to which the slot's KV entries are such.
  std::vector<PrefixCut> cuts;
  bool canonical = true;
  int64_t canon_pos = 0;
};

// What a free slot still holds: the tokens its state has seen, and snapshots of the recurrent state at the
// ends of recent prompts. A snapshot stays valid while its tokens are a prefix of `tokens` (the KV entries
// below its position are then still its own).
struct Engine::SlotCache {
  struct Snap {
    std::vector<int32_t> tokens;
    std::shared_ptr<Snapshot> state;
  };
  std::vector<int32_t> tokens;  // == state position
  std::vector<Snap> snaps;      // oldest first
  uint64_t last_use = 0;
  int64_t canon = 0;            // KV entries below this position are a prefill from scratch's (prefix cache)
  void prune() {
    std::erase_if(snaps, [&](const Snap& s) {
      return s.tokens.size() > tokens.size() || !std::equal(s.tokens.begin(), s.tokens.end(), tokens.begin());
    });
  }
};

Engine::Engine(std::unique_ptr<Backend> backend, int64_t max_queue)
    : backend_(std::move(backend)), max_queue_(max_queue) {
  active_.resize((size_t)backend_->slots());
  free_slots_ = backend_->slots();
  for (int s = 0; s < backend_->slots(); ++s) cache_.push_back(std::make_unique<SlotCache>());
  stats_.kv_tokens_capacity = backend_->context_length() * backend_->slots();
  prefix_ = std::make_unique<PrefixCache>(*backend_, backend_->plan().prefix_cache.budget_bytes);
  stats_.prefix = prefix_->stats();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  shutdown(false);
  if (thread_.joinable()) thread_.join();
}

std::unique_ptr<Engine::Active> Engine::make_active(Request req, Callbacks cb) const {
  const int64_t ctx = backend_->context_length();
  if (req.prompt.empty()) throw EngineError("the prompt is empty");
  if ((int64_t)req.prompt.size() >= ctx)
    throw ContextOverflow(fmt::format("the prompt has {} tokens; the context holds {} (prompt + at least one generated "
                                      "token)", req.prompt.size(), ctx), (int64_t)req.prompt.size(), ctx);
  for (int32_t t : req.prompt)
    if (t < 0 || t >= backend_->vocab_rows()) throw EngineError(fmt::format("prompt token id {} is out of range", t));
  const int64_t room = ctx - (int64_t)req.prompt.size();
  if (req.max_tokens < 0 || req.max_tokens > room) req.max_tokens = room;
  auto a = std::make_unique<Active>();
  a->cuts = prefix_cuts(backend_->plan().prefix_cache, req.prompt);
  a->sampler = std::make_unique<Sampler>(req.sampling, (int32_t)backend_->plan().vocab_real);
  if (req.min_tokens > 0) a->sampler->set_suppressed(req.stop_tokens);  // throws for ids outside the vocabulary
  spec_begin(a->spec, *backend_, req.draft, req.sampling);
  a->req = std::move(req);
  a->cb = std::move(cb);
  return a;
}

uint64_t Engine::submit(Request req, Callbacks cb) {
  std::vector<Request> reqs;
  reqs.push_back(std::move(req));
  std::vector<Callbacks> cbs;
  cbs.push_back(std::move(cb));
  return submit_group(std::move(reqs), std::move(cbs)).front();
}

std::vector<uint64_t> Engine::submit_group(std::vector<Request> reqs, std::vector<Callbacks> cbs) {
  if (reqs.empty() || reqs.size() != cbs.size()) throw EngineError("a group needs one callback set per request");
  for (const Request& r : reqs)
    if (r.prompt != reqs.front().prompt) throw EngineError("the samples of a group must share one prompt");
  std::vector<std::unique_ptr<Active>> made;
  for (size_t i = 0; i < reqs.size(); ++i) made.push_back(make_active(std::move(reqs[i]), std::move(cbs[i])));
  if (made.size() > 1) {
    auto g = std::make_shared<Group>();
    for (auto& a : made) a->group = g;
    made.front()->leads_group = true;
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (!accepting_) throw EngineError("the engine is shutting down");
  const int64_t waiting = (int64_t)queue_.size() - std::max<int64_t>(0, free_slots_.load());
  if (waiting >= max_queue_) throw QueueFull(fmt::format("the request queue is full ({} waiting)", waiting));
  std::vector<uint64_t> ids;
  const Clock::time_point now = Clock::now();
  for (auto& a : made) {
    a->id = next_id_++;
    a->start = now;
    ids.push_back(a->id);
    queue_.push_back(std::move(a));
  }
  stats_.queued = (int64_t)queue_.size();
  cv_.notify_all();
  return ids;
}

void Engine::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  cancelled_.push_back(id);
  cv_.notify_all();
}

void Engine::shutdown(bool finish_all) {
  std::unique_lock<std::mutex> lk(mu_);
  accepting_ = false;
  if (finish_all) {
    idle_cv_.wait(lk, [&] { return queue_.empty() && stats_.running == 0; });
  } else {
    cancel_all_ = true;
  }
  stopping_ = true;
  cv_.notify_all();
  lk.unlock();
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void Engine::finish(Active& a, Finish reason, const std::string& error) {
  DoneEvent d;
  d.reason = reason;
  d.error = error;
  d.prompt_tokens = (int64_t)a.req.prompt.size();
  d.cached_tokens = a.cached;
  d.generated_tokens = a.generated;
  d.decode_steps = a.decode_steps;
  d.drafted = a.spec.drafted;
  d.accepted = a.spec.accepted;
  if (a.in_generation) {
    d.prompt_ms = std::chrono::duration<double, std::milli>(a.first_token - a.start).count();
    d.generation_ms = std::chrono::duration<double, std::milli>(Clock::now() - a.first_token).count();
  } else {
    d.prompt_ms = ms_since(a.start);
  }
  d.queue_ms = a.admitted != Clock::time_point{} ? std::chrono::duration<double, std::milli>(a.admitted - a.start).count()
                                                 : ms_since(a.start);
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.requests_total += 1;
    stats_.generated_tokens_total += a.generated;
    stats_.prompt_tokens_total += (int64_t)a.prefilled - a.cached;
    stats_.cached_tokens_total += a.cached;
    stats_.prompt_seconds_total += d.prompt_ms / 1000.0;
    stats_.generation_seconds_total += d.generation_ms / 1000.0;
    stats_.decode_steps_total += d.decode_steps;
    stats_.drafted_total += d.drafted;
    stats_.accepted_total += d.accepted;
    // Its slot is free from here on (release() follows): a client told of the end below and asking for the stats
    // at once (GET /health, /metrics) must not see the request still running.
    if (a.slot >= 0 && (size_t)a.slot < active_.size() && active_[(size_t)a.slot].get() == &a && stats_.running > 0)
      stats_.running -= 1;
  }
  if (a.leads_group && !a.group->ready) a.group->broken = true;  // the first sample ended before its prefill did
  if (a.slot >= 0) {
    SlotCache& c = *cache_[(size_t)a.slot];
    c.tokens = std::move(a.history);
    c.canon = std::min<int64_t>(a.canon_pos, (int64_t)c.tokens.size());
    if (reason == Finish::error || (int64_t)c.tokens.size() != backend_->position(a.slot)) {
      if (a.group) a.group->broken = true;  // the slot no longer holds the prompt's KV entries
      c = SlotCache();
      try {
        backend_->reset(a.slot);  // state no longer known to match the tokens
      } catch (const std::exception&) {
        // The next request on this slot resets it again before use (empty cache: no reuse).
      }
    }
    c.prune();
    c.last_use = ++use_clock_;
  }
  if (a.cb.on_done) a.cb.on_done(d);
}

void Engine::release(int slot) {
  if (active_[(size_t)slot]) ++free_slots_;
  active_[(size_t)slot].reset();
}

// A waiting sample of a group whose prefill is done takes the group's slot as soon as it is free: restored from
// the group's snapshot, its first token is drawn from the group's logits in the next step.
void Engine::start_waiting_samples_locked() {
  for (auto it = queue_.begin(); it != queue_.end();) {
    Active& q = **it;
    const std::shared_ptr<Group>& g = q.group;
    if (!g || q.leads_group || g->broken || !g->ready || active_[(size_t)g->slot]) {
      ++it;
      continue;
    }
    try {
      backend_->restore(g->slot, *g->snap);
    } catch (const std::exception&) {  // the snapshot cannot be used: the remaining samples prefill themselves
      g->broken = true;
      ++it;
      continue;
    }
    std::unique_ptr<Active> a = std::move(*it);
    it = queue_.erase(it);
    a->slot = g->slot;
    a->prefilled = a->req.prompt.size();
    a->cached = (int64_t)a->req.prompt.size();
    a->history = a->req.prompt;
    a->in_generation = true;
    a->canonical = false;
    a->canon_pos = std::min<int64_t>(cache_[(size_t)g->slot]->canon, (int64_t)a->req.prompt.size() - 1);
    a->first_from_group = true;
    a->first_token = Clock::now();
    active_[(size_t)a->slot] = std::move(a);
    --free_slots_;
  }
}

// Picks a free slot for the first request in the queue that may start (samples of a group wait for the
// group's prefill), reusing the longest cached prefix.
std::vector<Engine::Failed> Engine::admit_locked() {
  std::vector<Failed> failed;
  start_waiting_samples_locked();
  auto may_start = [](const std::unique_ptr<Active>& q) { return !q->group || q->leads_group || q->group->broken; };
  const bool reuse_off = backend_->plan().prefix_cache.mode == "off";
  while (true) {
    auto next = std::find_if(queue_.begin(), queue_.end(), may_start);
    if (next == queue_.end()) break;
    int best = -1;
    int64_t best_reuse = -1;
    int best_snap = -1;
    uint64_t best_use = UINT64_MAX;
    const auto& prompt = (*next)->req.prompt;
    for (size_t s = 0; s < active_.size(); ++s) {
      if (active_[s]) continue;
      const SlotCache& c = *cache_[s];
      auto is_prefix = [&](const std::vector<int32_t>& t) {
        return t.size() < prompt.size() && std::equal(t.begin(), t.end(), prompt.begin());
      };
      int64_t reuse = 0;
      int snap = -1;
      // plan.prefix_cache.mode "off": every prompt from scratch.
      if (!reuse_off && !c.tokens.empty() && is_prefix(c.tokens)) reuse = (int64_t)c.tokens.size();
      for (size_t k = 0; k < c.snaps.size() && !reuse_off; ++k)
        if ((int64_t)c.snaps[k].tokens.size() > reuse && is_prefix(c.snaps[k].tokens)) {
          reuse = (int64_t)c.snaps[k].tokens.size();
          snap = (int)k;
        }
      if (reuse > best_reuse || (reuse == best_reuse && c.last_use < best_use)) {
        best = (int)s;
        best_reuse = reuse;
        best_snap = snap;
        best_use = c.last_use;
      }
    }
    if (best < 0) break;
    std::unique_ptr<Active> a = std::move(*next);
    queue_.erase(next);
    a->admitted = Clock::now();
    if (a->group && a->group->broken) {  // an ordinary request now
      a->group.reset();
      a->leads_group = false;
    }
    try {
      if (admit_from_prefix_cache(*a, best_reuse)) {
        active_[(size_t)a->slot] = std::move(a);
        --free_slots_;
        continue;
      }
    } catch (const std::exception& e) {  // the slot's state is unknown: forget it, fail this request
      *cache_[(size_t)a->slot] = SlotCache();
      a->slot = -1;
      failed.push_back({std::move(a), std::string("could not restore the cached prefix: ") + e.what()});
      continue;
    }
    SlotCache& c = *cache_[(size_t)best];
    a->slot = best;
    a->canonical = best_reuse == 0;  // a slot's own state at a prompt's or an output's end: not at a cut point
    a->canon_pos = best_reuse == 0 ? 0 : std::min<int64_t>(c.canon, best_reuse);
    try {
      if (best_reuse > 0 && best_snap >= 0) {
        backend_->restore(best, *c.snaps[(size_t)best_snap].state);
      } else if (best_reuse == 0) {
        backend_->reset(best);
      }
    } catch (const std::exception& e) {  // the slot's state is unknown: forget it, fail this request
      c = SlotCache();
      a->slot = -1;
      failed.push_back({std::move(a), std::string("could not prepare the sequence state: ") + e.what()});
      continue;
    }
    a->prefilled = (size_t)best_reuse;
    a->cached = best_reuse;
    a->history.assign(a->req.prompt.begin(), a->req.prompt.begin() + best_reuse);
    active_[(size_t)best] = std::move(a);
    --free_slots_;
  }
  stats_.prefix = prefix_->stats();
  return failed;
}

void Engine::loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] {
        bool any = !queue_.empty() || !cancelled_.empty() || stopping_ || cancel_all_;
        for (const auto& a : active_) any |= a != nullptr;
        return any;
      });
      // Cancellations: queued requests finish here, running ones below.
      std::vector<uint64_t> cancel = std::move(cancelled_);
      cancelled_.clear();
      if (cancel_all_) {
        for (const auto& q : queue_) cancel.push_back(q->id);
        for (const auto& a : active_)
          if (a) cancel.push_back(a->id);
      }
      std::vector<std::unique_ptr<Active>> dropped;
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (std::find(cancel.begin(), cancel.end(), (*it)->id) != cancel.end()) {
          dropped.push_back(std::move(*it));
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      std::vector<int> cancel_slots;
      for (size_t s = 0; s < active_.size(); ++s)
        if (active_[s] && std::find(cancel.begin(), cancel.end(), active_[s]->id) != cancel.end())
          cancel_slots.push_back((int)s);
      lk.unlock();
      for (auto& d : dropped) finish(*d, Finish::cancelled);
      for (int s : cancel_slots) {
        finish(*active_[(size_t)s], Finish::cancelled);
        release(s);
      }
      lk.lock();
      for (std::vector<Failed> failed; !(failed = admit_locked()).empty();) {
        lk.unlock();
        for (auto& f : failed) finish(*f.active, Finish::error, f.error);
        lk.lock();
      }
      if (update_running_locked()) {
        if (stopping_) return;
        continue;
      }
    }
    run_step();
    // Requests that finished in the step free their slots: the stats say so now, and shutdown(true) hears
    // of it, rather than when the next request or cancellation wakes the loop.
    std::lock_guard<std::mutex> lk(mu_);
    update_running_locked();
  }
}

bool Engine::update_running_locked() {
  int64_t running = 0;
  for (const auto& a : active_) running += a != nullptr;
  stats_.running = running;
  stats_.queued = (int64_t)queue_.size();
  const bool idle = running == 0 && queue_.empty();
  if (idle) idle_cv_.notify_all();
  return idle;
}

bool Engine::sample_row(Active& a, const float* row, const TopCandidates* top, const std::vector<bool>* allowed,
                        const std::string& mask_error, TokenEvent& ev, std::string& error,
                        const std::function<int32_t()>& pick) {
  const int64_t V = backend_->vocab_rows();
  try {
    if (!mask_error.empty()) throw std::runtime_error(mask_error);
    int32_t tok;
    if (top) {  // candidates selected on the device: the same draw as from the logits
      tok = a.sampler->sample_top(*top);
      ev.token = tok;
      if (a.req.top_logprobs >= 0) {
        ev.logprob = a.sampler->logprob_top(*top, tok);
        if (a.req.top_logprobs > 0) ev.top = a.sampler->top_logprobs_top(*top, a.req.top_logprobs);
      }
    } else {
      tok = pick ? pick() : a.sampler->sample(row, (int32_t)V, allowed);
      ev.token = tok;
      if (a.req.top_logprobs >= 0) {
        ev.logprob = a.sampler->logprob(row, (int32_t)V, tok, allowed);
        if (a.req.top_logprobs > 0) ev.top = a.sampler->top_logprobs(row, (int32_t)V, a.req.top_logprobs, allowed);
      }
    }
    a.sampler->accept(tok);
    if (a.req.constraint) a.req.constraint->accept(tok);
  } catch (const std::exception& e) {
    error = e.what();
    return false;
  }
  return true;
}

bool Engine::emit_token(Active& a, const TokenEvent& ev) {
  const int32_t tok = ev.token;
  bool stop = std::find(a.req.stop_tokens.begin(), a.req.stop_tokens.end(), tok) != a.req.stop_tokens.end();
  if (stop) {
    finish(a, Finish::stop);
    release(a.slot);
    return false;
  }
  a.generated += 1;
  a.last = tok;
  if (a.cb.on_token) a.cb.on_token(ev);
  if (a.generated >= a.req.max_tokens) {
    finish(a, Finish::length);
    release(a.slot);
    return false;
  }
  return true;
}

bool Engine::consume_row(Active& a, const float* row, const TopCandidates* top, const std::vector<bool>* allowed,
                         const std::string& mask_error) {
  TokenEvent ev;
  std::string error;
  a.decode_steps += 1;
  if (!sample_row(a, row, top, allowed, mask_error, ev, error)) {
    finish(a, Finish::error, error);
    release(a.slot);
    return false;
  }
  return emit_token(a, ev);
}

void Engine::run_step() {
  // Decode tokens first (one each, they never wait behind a prompt), then prompt chunks with what is left of
  // the plan's tokens-per-step budget.
  const int64_t budget_total = std::max<int64_t>(1, backend_->plan().max_batch_tokens);
  int64_t budget = budget_total;
  std::vector<StepInput> batch;
  std::vector<Active*> owners;
  // More generating sequences than the step holds (slots > max_batch_tokens): they take turns.
  const size_t n_slots = active_.size();
  // Output rows: every active sequence may ask for one (its decode token, or its prompt's last chunk); a verify
  // step's drafts take one more each, from what the plan's max_logit_rows leaves beyond those.
  int64_t spare_rows = backend_->plan().max_logit_rows;
  for (const auto& a : active_)
    if (a) --spare_rows;
  for (size_t k = 0; k < n_slots && budget > 0; ++k) {
    auto& a = active_[(decode_turn_ + k) % n_slots];
    if (a && a->in_generation && !a->first_from_group) {
      StepInput in{a->slot, {a->last}, true};
      // Speculative decoding: drafts after the next token, within the context, max_tokens, the step's budget
      // and its output rows.
      const int64_t room = std::min({backend_->context_length() - backend_->position(a->slot) - 1,
                                     a->req.max_tokens - a->generated - 1, budget - 1, spare_rows});
      const auto& drafts = spec_draft(a->spec, *backend_, a->slot, a->last, room, *a->sampler);
      in.tokens.insert(in.tokens.end(), drafts.begin(), drafts.end());
      in.logit_rows = (int32_t)in.tokens.size();
      spare_rows -= (int64_t)drafts.size();
      budget -= (int64_t)in.tokens.size();
      batch.push_back(std::move(in));
      owners.push_back(a.get());
    }
  }
  decode_turn_ = (decode_turn_ + 1) % std::max<size_t>(1, n_slots);
  // Prompt chunks end on multiples of the GDN chunk length (absolute positions), so a prompt is cut the same
  // way whatever else is running (on the CPU backend batched and single results then agree bit for bit; the
  // CUDA backend picks matmul kernels by the step's row count, which changes the last bits). A step never
  // exceeds the plan's tokens per step: a piece that does not fit is cut to what is left, and with nothing
  // left the prompts wait for the next step.
  const int64_t align = std::max<int64_t>(1, backend_->plan().gdn_chunk);
  bool any_prefill = false;
  for (auto& a : active_)
    if (a && !a->in_generation && budget > 0) {
      const int64_t pos = (int64_t)a->prefilled, end = (int64_t)a->req.prompt.size();
      // A step's piece also ends at the prompt's next cut point (runtime/prefix_cache.h), and a piece starting
      // off the chunk grid (at a cut) ends on it, so the GDN chunks of every later piece lie where a prefill from
      // scratch puts them.
      int64_t stop = end;
      for (const PrefixCut& c : a->cuts)
        if (c.pos > pos) {
          stop = c.pos;
          break;
        }
      int64_t take_end = pos;
      while (take_end < stop) {
        int64_t piece_end = std::min(stop, (take_end / align + 1) * align);
        if (piece_end - pos > budget) {
          if (any_prefill || take_end > pos) break;
          piece_end = pos + budget;  // the first piece, larger than the whole budget
          a->canonical = false;      // cut where a prefill from scratch is not
        }
        take_end = piece_end;
        if (pos % align != 0) break;
      }
      if (take_end == pos) continue;
      StepInput in{a->slot, {}, take_end == end};
      in.tokens.assign(a->req.prompt.begin() + pos, a->req.prompt.begin() + take_end);
      batch.push_back(std::move(in));
      owners.push_back(a.get());
      budget -= take_end - pos;
      any_prefill = true;
    }
  // Samples of a group that started from its snapshot draw their first token from the group's logits (no
  // backend row); they join the step's rows after the backend's.
  std::vector<Active*> from_group;
  for (auto& a : active_)
    if (a && a->first_from_group) from_group.push_back(a.get());
  if (batch.empty() && from_group.empty()) return;
  const int64_t n_real = backend_->plan().vocab_real;
  // Per row wanting logits: the constraint's mask (decided by what was accepted so far), and whether the
  // backend may select the sampling candidates on its device instead of returning the logits (no mask; a
  // top_k, or greedy, that its candidates cover, top_logprobs included; never the prompt end of a group's
  // first sample, whose logits every sample of the group draws from).
  const size_t n_rows = batch.size() + from_group.size();
  auto owner = [&](size_t k) -> Active& { return k < batch.size() ? *owners[k] : *from_group[k - batch.size()]; };
  auto wants = [&](size_t k) { return k >= batch.size() || batch[k].want_logits; };
  std::vector<std::vector<bool>> masks(n_rows);
  std::vector<char> masked(n_rows, 0);
  std::vector<std::string> mask_error(n_rows);  // the constraint failed: the request fails below
  std::vector<Backend::Select> select(batch.size());
  const int32_t top_max = backend_->top_k_max();
  for (size_t k = 0; k < n_rows; ++k) {
    if (!wants(k)) continue;
    Active& a = owner(k);
    try {
      if (a.req.min_tokens > 0 && a.generated >= a.req.min_tokens && !a.sampler->suppressed().empty())
        a.sampler->set_suppressed({});  // the minimum is reached: end-of-generation may come now
      if (a.req.constraint) {
        masks[k].assign((size_t)n_real, false);
        masked[k] = a.req.constraint->allowed(masks[k]);
      }
    } catch (const std::exception& e) {
      mask_error[k] = e.what();
      continue;
    }
    if (k >= batch.size() || masked[k] || top_max <= 0 || batch[k].logit_rows > 1) continue;
    if (a.leads_group && !a.in_generation) continue;  // the group's logits are needed whole
    const SamplingParams& p = a.sampler->params();
    const int32_t want = std::max<int32_t>(p.temperature == 0.0f ? 1 : p.top_k, std::max(0, a.req.top_logprobs));
    if (want <= top_max && a.sampler->can_pick_from_top(want)) select[k] = {a.sampler.get(), want};
  }
  std::vector<std::vector<float>> logits;
  std::vector<std::optional<TopCandidates>> top;
  bool step_failed = false;
  if (!batch.empty()) {
    try {
      logits = backend_->step_select(batch, select, top);
    } catch (const std::exception& e) {
      step_failed = true;
      for (Active* a : owners) {
        finish(*a, Finish::error, e.what());
        release(a->slot);
      }
    }
  }
  for (size_t k = 0; k < n_rows; ++k) {
    if (k < batch.size() && step_failed) continue;  // finished above
    Active& a = owner(k);
    if (k >= batch.size()) {
      a.first_from_group = false;
      consume_row(a, a.group->logits.data(), nullptr, masked[k] ? &masks[k] : nullptr, mask_error[k]);
      continue;
    }
    if (batch[k].logit_rows > 1) {  // a verify step of drafted tokens
      consume_verify(a, batch[k], logits[k], masked[k] ? &masks[k] : nullptr, mask_error[k]);
      continue;
    }
    a.history.insert(a.history.end(), batch[k].tokens.begin(), batch[k].tokens.end());
    if (!a.in_generation) {
      a.prefilled += batch[k].tokens.size();
      after_prefill_piece(a);
      if (!batch[k].want_logits) continue;
      // Prompt complete: snapshot the recurrent state here for later requests sharing this prompt, within the
      // plan's budget of snapshots per slot (the oldest goes first, before the new one is taken). A snapshot is
      // an optimisation: when it cannot be taken (device memory), the request goes on without it. A group's
      // first sample keeps the snapshot and the logits for the other samples (without them they prefill).
      SlotCache& c = *cache_[(size_t)a.slot];
      const size_t budget = (size_t)std::max<int64_t>(0, backend_->plan().memory.snapshots_per_slot);
      try {
        while (!c.snaps.empty() && c.snaps.size() >= budget) c.snaps.erase(c.snaps.begin());
        std::shared_ptr<Snapshot> snap;
        if (budget > 0 || a.leads_group) snap = backend_->save(a.slot);
        if (budget > 0) c.snaps.push_back({a.req.prompt, snap});
        if (a.leads_group && !a.group->broken && k < logits.size() && !logits[k].empty()) {
          a.group->snap = std::move(snap);
          a.group->logits = logits[k];
          a.group->slot = a.slot;
          a.group->ready = true;
        }
      } catch (const std::exception&) {
        c.snaps.clear();  // and free the older ones: memory is short
      }
      a.in_generation = true;
      a.first_token = Clock::now();
    }
    const TopCandidates* t = k < top.size() && top[k] ? &*top[k] : nullptr;
    consume_row(a, t ? nullptr : logits[k].data(), t, masked[k] ? &masks[k] : nullptr, mask_error[k]);
  }
  std::lock_guard<std::mutex> lk(mu_);
  int64_t used = 0;
  for (int s = 0; s < backend_->slots(); ++s) used += backend_->position(s);
  stats_.kv_tokens_used = used;
  stats_.prefix = prefix_->stats();
}

// --- The shared prefix cache's hooks (runtime/prefix_cache.h, docs/prefix-cache.md) ---

bool Engine::admit_from_prefix_cache(Active& a, int64_t legacy_reuse) {
  const std::vector<int32_t>& prompt = a.req.prompt;
  const PrefixCache::Hit hit = prefix_->lookup(prompt, a.cuts);
  // The index's state is a prefill from scratch's, a slot's own state at an older prompt's or output's end is not
  // (its GDN chunks were cut there): any hit wins, so that a hit's output is the cache-off run's bit for bit. The
  // slot's own state serves what the index does not hold (a strict extension of a short prompt or of an output).
  (void)legacy_reuse;
  if (!hit.node) return false;
  // The free slot already holding most of the hit's KV entries (least recently used among equals).
  int slot = -1;
  int64_t valid = -1;
  uint64_t use = UINT64_MAX;
  for (size_t s = 0; s < active_.size(); ++s) {
    if (active_[s]) continue;
    const SlotCache& c = *cache_[s];
    const int64_t limit = std::min<int64_t>({c.canon, hit.pos, (int64_t)c.tokens.size()});
    int64_t v = 0;
    while (v < limit && c.tokens[(size_t)v] == prompt[(size_t)v]) ++v;
    if (v > valid || (v == valid && c.last_use < use)) {
      slot = (int)s;
      valid = v;
      use = c.last_use;
    }
  }
  if (slot < 0) return false;
  a.slot = slot;
  prefix_->restore(hit, slot, valid);
  // The slot now holds the hit's tokens; its own snapshots beyond `valid` saw KV entries that were replaced.
  SlotCache& c = *cache_[(size_t)slot];
  c.tokens.assign(prompt.begin(), prompt.begin() + hit.pos);
  std::erase_if(c.snaps, [&](const SlotCache::Snap& sn) { return (int64_t)sn.tokens.size() > valid; });
  c.prune();
  c.canon = hit.pos;
  a.prefilled = (size_t)hit.pos;
  a.cached = hit.pos;
  a.history = c.tokens;
  a.canonical = true;
  a.canon_pos = hit.pos;
  return true;
}

void Engine::after_prefill_piece(Active& a) {
  if (!a.canonical) return;
  const int64_t pos = (int64_t)a.prefilled;
  for (const PrefixCut& c : a.cuts) {
    if (c.pos != pos) continue;
    a.canon_pos = pos;
    if (!c.snapshot) return;
    try {
      prefix_->insert(a.slot, std::vector<int32_t>(a.req.prompt.begin(), a.req.prompt.begin() + pos));
    } catch (const std::exception&) {
      // A snapshot is an optimisation: without memory for it the request goes on (the index is unchanged).
    }
    return;
  }
}

// Speculative decoding: the rows of one verify step, walked in order (speculative.h walk_verify). Row i is sampled
// as a plain decode step would sample it (its mask and min_tokens rule follow the tokens before it); the slot is
// rolled back to the tokens kept before any is handed out, so a request that ends here leaves its state matching
// its history (prefix reuse).
void Engine::consume_verify(Active& a, const StepInput& in, const std::vector<float>& logits,
                            const std::vector<bool>* first_mask, const std::string& first_mask_error) {
  const int64_t V = backend_->vocab_rows(), n_real = backend_->plan().vocab_real;
  const int64_t start = backend_->position(a.slot) - (int64_t)in.tokens.size();
  const std::vector<int32_t> drafts(in.tokens.begin() + 1, in.tokens.end());
  std::vector<TokenEvent> events;
  std::string error;
  std::vector<bool> mask;
  a.decode_steps += 1;
  auto sample = [&](int64_t row, int32_t proposal) -> int32_t {
    const std::vector<bool>* allowed = row == 0 ? first_mask : nullptr;
    std::string mask_error = row == 0 ? first_mask_error : std::string();
    if (row > 0) {
      try {
        if (a.req.min_tokens > 0 && a.generated + row >= a.req.min_tokens && !a.sampler->suppressed().empty())
          a.sampler->set_suppressed({});
        if (a.req.constraint) {
          mask.assign((size_t)n_real, false);
          if (a.req.constraint->allowed(mask)) allowed = &mask;
        }
      } catch (const std::exception& e) {
        mask_error = e.what();
      }
    }
    TokenEvent ev;
    const float* lrow = logits.data() + row * V;
    std::function<int32_t()> rule;  // sampled requests: the rejection rule against the draft's distribution
    if (proposal >= 0 && a.sampler->params().temperature > 0 && (size_t)row < a.spec.q.size())
      rule = [&] { return spec_rejection_sample(a.spec, *a.sampler, lrow, (int32_t)V, allowed, row, proposal); };
    if (!sample_row(a, lrow, nullptr, allowed, mask_error, ev, error, rule)) return -1;
    events.push_back(std::move(ev));
    return events.back().token;
  };
  auto ends = [&](int32_t tok, int64_t emitted) {
    return std::find(a.req.stop_tokens.begin(), a.req.stop_tokens.end(), tok) != a.req.stop_tokens.end() ||
           a.generated + emitted >= a.req.max_tokens;
  };
  const VerifyWalk w = walk_verify(drafts, sample, ends);
  a.spec.verify_steps += 1;
  a.spec.drafted += (int64_t)drafts.size();
  a.spec.accepted += w.accepted;
  try {
    backend_->rollback(a.slot, start + 1 + w.kept_drafts);
  } catch (const std::exception& e) {  // the state is unknown: the request cannot go on
    a.history.clear();
    finish(a, Finish::error, std::string("speculative rollback failed: ") + e.what());
    release(a.slot);
    return;
  }
  a.history.push_back(in.tokens[0]);
  a.history.insert(a.history.end(), drafts.begin(), drafts.begin() + w.kept_drafts);
  for (const TokenEvent& ev : events)
    if (!emit_token(a, ev)) return;
  if (w.failed) {
    finish(a, Finish::error, error);
    release(a.slot);
  }
}

}  // namespace qrig::runtime
