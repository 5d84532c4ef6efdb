// Comparing a model's execution with a reference file (the fixture format of ../shared/fixtures/README.md).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "ir/plan.h"
#include "runtime/errors.h"

namespace qrig::cli {

struct SequenceReport {
  std::string name;
  int64_t tokens = 0;
  double max_rel_err = 0;              // logits: max over positions of max|a-r| / max|r|
  int64_t top1_agree = 0;              // positions whose argmax matches
  double kl_sum = 0;                   // sum over positions of KL(reference || model) of the next-token
                                       // distributions (softmax of the logits), in nats
  std::map<int, double> layer_err;     // hidden.i: the same metric per layer
};

// What verification drives: a fresh sequence per reference sequence, then forward calls that return the logits
// of the given rows (rows x vocab) and report tapped hidden states.
class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual int64_t vocab() const = 0;
  virtual int64_t max_step_tokens() const = 0;  // prefills longer than this are split
  virtual void begin_sequence() = 0;
  virtual std::vector<float> forward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& rows,
                                     const runtime::TapFn& tap) = 0;
};

// Runs every sequence of `ref`: one prefill when split <= 0, else a prefill of `split` tokens followed by
// single-token decode steps. dump (optional): receives every position's logits as computed, sequence by
// sequence in the reference's order (qrig verify --dump: two runs' dumps compare bit for bit).
std::vector<SequenceReport> verify_reference(ModelRunner& model, const gguf::File& ref, int64_t split,
                                             std::vector<float>* dump = nullptr);

// A draft reference (mtp_logits.<seq> and the head's intermediates, cli/verify_draft.cpp).
bool is_draft_reference(const gguf::File& ref);
// Checks the plan's MTP draft head against it on the plan's backend (CPU or CUDA), printing a line per sequence and
// a summary; returns the exit status (0: every row's logits and intermediates within tol, and the head's top-1
// agreement with the reference at least min_top1). Throws RuntimeError for a plan without one.
int verify_draft_reference(const ir::Plan& plan, const gguf::File& ref, double tol, int64_t split,
                           double min_top1 = 0);

}  // namespace qrig::cli
