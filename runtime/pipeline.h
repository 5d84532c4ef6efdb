// A plan of several stages (layer ranges on devices, ir::Placement) run as a pipeline: one host thread per
// stage drives its device, one per stage boundary moves the residual stream across it, and the Backend the engine
// sees is the whole. A step's inputs are cut into pieces (prefill in the plan's micro-batches, at multiples of the
// GDN chunk so the numerics are the one-device plan's) and packed into units that flow through the stages in order,
// so with S stages up to S units are in flight. Each boundary has two buffers on each side (double buffering: a
// stage computes unit i+1 while unit i crosses) and pinned host buffers between them; the boundary thread copies
// device -> host, waits on the host for that copy to complete (the fence the seed engine lacked: a receiver that
// only waited on the sender's event read stale rows on mining cards), then host -> device. The same code runs CPU
// stages (tests) and CUDA stages; stages implement PipelineStage.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace qrig::runtime {

// Tokens [begin, begin + count) of input `input` of the step, on slot `slot`; want_logits on the input's last piece
// when the input wants logits.
struct PipelinePiece {
  int input = 0;
  int slot = 0;
  int64_t begin = 0, count = 0;
  bool want_logits = false;
};

// What runs through the stages as one: pieces of distinct slots, their rows concatenated in order.
struct PipelineUnit {
  std::vector<PipelinePiece> pieces;
  int64_t rows = 0;
};

// Where the last stage puts a unit's outputs, per input of the step.
struct PipelineResults {
  std::vector<std::vector<float>>* logits = nullptr;
  std::vector<std::optional<TopCandidates>>* top = nullptr;    // step_select only
  const std::vector<Backend::Select>* select = nullptr;        // step_select only
};

class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  virtual const std::string& device() const = 0;
  virtual int64_t out_width() const = 0;   // f32 values per row the stage hands on (0: the last stage)
  virtual int64_t vocab_rows() const = 0;  // token ids the step may carry (embedding rows)
  virtual int64_t position(int slot) const = 0;
  virtual void reset(int slot) = 0;
  virtual std::shared_ptr<Snapshot> save(int slot) const = 0;
  virtual void restore(int slot, const Snapshot& snap) = 0;
  virtual int64_t snapshot_bytes() const = 0;
  // KV spans of the stage's own layers (Backend::save_kv and the rest); a stage without them answers false.
  virtual bool kv_spans() const { return false; }
  virtual std::shared_ptr<KvSpan> save_kv(int slot, int64_t begin, int64_t end) const;
  virtual void restore_kv(int slot, const KvSpan& span, int64_t begin, int64_t end);
  virtual std::shared_ptr<KvSpan> slice_kv(const KvSpan& span, int64_t begin, int64_t end) const;
  virtual int32_t top_k_max() const { return 0; }  // the last stage's device-side candidate selection
  // Runs a unit on the stage's thread: reads its input buffer `buf` (0 or 1; not on the first stage), writes its
  // output buffer `buf` (not on the last) or, on the last stage, the outputs of the pieces that want them. Returns
  // when the output is complete (a CUDA stage synchronises its stream).
  virtual void compute(const PipelineUnit& u, const std::vector<StepInput>& batch, int buf,
                       const PipelineResults& res) = 0;
  // On the boundary thread: copy `rows` rows of output buffer `buf` into host memory and return once they are
  // there; copy host rows into input buffer `buf` and return once they are there.
  virtual void download(int buf, float* host, int64_t rows) = 0;
  virtual void upload(const float* host, int buf, int64_t rows) = 0;
  // Host memory for a boundary's buffers (CUDA: pinned, usable from every device).
  virtual std::shared_ptr<float> host_buffer(int64_t floats) = 0;
};

struct PipelineOptions {
  // Test and benchmark aid, not a behaviour of the plan: each crossing also waits what moving its bytes would
  // take over a host link of this many GB/s each way (device -> host, then host -> device); 0 = no wait.
  double simulate_link_gbps = 0;
};

// Takes the stages in placement order (every slot's state lives in them). Throws RuntimeError when they do not
// match the plan.
std::unique_ptr<Backend> make_pipeline(const ir::Plan& plan, std::vector<std::unique_ptr<PipelineStage>> stages,
                                       const PipelineOptions& opt = {});

// How a step's inputs are cut and packed (the plan's rules, applied mechanically; exposed for tests): prefill
// inputs in pieces of pipeline_micro_batch tokens, a remainder too short for the chunked GDN (or for one-plane
// activations) given whole 64-token chunks of the piece before it; pieces packed in order into units of at most
// pipeline_micro_batch rows and distinct slots; a step of single-token pieces in as many units as the plan's
// decode rule gives (pipeline_decode_group_rows rows per unit at least, at most one unit per stage).
std::vector<PipelineUnit> pipeline_units(const ir::Plan& plan, const std::vector<StepInput>& batch);

// CPU stages of a multi-stage CPU plan (one per placement).
std::vector<std::unique_ptr<PipelineStage>> make_cpu_stages(const ir::Plan& plan);

}  // namespace qrig::runtime
