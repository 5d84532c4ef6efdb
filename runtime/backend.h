// The execution interface the engine drives: a fixed number of sequence slots, each with its own state, and
// a step that runs new tokens for several slots at once (continuous batching). Implemented by the CPU
// reference backend and the CUDA backend (which can also select sampling candidates on the GPU).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/plan.h"
#include "runtime/sampler.h"

namespace qrig::runtime {

struct StepInput {
  int slot = 0;
  std::vector<int32_t> tokens;  // appended at the slot's current position
  bool want_logits = false;     // logits of the last of these tokens
  // Speculative decoding (runtime/speculative.h): a verify step wants the logits of its last logit_rows tokens
  // (logit_rows x vocab_rows floats, in order), and the backend keeps what rollback() needs to return the slot to
  // any position inside the step. Backends without drafting (draft_tokens() == 0) accept only 1.
  int32_t logit_rows = 1;
};

// Saved recurrent state of a slot at a position. KV caches are append-only by position, so restoring a
// snapshot at position p and continuing from p is exact without copying the KV entries below p.
struct Snapshot {
  virtual ~Snapshot() = default;
  int64_t position = 0;
};

// A copy of a slot's attention KV entries for positions [begin, end) (every key and value cache of the plan), as
// the prefix cache (runtime/prefix_cache.h) holds them: restoring it into any slot at the same positions makes
// that slot's entries there the copied ones, bit for bit.
struct KvSpan {
  virtual ~KvSpan() = default;
  int64_t begin = 0, end = 0;
  virtual int64_t bytes() const = 0;
};

// Pipelines (runtime/pipeline.h): where one stage's time went since the last reset_stage_stats().
struct StageStats {
  std::string device;
  double busy_s = 0;         // computing its units
  double bridge_s = 0;       // its outgoing boundary moving units (device -> host -> next device), concurrent with
                             // computing
  int64_t bridge_bytes = 0;  // bytes that boundary moved
  int64_t units = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const ir::Plan& plan() const = 0;
  virtual int slots() const = 0;
  virtual int64_t vocab_rows() const = 0;
  virtual int64_t context_length() const = 0;
  virtual int64_t position(int slot) const = 0;  // tokens the slot's state has seen
  virtual void reset(int slot) = 0;
  // Runs every input; returns, in input order, vocab_rows() logits for each input that wants them (an empty
  // vector for the others). Validates everything before changing any state; throws RuntimeError.
  virtual std::vector<std::vector<float>> step(const std::vector<StepInput>& batch) = 0;
  // Device-side candidate selection for sampling (runtime/sampler.h "Sampling from the best candidates"):
  // the most candidates per row a backend selects where the logits are; 0 = none (the default).
  virtual int32_t top_k_max() const { return 0; }
  // step(), except that an input k wanting logits with select[k].k > 0 may come back as top[k]: the row's
  // select[k].k best candidates after select[k].sampler's steps 2-3, with logits[k] empty. A row the
  // candidates cannot decide (Sampler::top_suffices false) comes back as logits. The default: step().
  struct Select {
    const Sampler* sampler = nullptr;
    int32_t k = 0;
  };
  virtual std::vector<std::vector<float>> step_select(const std::vector<StepInput>& batch,
                                                      const std::vector<Select>& select,
                                                      std::vector<std::optional<TopCandidates>>& top) {
    (void)select;
    top.assign(batch.size(), std::nullopt);
    return step(batch);
  }
  // Speculative decoding with the plan's MTP draft head (runtime/speculative.h, docs/speculative.md): the most draft
  // tokens per step (the plan's draft_tokens; 0: this backend does not draft, and the two calls below throw).
  virtual int draft_tokens() const { return 0; }
  // Whether draft() can run for the slot now (its draft head has seen every token of the slot's state).
  virtual bool can_draft(int slot) const {
    (void)slot;
    return false;
  }
  // Runs the draft head k times for `slot`, whose next token `next` is not in its state yet: each draft token is
  // what `pick` chooses from the head's logits (vocab_rows() floats). The slot's state is unchanged (the head's own
  // cache gets the rows of the tokens the slot has seen). Returns the k drafted tokens.
  using DraftPick = std::function<int32_t(const float* logits)>;
  virtual std::vector<int32_t> draft(int slot, int32_t next, int k, const DraftPick& pick) {
    (void)slot, (void)next, (void)k, (void)pick;
    throw std::logic_error("this backend does not draft");
  }
  // After a step whose input for `slot` had logit_rows > 1 and started at position p with T tokens: the slot back
  // at `position` in p + 1 .. p + T, exactly as if only the first position - p tokens had been run.
  virtual void rollback(int slot, int64_t position) {
    (void)slot, (void)position;
    throw std::logic_error("this backend does not draft");
  }
  virtual std::shared_ptr<Snapshot> save(int slot) const = 0;
  virtual void restore(int slot, const Snapshot& snap) = 0;
  virtual int64_t snapshot_bytes() const = 0;
  // KV spans for the prefix cache shared by all slots. A backend that cannot copy its caches' entries answers
  // false (the default), and its plans give the shared prefix cache no budget (compiler/passes/plan_memory.cpp).
  virtual bool kv_spans() const { return false; }
  // Copies positions [begin, end) of the slot's caches (end <= position(slot)).
  virtual std::shared_ptr<KvSpan> save_kv(int slot, int64_t begin, int64_t end) const;
  // Copies positions [begin, end) of `span` (within its range) into the slot's caches at the same positions;
  // the slot's position and recurrent state are left as they are (restore() sets them).
  virtual void restore_kv(int slot, const KvSpan& span, int64_t begin, int64_t end);
  // A new span holding positions [begin, end) of `span` (the prefix index splits a node).
  virtual std::shared_ptr<KvSpan> slice_kv(const KvSpan& span, int64_t begin, int64_t end) const;
  // Pipelines: per stage, in placement order; empty for one-device backends.
  virtual std::vector<StageStats> stage_stats() const { return {}; }
  virtual void reset_stage_stats() {}
};

// Where a backend is while it binds a plan's weights (make_backend), for a progress display.
struct LoadProgress {
  std::string stage;   // what is being done: "reading weights" (CPU), "uploading weights to cuda:0"
  int64_t done = 0;    // bytes so far
  int64_t total = 0;   // bytes in all (done == total: the stage is complete)
};
using LoadProgressFn = std::function<void(const LoadProgress&)>;

// How to run a plan, where the plan leaves a choice to the operator (not a decision of the compiler's).
struct BackendOptions {
  // CUDA plans: run decode steps as CUDA graphs where the plan says so (decode_graphs); false turns them off
  // for this run (`--no-cuda-graphs`, to compare or to work around a driver).
  bool cuda_graphs = true;
  // Called on the constructing thread while the weights are bound, at least at the start and at the end of each
  // stage. The CPU backend then reads every page of the mapped weights (what it reports is the disk read, which
  // the first request would otherwise pay); the CUDA backend reports each weight it uploads.
  LoadProgressFn progress;
  // Pipelines, test and benchmark aid (runtime/pipeline.h PipelineOptions): each bridge crossing also waits what
  // a host link of this many GB/s each way would take; 0 = none.
  double simulate_link_gbps = 0;
};

// The backend a plan asks for. Throws RuntimeError when this build cannot run it (e.g. no CUDA backend).
std::unique_ptr<Backend> make_backend(const ir::Plan& plan, const BackendOptions& opt = {});

}  // namespace qrig::runtime
