// Token sampling: turns one row of logits into the next token id (greedy or random), with OpenAI-style
// logit bias and penalties and a llama.cpp-like truncation chain. It runs inside the engine (runtime/engine.h); the CLI and the server reach it through requests.
//
// The computation is a pure function of (logits, parameters, penalty history, one uniform number), exposed
// as Sampler::pick(), so it can later move to the GPU; Sampler::sample() only adds the random draw.
//
// Order of operations for one step (documented contract, tested):
//   1. candidates: ids 0 .. n_real_vocab-1 (padding rows above are never sampled), minus ids the optional
//      allowed-mask excludes, minus ids whose logit is NaN or -inf;
//   2. logit bias (OpenAI semantics: added to the logit; a bias of -100 bans the id outright);
//   3. penalties from the accepted history window (llama.cpp formulas): repetition (logit / r when
//      positive, logit * r otherwise), then logit -= count * frequency + (count > 0) * presence;
//   4. temperature == 0: argmax of the result, lowest id wins ties; otherwise the chain
//      top_k -> typical_p -> top_p -> min_p -> XTC -> temperature, then one draw (llama.cpp's default
//      order; every filter sees the temperature-1 distribution of what is left, temperature only reshapes
//      what survived). top_p keeps the smallest set of most likely ids (ties: lower id first) whose mass
//      reaches top_p. typical_p (locally typical sampling) keeps the ids closest to the distribution's
//      entropy (|-log p - H| smallest first) until their mass exceeds typical_p. XTC, when its own uniform
//      draw is below xtc_probability, removes every id whose probability is >= xtc_threshold except the
//      least likely of them (nothing when fewer than two reach it). min_p is relative to the most likely id
//      left. The draw walks the surviving ids in id order: the first whose cumulative weight exceeds
//      uniform * total. typical_p and XTC run on a sorted candidate list (the top_k, or every candidate
//      when top_k is off), so they cost a sort of the vocabulary without top_k.
// A +inf logit makes the +inf ids the only candidates (uniform among them). No candidate left -> throws.
//
// Sampling from the best candidates only (GPU top-k, runtime/cuda/sampling.h): steps 1-3 and the selection
// of the K best candidates can run where the logits are, so that only K (logit, id) pairs per row and a few
// statistics (TopCandidates) reach the host. Step 1's mask is not part of that path (a masked request
// samples from the full logits). The device applies adjustments() and the penalties of params() with the
// float operations of steps 2-3; top_candidates() is its host reference. When can_pick_from_top(K) and,
// per row, top_suffices() hold, pick_top() returns exactly what pick() returns on the full logits: the
// greedy argmax, or the explicit top_k path (top_p within the k, min_p, the draw in id order), which both
// share one definition. Otherwise (no top_k, +inf logits, no more candidates than top_k, no candidate at
// all) the caller falls back to the full logits.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

namespace qrig::runtime {

struct SamplingParams {
  float temperature = 1.0f;  // 0 => greedy (deterministic argmax); must be >= 0
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // in (0, 1]; 1 = off
  float min_p = 0.0f;        // in [0, 1]; 0 = off; keeps ids with p >= min_p * p_max
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;  // > 0; 1 = off
  // How many of the most recently accepted tokens the penalties look at: -1 = every accepted token
  // (the whole context the caller chose to accept()), 0 = penalties off.
  int32_t penalty_last_n = 64;
  std::optional<uint64_t> seed;  // reproducible draws when set; otherwise seeded from std::random_device
  // (token id, bias) pairs, OpenAI semantics: bias in [-100, 100] is added to the logit; -100 bans.
  // A repeated id accumulates its biases (the ban still wins).
  std::vector<std::pair<int32_t, float>> logit_bias;
  float typical_p = 1.0f;        // in (0, 1]; 1 = off
  float xtc_probability = 0.0f;  // in [0, 1]; 0 = off
  float xtc_threshold = 0.1f;    // in [0, 1]; above 0.5 XTC never removes anything

  // Qwen3.5 model card recommendations ("general" tasks), see QWEN35.md "Tokenizer and chat":
  //   thinking:     temperature 1.0, top_p 0.95, top_k 20, min_p 0, presence_penalty 1.5
  //   non-thinking: temperature 0.7, top_p 0.8,  top_k 20, min_p 0, presence_penalty 1.5
  // QWEN35.md names the presence penalty for thinking only; the model card's table lists 1.5 for the
  // non-thinking "general" row too, so both get it. Repetition penalty stays 1. penalty_last_n is -1 (the
  // whole accepted history, like vLLM's presence penalty over the generated text): accept() only
  // generated tokens to match vLLM, or the prompt too to penalise prompt tokens as well.
  static SamplingParams qwen_defaults(bool thinking);
};

// One id whose logit steps 2-3 change: its summed logit_bias (0 = none, -inf = banned) and its count in
// the penalty window (0 = none; listed only while penalties are active).
struct LogitAdjust {
  int32_t id;
  float bias;
  int32_t count;
};

// The K best candidates of one row after steps 1-3 (without a mask) and the statistics the host needs to
// finish sampling and log-probabilities from them.
struct TopCandidates {
  // (adjusted logit, id), best first: larger logit first, then lower id; min(K, n_cand) entries. A zero
  // logit may be reported as +0 where the host computed -0 (they compare equal and weigh the same).
  std::vector<std::pair<float, int32_t>> top;
  int32_t n_cand = 0;     // ids 0 .. n_real_vocab-1 whose adjusted logit is > -inf (NaN counts as -inf)
  int32_t n_pos_inf = 0;  // ... of which +inf
  float max = -std::numeric_limits<float>::infinity();  // the largest adjusted logit (-inf: no candidate)
  double lse = 0;         // log(sum exp(x)) over the candidates when max is finite, else 0
};

class Sampler {
 public:
  // Throws std::invalid_argument on out-of-range parameters or bias ids outside [0, n_real_vocab).
  Sampler(SamplingParams p, int32_t n_real_vocab);

  // logits: n_rows values (n_rows >= n_real_vocab). allowed: optional mask for constrained decoding, at
  // least n_real_vocab entries, true = may be sampled. Throws std::invalid_argument on bad sizes and
  // std::runtime_error when no id can be sampled (mask allows none, or every allowed logit is NaN/-inf
  // or banned). Draws one uniform number from the sampler's generator unless greedy.
  int32_t sample(const float* logits, int32_t n_rows, const std::vector<bool>* allowed = nullptr);

  // The pure function behind sample(): uniform in [0, 1) replaces the random draw (ignored when greedy);
  // xtc_uniform in [0, 1] is XTC's own draw (sample() draws it after `uniform`, only when XTC is on).
  int32_t pick(const float* logits, int32_t n_rows, double uniform,
               const std::vector<bool>* allowed = nullptr, double xtc_uniform = 1.0) const;

  // The distribution sample() draws the next token from, per id of the real vocabulary (sums to 1; greedy: a point
  // mass on the argmax): the same steps 1-4 with the draw left out. Draws XTC's own uniform when XTC is on (so the
  // distribution is the one for that draw). Speculative decoding's rejection rule needs it (runtime/speculative.h).
  std::vector<double> distribution(const float* logits, int32_t n_rows, const std::vector<bool>* allowed = nullptr);

  // Records an accepted token for the penalties (a generated token, or a prompt token if the caller wants
  // prompt tokens penalised). Throws std::invalid_argument for ids outside [0, n_real_vocab).
  void accept(int32_t id);
  // Forgets the penalty history (the random generator keeps its state).
  void clear_history();
  // Ids that cannot be sampled until set again (replaces the previous set; ids outside the vocabulary throw).
  // The engine's min_tokens suppresses end-of-generation ids this way. A ban of step 2, also listed by
  // adjustments(), so device candidate selection applies it too.
  void set_suppressed(std::vector<int32_t> ids);
  const std::vector<int32_t>& suppressed() const { return suppressed_; }

  // Log-probabilities for OpenAI `logprobs`: log-softmax of the logits after steps 1-3 above (mask, bias,
  // penalties) and before truncation and temperature, i.e. the distribution the truncation chain starts
  // from. top_logprobs returns the n most likely ids, most likely first (lowest id first on ties); fewer
  // if fewer candidates exist. logprob() of an id that cannot be sampled is -inf.
  struct TopLogprob {
    int32_t id;
    float logprob;
  };
  std::vector<TopLogprob> top_logprobs(const float* logits, int32_t n_rows, int32_t n,
                                       const std::vector<bool>* allowed = nullptr) const;
  float logprob(const float* logits, int32_t n_rows, int32_t id,
                const std::vector<bool>* allowed = nullptr) const;

  const SamplingParams& params() const { return params_; }
  int32_t n_real_vocab() const { return n_real_vocab_; }

  // --- Sampling from the best candidates (see the top of this file) ---
  // Whether step 3's penalties change anything (repetition != 1, presence or frequency != 0).
  bool penalties_active() const;
  // The ids steps 2-3 change, sorted by id, each once: the union of the logit_bias ids, the suppressed ids
  // (bias -inf) and (while penalties_active()) the ids of the penalty window. The device applies, per listed id, in this order:
  // bias (-inf bans, else x + bias), then if count > 0 and x != -inf: repetition (x > 0 ? x / r : x * r)
  // if r != 1, then x - (float(count) * frequency + presence), each operation rounded to float (no fused
  // multiply-add), NaN -> -inf; and NaN -> -inf for every logit before that.
  std::vector<LogitAdjust> adjustments() const;
  // Whether a row's K = k_fetched best candidates can decide the draw: greedy (temperature 0, K >= 1), or
  // 0 < top_k <= K. A request that also wants top_logprobs n fetches K = max(top_k, n) (greedy: max(1, n))
  // and reads them with top_logprobs_top(). Masked requests (allowed) never take this path.
  bool can_pick_from_top(int32_t k_fetched) const;
  // Per row, after the fetch: false when the row needs the full logits after all: no candidate, a +inf
  // logit, or (not greedy) no more candidates than top_k (pick() would take its implicit path), or fewer
  // than top_k candidates fetched.
  bool top_suffices(const TopCandidates& c) const;
  // pick() on the full logits, from the row's best candidates (bit-identical when top_suffices(c));
  // throws std::invalid_argument when !top_suffices(c) or uniform is outside [0, 1).
  int32_t pick_top(const TopCandidates& c, double uniform, double xtc_uniform = 1.0) const;
  // sample() from the best candidates: draws the uniform as sample() does (none when greedy).
  int32_t sample_top(const TopCandidates& c);
  // logprob() / top_logprobs() from the candidates: the same log-softmax with c.lse as the normaliser
  // (equal to the full-logits functions up to the float rounding of a normaliser summed in another order,
  // ~1e-6). logprob_top of an id missing from c.top is -inf when c.top holds every candidate and throws
  // std::invalid_argument otherwise (unknown); top_logprobs_top throws when n needs more than was fetched.
  float logprob_top(const TopCandidates& c, int32_t id) const;
  std::vector<TopLogprob> top_logprobs_top(const TopCandidates& c, int32_t n) const;
  // The host reference of the device selection: steps 1-3 (no mask) on logits (n_rows >= n_real_vocab
  // values), then the k best candidates and the statistics.
  TopCandidates top_candidates(const float* logits, int32_t n_rows, int32_t k) const;

 private:
  // Steps 1-3 into out (n_real_vocab values; -inf = not a candidate). Returns n_real_vocab.
  int32_t adjusted_logits(const float* logits, int32_t n_rows, const std::vector<bool>* allowed,
                          std::vector<float>& out) const;
  int32_t pick_impl(const float* logits, int32_t n_rows, double uniform, const std::vector<bool>* allowed,
                    double xtc_uniform, std::vector<double>* dist) const;
  double next_uniform();
  double next_xtc_uniform();  // 1 (no XTC) unless XTC is on

  SamplingParams params_;
  int32_t n_real_vocab_;
  std::unordered_map<int32_t, float> bias_;  // summed biases; -inf = banned
  std::deque<int32_t> history_;              // the penalty window
  std::unordered_map<int32_t, int32_t> counts_;  // occurrences of each id in history_
  std::vector<int32_t> suppressed_;              // sorted, unique
  std::mt19937_64 rng_;
  // Scratch buffers (about 2 MB for a 248k vocabulary) are thread_local in sampler.cpp, shared by all
  // samplers of a thread, so many concurrent sequences do not each hold their own.
};

}  // namespace qrig::runtime
