// The engine: the narrow interface the server and `qrig run` use (submit a request, receive tokens, cancel).
// One scheduler thread owns the backend and runs continuous batching over its slots: requests join running
// decode batches, long prompts are prefilled in chunks so they do not stall others (and cut at the plan's cut
// points), prompts restore the longest prefix the shared prefix cache holds into any slot (runtime/prefix_cache.h,
// docs/prefix-cache.md), and finished slots keep their own state for what the index does not hold (recurrent
// state snapshots at prompt ends, since GDN state cannot be rolled back).
// Several samples of one prompt (OpenAI `n`) share one prefill: submit_group() prefills the prompt once, keeps
// the state snapshot and the logits at its end, and runs the samples one after another in that slot, each
// restored from the snapshot (KV entries below the prompt's end are still the prompt's: append-only).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/backend.h"
#include "runtime/prefix_cache.h"
#include "runtime/sampler.h"

namespace qrig::runtime {

struct EngineError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct QueueFull : EngineError {
  using EngineError::EngineError;
};
struct ContextOverflow : EngineError {
  ContextOverflow(const std::string& m, int64_t prompt, int64_t ctx) : EngineError(m), n_prompt(prompt), n_ctx(ctx) {}
  int64_t n_prompt, n_ctx;
};

// Token-level constraint for constrained decoding (tool calls, JSON schemas). Called on the engine thread.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets mask[id] for ids that may come next (mask has the real-vocabulary size, all false on entry);
  // returns false when nothing is constrained at this point (mask ignored).
  virtual bool allowed(std::vector<bool>& mask) = 0;
  virtual void accept(int32_t token) = 0;
};

enum class Finish { stop, length, cancelled, error };
const char* finish_name(Finish f);

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = -1;            // -1: up to the context length
  std::vector<int32_t> stop_tokens;   // end of generation (not counted as output text)
  int32_t top_logprobs = -1;          // -1: no logprobs; 0: the chosen token's; n: also the n most likely
  std::shared_ptr<TokenConstraint> constraint;
  // Until this many tokens are generated, stop_tokens cannot be sampled (vLLM's min_tokens). Through the
  // sampler's suppressed ids, so device candidate selection applies it too.
  int64_t min_tokens = 0;
  // Speculative decoding (runtime/speculative.h) where the plan drafts; false: this request decodes one token per
  // step (its output is the same either way: greedy token for token, sampled in distribution).
  bool draft = true;
};

struct TokenEvent {
  int32_t token;
  float logprob = 0;  // when requested
  std::vector<Sampler::TopLogprob> top;
};

struct DoneEvent {
  Finish reason = Finish::stop;
  std::string error;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;      // prompt tokens reused from a previous request's state
  int64_t generated_tokens = 0;
  double prompt_ms = 0, generation_ms = 0;
  double queue_ms = 0;  // waiting for a slot (part of prompt_ms): from submit until a slot took the request
  // Steps that produced generated tokens (the prompt's last one included), and of drafting: draft tokens proposed
  // and accepted. Tokens per step = generated_tokens / decode_steps; acceptance = accepted / drafted.
  int64_t decode_steps = 0;
  int64_t drafted = 0, accepted = 0;
};

struct Callbacks {
  std::function<void(const TokenEvent&)> on_token;  // engine thread; keep it short
  std::function<void(const DoneEvent&)> on_done;    // called exactly once per accepted request
};

struct EngineStats {
  int64_t running = 0, queued = 0;
  int64_t prompt_tokens_total = 0, generated_tokens_total = 0, cached_tokens_total = 0;
  int64_t requests_total = 0;
  double prompt_seconds_total = 0, generation_seconds_total = 0;
  int64_t kv_tokens_used = 0, kv_tokens_capacity = 0;
  int64_t decode_steps_total = 0, drafted_total = 0, accepted_total = 0;  // DoneEvent's, summed
  PrefixCacheStats prefix;  // the shared prefix cache (runtime/prefix_cache.h)
};

class Engine {
 public:
  explicit Engine(std::unique_ptr<Backend> backend, int64_t max_queue = 64);
  ~Engine();  // cancels what is left and joins the scheduler

  // Queues a request; returns its id. Throws ContextOverflow (prompt does not fit), QueueFull, EngineError
  // (bad request, engine stopping). Callbacks run on the engine thread.
  uint64_t submit(Request req, Callbacks cb);
  // Several samples of one prompt (every request's prompt must be the same; sampling, limits and constraints
  // may differ): the prompt is prefilled once, by the first; the others start from its state snapshot and its
  // last logits in the same slot, one after another (each cached_tokens = the prompt). Ids in request order,
  // each with its own callbacks and cancel(). Throws like submit() (nothing is queued then).
  std::vector<uint64_t> submit_group(std::vector<Request> reqs, std::vector<Callbacks> cbs);
  void cancel(uint64_t id);  // no-op for unknown or finished ids; on_done(cancelled) within one step
  // Stops accepting requests; with finish=true waits for running and queued ones, else cancels them.
  void shutdown(bool finish);

  EngineStats stats() const;
  const ir::Plan& plan() const { return backend_->plan(); }
  int64_t context_length() const { return backend_->context_length(); }
  int64_t vocab_rows() const { return backend_->vocab_rows(); }
  int slots() const { return backend_->slots(); }

 private:
  struct Active;
  struct SlotCache;
  struct Group;
  std::unique_ptr<Active> make_active(Request req, Callbacks cb) const;
  // Samples and hands out the next token of `a` from one row: logits (with the constraint's mask) or
  // device-selected candidates. Returns false when `a` finished (and its slot was released).
  bool consume_row(Active& a, const float* logits, const TopCandidates* top, const std::vector<bool>* allowed,
                   const std::string& mask_error);
  // consume_row's halves: sample (accepting the token into the sampler and constraint; false with `error` set when
  // sampling failed) and hand out (false when `a` finished and its slot was released).
  // pick (optional) chooses the token instead of the sampler's own draw (speculative decoding's rejection rule).
  bool sample_row(Active& a, const float* logits, const TopCandidates* top, const std::vector<bool>* allowed,
                  const std::string& mask_error, TokenEvent& ev, std::string& error,
                  const std::function<int32_t()>& pick = nullptr);
  bool emit_token(Active& a, const TokenEvent& ev);
  // Speculative decoding (speculative.cpp): the rows of a verify step of `a` (input `in`), from its first row's
  // mask on; samples them in order, rolls the slot back to the accepted tokens and hands them out.
  void consume_verify(Active& a, const StepInput& in, const std::vector<float>& logits,
                      const std::vector<bool>* first_mask, const std::string& first_mask_error);
  void start_waiting_samples_locked();  // group samples whose slot is free start from the group's snapshot
  void loop();
  // Requests whose slot could not be prepared; finish() them without holding mu_ (it takes mu_).
  struct Failed {
    std::unique_ptr<Active> active;
    std::string error;
  };
  std::vector<Failed> admit_locked();
  void finish(Active& a, Finish reason, const std::string& error = "");
  void run_step();
  bool update_running_locked();  // stats_.running/queued from the slots; true (and idle_cv_ told) when idle
  void release(int slot);  // frees a slot (worker thread)

  std::unique_ptr<Backend> backend_;
  int64_t max_queue_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::unique_ptr<Active>> queue_;
  std::vector<std::unique_ptr<Active>> active_;  // per slot (nullptr = free); touched by the worker only
  // Free slots as the worker last left them, for submit()'s queue bound: a request that a free slot will take
  // is not waiting, so it does not count against max_queue.
  std::atomic<int64_t> free_slots_{0};
  std::vector<std::unique_ptr<SlotCache>> cache_;
  std::unique_ptr<PrefixCache> prefix_;  // shared by all slots (budget 0: holds nothing)
  // Hooks into the shared prefix cache (the end of engine.cpp). admit_from_prefix_cache: restores the longest
  // cached prefix of a's prompt into the best free slot and sets a's slot and counts (preferred to legacy_reuse,
  // what a slot's own state offers); false when there is none (a is untouched then). Throws like the backend.
  bool admit_from_prefix_cache(Active& a, int64_t legacy_reuse);
  void after_prefill_piece(Active& a);  // a prefill step of `a` ended: snapshot into the index at its cut points
  std::vector<uint64_t> cancelled_;
  uint64_t next_id_ = 1;
  uint64_t use_clock_ = 0;
  size_t decode_turn_ = 0;  // first slot to decode when not all fit in a step
  bool stopping_ = false, accepting_ = true, cancel_all_ = false;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace qrig::runtime
