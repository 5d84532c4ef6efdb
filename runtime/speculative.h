// Speculative decoding in the engine (docs/speculative.md): per generating sequence whose plan drafts, the backend's
// MTP head drafts k tokens after the sequence's next token, the main model verifies the k + 1 positions in one step
// (sequences with and without drafting share it), the rows are walked in order with the sequence's own sampler,
// and the backend rolls the sequence back to where the accepted tokens end. The engine (engine.cpp) calls these
// from narrow hooks; what is here needs nothing of its request bookkeeping.
//
// Acceptance. Row i of a verify holds the target's logits after the next token and drafts 1..i. For a greedy
// request row i's token is the sampler's argmax (bias, penalties and constraints included, exactly as without
// drafting) and draft i + 1 is kept while it equals that token: the output is the non-drafting output token for
// token. For a sampled request the standard rejection rule (Leviathan et al., Chen et al.) keeps draft d, drawn from
// the draft distribution q, with probability min(1, p(d) / q(d)) (p: the target's distribution after the sampler's
// whole chain) and otherwise samples the residual max(0, p - q) normalised, so each token is distributed exactly as
// the target's; after k kept drafts the last row gives one more token from p.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "runtime/backend.h"
#include "runtime/sampler.h"

namespace qrig::runtime {

// Per request: whether it drafts, the current step's drafts, and its counts.
struct SpecState {
  bool enabled = false;                   // the plan drafts and the request did not turn it off
  std::vector<int32_t> drafts;            // this step's draft tokens (empty: a plain step)
  std::vector<std::vector<double>> q;     // sampled requests: the distribution each draft was drawn from
  std::mt19937_64 rng;                    // the draft draws and the acceptance tests (seeded like the sampler)
  int64_t verify_steps = 0;               // steps that verified drafts
  int64_t drafted = 0, accepted = 0;      // draft tokens proposed, and those the target accepted
};

// Seeds the state for a request: drafting on when the backend drafts and `want` (the request field) is true.
void spec_begin(SpecState& s, const Backend& backend, bool want, const SamplingParams& sampling);

// The drafts of one step, at most `room` tokens (what is left of the context, of max_tokens and of the step's
// tokens, minus the next token itself): none when the sequence does not draft, or the head cannot draft for it
// (e.g. after a restore from a snapshot taken without it). Greedy requests draft the head's argmax; sampled ones
// draw from the head's softmax at the request's temperature, keeping each q. A backend failure turns drafting off
// for the request (it then decodes plainly).
const std::vector<int32_t>& spec_draft(SpecState& s, Backend& backend, int slot, int32_t next, int64_t room,
                                       const Sampler& sampler);

// The draft distribution of one row of head logits: softmax at the request's temperature over the sampler's real
// vocabulary (greedy requests: a point mass on the argmax, lowest id on ties).
std::vector<double> draft_distribution(const float* logits, int32_t n_real, float temperature);

// The rejection rule for one draft (sampled requests): p, q over the same ids; returns the token to emit, and
// accepted = whether it is the draft. u_accept, u_residual: uniforms in [0, 1).
int32_t rejection_pick(const std::vector<double>& p, const std::vector<double>& q, int32_t draft, double u_accept,
                       double u_residual, bool& accepted);

// A sampled request's token at verify row `row`, whose proposal is draft `d` (drawn from s.q[row]): the target's
// distribution at that row (the sampler's whole chain, `allowed` included) against q by rejection_pick, with
// uniforms from s.rng. Throws like Sampler::sample when no token can be sampled.
int32_t spec_rejection_sample(SpecState& s, Sampler& sampler, const float* logits, int32_t n_rows,
                              const std::vector<bool>* allowed, int64_t row, int32_t d);

// One walked verify step: the tokens to hand out in order, how many drafts stay in the state (the tokens after
// the next one that the rollback keeps), and a failure (a sampling error at `tokens.size()`).
struct VerifyWalk {
  std::vector<int32_t> tokens;
  int64_t kept_drafts = 0;
  int64_t accepted = 0;
  bool failed = false;
};
// sample(row, draft): the token of verify row `row` (draft: the proposal for it, -1 for the last row), or -1 when
// sampling failed; ends(token, emitted): the request ends with this token (a stop token, or max_tokens reached
// after `emitted` tokens).
VerifyWalk walk_verify(const std::vector<int32_t>& drafts, const std::function<int32_t(int64_t, int32_t)>& sample,
                       const std::function<bool(int32_t, int64_t)>& ends);

// One greedy speculative step of `slot` outside the engine (qrig bench): drafts min(room, draft_tokens) tokens by
// the head's argmax after `next`, verifies them with `next` in one step, keeps the longest prefix the target's argmax
// (lowest id on ties, ids below n_real) agrees with, rolls back, and returns the tokens generated (the last is the
// new next token). drafted/accepted are added to.
std::vector<int32_t> spec_greedy_step(Backend& backend, int slot, int32_t next, int64_t room, int32_t n_real,
                                      int64_t& drafted, int64_t& accepted);

}  // namespace qrig::runtime
